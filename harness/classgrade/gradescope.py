"""What runs in Gradescope's container, once per submission: the bundle's run_autograder calls it.

    python -m harness.classgrade.gradescope /autograder/source/autograder.json

Gradescope hands the container the student's files (/autograder/submission) and the assignment's
metadata (/autograder/submission_metadata.json), and reads /autograder/results/results.json. This:

1. measures what the container was given: its cgroup's CPU quota and memory limit (not the host's
   cores, which os.cpu_count() counts). Too little for the grade, and results.json says in one line
   which resources staff must select, instead of a grade that fails for want of them;
2. grades the submission as a class of one with `distlab grade-class`, in a process of its own,
   under a deadline short of Gradescope's timeout, with Gradescope's due dates in place of the
   rubric's own (the latest of the assignment's due date, its late due date and any extension);
3. writes results.json last, whatever happened: the grade's own, or one naming what went wrong
   (the deadline, a crash, the container's memory), never nothing. Written after every process of
   the submission has ended, it replaces anything a program wrote there.

Only the standard library is imported at the top, so that a broken environment still ends in a
results.json; run_autograder's shell trap covers an interpreter that cannot start at all.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.files import write_json
from labs.common.host import CGROUP_ROOT, PROC_SELF_CGROUP, own_memory_account, own_memory_limit, usable_cores

STUDENT = "student"  # the class of one's only id
DEADLINE_MARGIN_S = 45.0  # kept from Gradescope's timeout: stopping the grade and writing results.json
STOP_GRACE_S = 30.0  # grade-class stops its run and its processes on SIGTERM within this (grading_loop.py)
LOG_TAIL_BYTES = 4000  # of the grade's own output, in a fallback's extra_data (staff only)
CGROUP, PROC_CGROUP = CGROUP_ROOT, PROC_SELF_CGROUP  # where the container's own groups are read (a test's folder)


# ------------------------------------------------------------------- what the container was given

def _read(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        return path.read_text().strip()
    return None


def container_cpus() -> float:
    """CPUs this container may use, fractions kept (Gradescope's default is half a CPU): its cgroup's
    CPU quota within the CPUs it may run on, as labs/common/host.usable_cores finds them."""
    cores = usable_cores(CGROUP, PROC_CGROUP)
    cpus = float(cores.affinity or cores.host)
    return min(cpus, cores.quota) if cores.quota is not None else cpus


def container_memory() -> int | None:
    """Bytes of memory this container may use (its cgroup's limit), or the machine's own where no limit is set."""
    limit = own_memory_limit(CGROUP, PROC_CGROUP)
    if limit is not None:
        return limit
    total = next((line for line in (_read(Path("/proc/meminfo")) or "").splitlines() if line.startswith("MemTotal")),
                 None)
    return int(total.split()[1]) * 1024 if total else None


def memory_account() -> dict[str, Any]:
    """The container's peak memory and whether its limit killed a process (its cgroup's counters)."""
    return own_memory_account(CGROUP, PROC_CGROUP)


def gib(value: float) -> str:
    return f"{value / (1 << 30):.2g} GB"


def short_of(needs: dict[str, Any], cpus: float, memory: int | None) -> str | None:
    """One line for staff when the container was given less than the grade needs (the smallest box it
    works in), else None. It names the CPUs that have its speed judged too."""
    need_cpus, need_memory = needs.get("cpus", 1), needs.get("memory_bytes", 0)
    if cpus + 1e-6 >= need_cpus and (memory is None or memory >= need_memory):
        return None
    speed = needs.get("speed_cpus")
    return (f"This autograder needs {gib(need_memory)} of memory and {need_cpus:g} CPU(s) and was given "
            f"{gib(memory) if memory else 'unknown memory'} and {cpus:g} CPU(s): in the assignment's autograder "
            f"settings, select at least {gib(need_memory)} of memory and {need_cpus:g} CPU(s)"
            + (f" ({speed:g} CPUs for its speed to be judged)." if speed and speed > need_cpus else "."))


# ------------------------------------------------------------------------------ due dates, sandbox

def _when(text: Any) -> dt.datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)


def platform_due(metadata: dict[str, Any]) -> dt.datetime | None:
    """The last moment this submission's after_due_date items must stay hidden: the latest of the
    assignment's due date and late due date and each submitter's own (an extension)."""
    dates = []
    for assignment in [metadata.get("assignment") or {}, *((user or {}).get("assignment") or {}
                                                           for user in metadata.get("users") or [])]:
        if isinstance(assignment, dict):
            dates += [_when(assignment.get("due_date")), _when(assignment.get("late_due_date"))]
    found = [d for d in dates if d is not None]
    return max(found) if found else None


def sandbox_mode() -> str:
    """The isolation this container allows the grade: "bwrap" where bubblewrap may make namespaces,
    else "uid" (grade-class --sandbox uid: a uid of its own, its limits, the grader's files private)
    where it runs as root and a job's uid can run this Python, else "none" (--no-sandbox). Every page
    and results.json says which (extra_data.distlab.sandbox)."""
    from harness.classgrade.sandbox import enter

    if os.geteuid() != 0:  # grade-class gives each job a uid and a cgroup of its own: root
        return "none"
    if enter.refusal("bwrap") is None:
        return "bwrap"
    return "uid" if enter.refusal("uid") is None else "none"


SANDBOX_FLAGS = {"bwrap": ["--sandbox", "bwrap"], "uid": ["--sandbox", "uid"], "none": ["--no-sandbox"]}


def make_private(source: Path, results: Path) -> None:
    """uid mode, Gradescope's advice: the bundle's source and the results closed to other users
    (chmod o=), but for what a job's uid must read (the harness, the labs, the environment) and the
    folders on the way to them (o+x: passed through, never listed)."""
    from harness.classgrade.sandbox import private

    for top in (source, results):
        private.close_to_others(top)  # by descriptors: no path too long, no link followed
    checkout = source / "distlab"
    if source.is_dir():
        os.chmod(source, os.stat(source).st_mode | 0o001)
    if checkout.is_dir():  # listed too: Python finds `harness` in a folder on sys.path by listing it
        os.chmod(checkout, os.stat(checkout).st_mode | 0o005)
    for part in ("harness", "labs", ".venv", "venv"):
        private.open_to_others(checkout / part)


# ------------------------------------------------------------------------------------ the results

def not_graded(config: dict[str, Any], status: str, what: str, **extra: Any) -> dict[str, Any]:
    """A results.json for a submission that was not graded, saying why in the student's words (the
    staff's detail in extra_data, which only staff see). Score 0, as Gradescope needs a number, but
    with its own status, never a bare 0."""
    return {"score": 0.0, "output": what, "output_format": "text", "visibility": "visible",
            "stdout_visibility": "hidden",
            "tests": [{"name": "gradable", "score": 0.0, "max_score": config.get("max_score", 0.0),
                       "status": "failed", "output": what, "tags": [status], "visibility": "visible"}],
            "extra_data": {"distlab": {"status": status, "reason": what, **extra}}}


def _rubric_with_due(source: Path, due: dt.datetime | None, out: Path) -> Path:
    """The rubric with Gradescope's due date in place of its own (its after_due_date items follow it)."""
    if due is None:
        return source
    import tomli_w

    from harness.verdict.profiles import tomllib

    data = tomllib.loads(source.read_text())
    data["due"] = due.astimezone(dt.timezone.utc)
    out.write_text(tomli_w.dumps(data))
    return out


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the grade's session (it stops its run and accounts for it), SIGKILL after the grace."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def grade(config: dict[str, Any], root: Path, started: float) -> dict[str, Any]:
    source, work = root / "source", root / "work"
    cpus, memory = container_cpus(), container_memory()
    given = {"cpus": cpus, "memory_bytes": memory}
    short = short_of(config.get("needs") or {}, cpus, memory)
    if short:
        print(short, flush=True)
        return not_graded(config, "resources", short, resources=given, needs=config.get("needs"))
    metadata: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        metadata = json.loads((root / "submission_metadata.json").read_text())
    due = platform_due(metadata if isinstance(metadata, dict) else {})
    shutil.rmtree(work, ignore_errors=True)
    class_root = work / "class"
    shutil.copytree(root / "submission", class_root / STUDENT, symlinks=True)
    rubric = _rubric_with_due(source / config["rubric"], due, work / "rubric.toml")
    mode = sandbox_mode()
    if mode == "uid":
        make_private(source, root / "results")
        os.chmod(work, os.stat(work).st_mode | 0o001)  # the class's results below it: grade-class closes them
    profile = str(source / config["profile"]) if (source / config["profile"]).is_file() else config["profile"]
    argv = [sys.executable, "-m", "harness.commands.cli", "grade-class", str(class_root), "--lab", config["lab"],
            "--profile", profile, "--rubric", str(rubric), "--results", str(work / "results"), "--jobs", "1",
            "--lessons", config["lessons"], *SANDBOX_FLAGS[mode]]
    if config.get("world_sizes"):
        argv += ["--world-sizes", ",".join(map(str, config["world_sizes"]))]
    deadline = float(config.get("timeout_s", 600)) - DEADLINE_MARGIN_S - (time.monotonic() - started)
    log = work / "grade-class.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   cwd=source / "distlab", start_new_session=True)
        try:
            code: int | None = process.wait(timeout=max(1.0, deadline))
        except subprocess.TimeoutExpired:
            code = None
            _stop(process)
        except BaseException:  # run_autograder itself told to stop: the grade first
            _stop(process)
            raise
    tail = log.read_bytes()[-LOG_TAIL_BYTES:].decode(errors="replace")
    print(tail, flush=True)  # Gradescope keeps run_autograder's output for staff
    account = {**memory_account(), "resources": given, "sandbox": mode,
               "due": due.isoformat() if due else None}
    produced = work / "results" / "class" / "class" / "gradescope" / STUDENT / "results.json"
    results = None
    with contextlib.suppress(OSError, ValueError):
        results = json.loads(produced.read_text())
    if code is None:
        return not_graded(config, "error", f"The autograder stopped the grade at its deadline ({deadline:.0f} s, "
                          f"Gradescope's timeout less {DEADLINE_MARGIN_S:g} s) before it finished: this is not a "
                          "grade of your program.", **account, log=tail)
    if account["oom_kills"] and not isinstance(results, dict):
        return not_graded(config, "error", f"The grade ran out of the container's memory ({gib(memory or 0)}); "
                          "this is not a grade of your program.", **account, log=tail)
    if code != 0 or not isinstance(results, dict) or "score" not in results:
        return not_graded(config, "error", f"The autograder failed (grade-class exit code {code}) before it "
                          "graded: this is not a grade of your program.", **account, log=tail)
    results.setdefault("extra_data", {}).setdefault("distlab", {}).update(account)
    return results


def write_results(path: Path, results: dict[str, Any]) -> None:
    """By rename, over whatever is there: a submission's program may have left a file or a link there."""
    write_json(path, results)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def main(argv: list[str]) -> int:
    started = time.monotonic()
    # Private by default: everything the runner writes (the rubric with its hidden items, the grade's
    # log, the results) is root's alone; a job's uid reads only what is opened to it (make_private).
    os.umask(0o077)
    config_path = Path(argv[0])
    config: dict[str, Any] = {}
    root = config_path.resolve().parent.parent  # <root>/source/autograder.json
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        config = json.loads(config_path.read_text())
        results = grade(config, root, started)
    except BaseException as error:  # noqa: BLE001 - anything at all still ends in a results.json
        results = not_graded(config, "error", f"The autograder failed ({type(error).__name__}: {error}) before "
                             "it graded: this is not a grade of your program.")
    results["execution_time"] = round(time.monotonic() - started)
    write_results(root / "results" / "results.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
