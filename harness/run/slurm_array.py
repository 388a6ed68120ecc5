"""A Slurm job array, submitted, waited for and accounted: the one module that runs sbatch, sacct and scancel.

Both `--slurm` paths use it: `distlab grade --slurm` (one task per cell, grading/slurm.py) and
`distlab grade-class --slurm` (one task per submission, classgrade/cluster.py). Each writes its own
script body (what a task runs); the array's header, its submission with `sbatch --wait`, its
cancellation when the grader is stopped and each task's row in sacct live here, once, so that the
two cannot come to behave differently again (a stopped `grade --slurm` once left its array queued).

Every array is named after its folder (`array_name`): a stop cancels it by that name, because
`sbatch --wait`, its output a pipe, may not have shown the job's id before the stop comes. Each task
writes its own job id as `<task>-<index>.jobid` first: a cluster with a job completion log and no
slurmdbd knows a task only by that id.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import shlex
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from shutil import which
from typing import Any

from harness.console import console
from harness.run.errors import RunStopped
from harness.usage import UsageError

SACCT_FIELDS = ("JobID", "State", "ExitCode", "NodeList", "Elapsed")


def check_submit_host(slurm: bool, sbatch_args: list[str]) -> None:
    """UsageError unless this host can submit and account an array (or, without --slurm, no sbatch
    option is given that nothing would use): before anything is planned or written."""
    if not slurm:
        if sbatch_args:
            raise UsageError(f"--sbatch-arg {sbatch_args[0]!r} is given without --slurm; add --slurm or drop it")
        return
    if not all(map(which, ("sbatch", "sacct"))):
        raise UsageError("--slurm needs Slurm's sbatch and sacct on PATH (run it on a login node of the cluster)")
    for arg in sbatch_args:
        if not arg.startswith("-") or any(c in arg for c in "\n\r\0"):
            raise UsageError(f"--sbatch-arg {arg!r} is not one sbatch option; give it as --sbatch-arg=--partition=cpu")


def array_name(kind: str, folder: Path) -> str:
    """The array's job name, unique to its folder: what a stop cancels it by."""
    return f"distlab-{kind}-" + hashlib.sha256(str(folder).encode()).hexdigest()[:12]


def header(name: str, folder: Path, task: str, tasks: int, cpus: int, time_limit_s: float,
           sbatch_args: list[str], at_once: int | None = None, gpus: int = 0) -> str:
    """The array's #SBATCH directives (every one before the first command: sbatch reads none after it),
    then the line each task runs first: its own job id written to `<folder>/<task>-<index>.jobid`."""
    minutes = max(1, int(time_limit_s // 60) + 1)
    where = shlex.quote(str(folder))
    throttle = f"%{at_once}" if at_once else ""
    gres = f"#SBATCH --gres=gpu:{gpus}\n" if gpus else ""
    extra = "".join(f"#SBATCH {shlex.quote(arg)}\n" for arg in sbatch_args)
    return f"""#SBATCH --job-name={name}
#SBATCH --array=0-{tasks - 1}{throttle}
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task={cpus}
{gres}#SBATCH --time={minutes}
#SBATCH --output={where}/{task}-%a.out
{extra}set -euo pipefail
# The task's own job id, for sacct: a completion log (jobcomp, no slurmdbd) knows tasks only by it.
echo "$SLURM_JOB_ID" > {where}/{task}-"$SLURM_ARRAY_TASK_ID".jobid
"""


@contextlib.contextmanager
def _stops_raised() -> Iterator[None]:
    """SIGTERM and SIGHUP raised as RunStopped (a KeyboardInterrupt, as Ctrl-C already is) while the
    array is waited for: whichever way the grader is stopped, the array is cancelled. Main thread only
    (the only one Python delivers signals to)."""
    previous: dict[signal.Signals, Any] = {}

    def stop(signum: int, _frame: object) -> None:
        raise RunStopped(signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def submit(script: Path, name: str, chdir: Path | None = None) -> tuple[str, int]:
    """`sbatch --wait` the array: its job id and sbatch's exit once every task has ended. A stop
    (Ctrl-C, SIGTERM, SIGHUP) cancels the array, then is raised again (a KeyboardInterrupt)."""
    where = [f"--chdir={chdir}"] if chdir else []
    sbatch: subprocess.Popen[str] | None = None
    with _stops_raised():  # from before sbatch starts: a stop at any moment finds the array to cancel
        try:
            sbatch = subprocess.Popen(["sbatch", "--parsable", "--wait", *where, str(script)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
            out, err = sbatch.communicate()
        except KeyboardInterrupt:
            cancel(name)
            if sbatch is not None:  # None: stopped before sbatch had started
                sbatch.kill()
                sbatch.wait()
            raise
    job_id = out.strip().split(";")[0]
    if not job_id:
        raise UsageError(f"sbatch refused the array job: {err.strip() or sbatch.returncode} (the array: {script})")
    (script.parent / "array.jobid").write_text(f"{job_id}\n")
    return job_id, sbatch.returncode


def cancel(name: str) -> None:
    """Every task of the array named `name` (this user's), cancelled."""
    subprocess.run(["scancel", f"--name={name}", f"--user={pwd.getpwuid(os.getuid()).pw_name}"],
                   capture_output=True, timeout=60)
    console.print(f"cancelled the Slurm job array {name}", markup=False)


def sacct(job_id: str, env: dict[str, str] | None = None) -> list[dict[str, str]]:
    """The job's accounting rows (its steps and array tasks too): from slurmdbd where a cluster
    has one, else from the job completion log (jobcomp/filetxt, `sacct -c`)."""
    rows: list[dict[str, str]] = []
    for completion in ([], ["-c"]):
        done = subprocess.run(["sacct", *completion, "-j", job_id, "-n", "-P", "-o", ",".join(SACCT_FIELDS)],
                              capture_output=True, text=True, env=env, timeout=60)
        if done.returncode == 0 and done.stdout.strip():
            rows = [dict(zip(SACCT_FIELDS, line.split("|"), strict=False)) for line in done.stdout.splitlines()]
            break
    return rows


def task_state(folder: Path, job_id: str, index: int, task: str) -> dict[str, str]:
    """Array task `index`'s row in sacct: as JOB_INDEX where slurmdbd keeps accounting, else by the
    task's own job id (what the task wrote first, as `<task>-<index>.jobid`); {} where neither is known."""
    jobid_file = folder / f"{task}-{index}.jobid"
    own = jobid_file.read_text().strip() if jobid_file.exists() else ""
    for wanted in filter(None, (f"{job_id}_{index}", own)):
        for row in sacct(wanted):
            if row.get("JobID") == wanted:
                return row
    return {}
