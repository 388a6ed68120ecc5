"""The program that enters the sandbox: `python -I enter.py SPEC RUN_DIR -- CMD...`.

It runs as the grader, joins the cgroup, hands the run directory to the job's uid and execs bwrap
(or, in uid mode, the job's command as its uid). Nothing of the submission has started yet.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run by path, isolated (-I): the harness this file is part of, first
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from harness.classgrade.sandbox import bubblewrap, uid  # noqa: E402
from harness.classgrade.sandbox.seccomp import load_seccomp, seccomp_fd  # noqa: E402
from harness.classgrade.sandbox.spec import Spec  # noqa: E402

HERE = Path(__file__).resolve()


def refusal(mode: str = "bwrap") -> str | None:
    """None where grade-class can sandbox its jobs here in `mode`, else the one line that says why not
    and what to do."""
    if mode == "uid":
        for needed in ("setpriv", "prlimit"):
            if shutil.which(needed) is None:
                return f"{needed} (util-linux) is not installed; install util-linux, or pass --no-sandbox"
    else:
        problem = bubblewrap.available()
        if problem:
            return problem
    if os.geteuid() != 0:
        return ("the sandbox gives each job a uid and a cgroup of its own, which needs root; run grade-class as "
                "root (a course's grading host or container), or pass --no-sandbox")
    if mode == "uid":
        return uid.uid_refusal()
    probe = subprocess.run([bubblewrap.bwrap_path() or "bwrap", "--unshare-net", "--unshare-pid", "--ro-bind", "/", "/",
                            "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return (f"bubblewrap cannot make namespaces here ({probe.stderr.strip()[:200]}); allow them (a privileged "
                "container), grade with --sandbox uid (a uid of its own, without namespaces), or pass --no-sandbox")
    return None



def prefix(spec_path: Path, python: str = sys.executable) -> list[str]:
    """The sandbox as a RunRequest.sandbox prefix: this file, run by the grader's interpreter, isolated."""
    from harness.run.run_dir import RUN_DIR_PLACEHOLDER

    return [python, "-I", str(HERE), str(spec_path), RUN_DIR_PLACEHOLDER, "--"]


def enter(argv: list[str]) -> None:
    """`enter.py SPEC RUN_DIR -- CMD...`: join the cgroup, hand the run directory to the job's uid,
    exec bwrap. Runs as the grader; nothing of the submission has started yet."""
    spec_path, run_dir, separator, *command = argv
    if separator != "--" or not command:
        sys.exit("usage: enter.py SPEC RUN_DIR -- COMMAND...")
    spec = Spec(**json.loads(Path(spec_path).read_text()))
    for procs in spec.cgroup_procs:
        Path(procs).write_text(str(os.getpid()))  # exec keeps the pid: bwrap and all it starts are in it
    if spec.mode == "uid":
        os.makedirs(os.path.join(run_dir, "tmp"), mode=0o700, exist_ok=True)
        uid.passable(run_dir, spec.job_folder)
    for folder in (run_dir, os.path.join(run_dir, "logs"), *([os.path.join(run_dir, "tmp")] if spec.mode == "uid"
                                                              else [])):
        os.chown(folder, spec.uid, spec.uid)  # the launcher's logs and the observer's files are written there
    if spec.mode == "uid":
        argv, env = uid.uid_argv(spec, run_dir, command)
        os.chdir(run_dir)  # as bwrap's --chdir: the program starts in its own folder
        sys.exit(run_to_the_end(spec.uid, argv, env))
    tool = shutil.which("bwrap") or "bwrap"
    os.execv(tool, bubblewrap.bwrap_argv(spec, run_dir, command, tool, seccomp_fd=seccomp_fd()))


def run_to_the_end(job_uid: int, argv: list[str], env: dict[str, str]) -> int:
    """uid mode (no pid namespace ends the job's processes with the launcher): the command in a child,
    under the seccomp filter; this process (the grader's, root) waits for it, then ends every process of
    the job's uid before it exits itself. The run is accounted once this process has exited, so only
    once nothing of the program runs: a process forking a new pid every 50 ms outlived its launcher by
    seconds, alive while the grader accounted the run. Its exit code is the command's (128 + signal)."""
    child = os.fork()
    if child == 0:  # pragma: no cover - the child execs or exits at once
        try:
            for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(number, signal.SIG_DFL)
            load_seccomp()  # what bwrap's --seccomp does, here by prctl
            os.execvpe(argv[0], argv, env)
        finally:
            os._exit(127)

    def forward(number: int, frame: object) -> None:  # the runner's stop, passed on to the launcher
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, number)

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, forward)
    _, status = os.waitpid(child, 0)
    uid.end_processes_of(job_uid)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    enter(sys.argv[1:])
