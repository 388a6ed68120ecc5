"""One submission graded, in a process of its own: `python -m harness.classgrade.job JOB.json`.

Graded as `distlab grade --program LAB=PATH` grades one (grading.plan_grade, grading.execute, the
same verdicts: grading.judge), with each run's launcher inside the job's sandbox (sandbox/). Whatever the grade
observed is stored in the job's folder before anything is concluded from it:

    <job>/job.json           what to grade: the submission, the lab, the profile, the limits, the slot
    <job>/sandbox.json       the sandbox it ran in (its uid, binds, limits)
    <job>/runs/              every run directory (the course lab's beside the program's)
    <job>/observations.json  every run as the grader saw it (Samples), the sandbox's account
    <job>/weights.json       the weights and checkpoints the runs wrote, removed once observations.json
                             was written (their paths, sizes, sha256: grading/disk.py), unless job.json's "keep"
    <job>/stdout.log         the job's own output

observations.json is the job's completion mark: a job without it is graded again on resume. The
verdicts are recomputed from it (`verdicts_for`), so a regrade after the rubric or the profile
changed trains nothing. A process of its own per job: the runner's signal handling (Ctrl-C,
SIGTERM stop the run in flight and are raised) belongs to a main thread, and the progress display
to one console.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import files
from harness.catalog import REPO
from harness.classgrade import submissions
from harness.classgrade.sandbox import enter, private
from harness.classgrade.sandbox.cgroups import Cgroup, job_cgroup_name
from harness.classgrade.sandbox.limits import Limits, size_text
from harness.classgrade.sandbox.monitor import Monitor, denials
from harness.classgrade.sandbox.spec import REPOSITORY_PARTS, Spec, base_read_only
from harness.classgrade.sandbox.uid import claim_uid, end_processes_of, remove_scratch
from harness.console import printable
from harness.grading import disk, stored, timings
from harness.grading import samples as run_samples
from harness.grading.execute import execute
from harness.grading.plan import Cell, GradePlan, plan_grade
from harness.on_ranks.observer.distlab_observer.fileformat import RANK_FILES
from harness.run.run_dir import OBSERVE_DIR
from harness.verdict import profiles
from harness.verdict.verdicts import Sample
from labs.common.host import fingerprint

OBSERVATIONS = "observations.json"
OUTPUT_READ_BYTES = 256 << 10  # of each log, read for the sandbox's refusals


def plan_for(job: dict[str, Any], sandbox_prefix: list[str] | None = None, *, check_runs: bool = True
             ) -> GradePlan:
    """The grade this job stands for: the submission's program in the lab's rows, one run of each cell
    beside the course lab's, every run in the job's sandbox. `check_runs=False`: for judging the
    stored runs (a regrade), nothing of this host checked."""
    # Running: this process sees the job's own GPUs only (CUDA_VISIBLE_DEVICES). Judging: the job's count.
    job_gpus = len(job["gpus"]) if job.get("gpus") is not None else None
    gpus = fingerprint()["gpus"] if check_runs else job_gpus
    # The profile by the path the class resolved it to (classroom.py): no host is asked which fits.
    profile = profiles.resolve(job["profile"], {} if job["profile"] else fingerprint())
    return plan_grade(profile, labs=[job["lab"]], world_sizes=job.get("world_sizes"), repeats=1,
                      programs={job["lab"]: Path(job["program"])}, results_root=Path(job["folder"]) / "runs",
                      timeout_s=job["limits"].get("wall_s"), gpus=gpus, sandbox=sandbox_prefix or [],
                      check_runs=check_runs)


def _program_runs(done: dict[Cell, list[Sample]]) -> list[Path]:
    return [Path(s.run_dir) for samples in done.values() for s in samples]


def read_log(path: Path) -> str:
    """The end of a log a run left (its program's output): bounded, never through a link."""
    return files.read_text(path, OUTPUT_READ_BYTES, tail=True)


# An error a program printed about a path: Python's own wording ("[Errno 2] No such file or directory: '/x'").
PATH_ERROR = re.compile(r"(PermissionError|FileNotFoundError|OSError|IsADirectoryError)[^\n]*?: '(/[^'\n]+)'")


def refusals(run_dirs: list[Path], hidden: list[str], own: list[str]) -> list[str]:
    """The sandbox's refusals the program's runs printed (sandbox/monitor.DENIALS), by name; and the paths
    it was refused that are the grader's or another submission's, each named once."""
    texts = [read_log(log) for run_dir in run_dirs for log in [run_dir / "launcher.log", *run_dir.glob("rank.*.log")]]
    found = denials(texts)

    def under(path: str, roots: list[str]) -> bool:
        return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)

    shown = [str(REPO / part) for part in REPOSITORY_PARTS]  # the checkout's parts in the sandbox
    for text in texts:
        for kind, path in PATH_ERROR.findall(text):
            path = printable(path)
            if under(path, own + [str(d) for d in run_dirs]):
                continue
            if under(path, hidden):
                named = f"tried to reach {path}: another submission's or the grader's, not in its sandbox"
            elif under(path, shown) and kind != "FileNotFoundError":
                named = f"tried to change {path}: the grader's own files, read-only in its sandbox"
            elif under(path, [str(REPO)]):
                named = (f"tried to reach {path}: of the grader's checkout only the harness and the labs are in "
                         "its sandbox")
            else:
                continue
            if named not in found:
                found.append(named)
    return found


def forged_observations(run_dirs: list[Path], program_pids: set[int]) -> list[str]:
    """Observation files that no process running the program wrote: each names the pid of the rank
    that wrote it (as the sandbox numbered it), and the monitor saw which pids ran the program."""
    found = []
    for run_dir in run_dirs:
        written = sorted((run_dir / OBSERVE_DIR).glob(RANK_FILES))
        if not written and _run_ok(run_dir):
            found.append(f"{run_dir.name}: the run ended well, yet no rank left observations (the observer was "
                         "switched off, or the program exited past Python's exit handlers)")
        for path in written:
            try:
                pid = files.read_json(path, 64 << 20).get("pid")
            except (OSError, ValueError, AttributeError):
                found.append(f"{run_dir.name}/{OBSERVE_DIR}/{path.name} is not the observer's (unreadable)")
                continue
            if pid not in program_pids:
                found.append(f"{run_dir.name}/{OBSERVE_DIR}/{path.name} names pid {pid}, which no process running "
                             f"the program had (they were {', '.join(map(str, sorted(program_pids)))})")
    return found


def entries_left(done: dict[Cell, list[Sample]]) -> tuple[list[str], list[str]]:
    """What the program's runs left in their folders that is no regular file or folder (each sample's
    `untrusted`, grading/samples.py): those where the grader reads (tampering), and the others."""
    planted: list[str] = []
    left: list[str] = []
    for sample in (s for runs in done.values() for s in runs):
        where = Path(sample.run_dir).name
        tampering = set(run_samples.tampers_with_the_grader(sample.untrusted))
        for entry in sample.untrusted:
            (planted if entry in tampering else left).append(f"{where}/{entry} (never followed or opened)")
    return planted, left


def _run_ok(run_dir: Path) -> bool:
    try:
        return files.read_json(run_dir / "run.json", 1 << 20).get("status") == "ok"
    except (OSError, ValueError, AttributeError):
        return False


def own_copy(job: dict[str, Any], target: Path, uid: int) -> dict[str, str]:
    """uid mode: the submission copied where only the job's uid (and the grader) may read it, owned by
    it, files and folders only (links are not copied), each file bounded as the submissions folder
    reads them; the job's submission and program there."""
    source = Path(job["submission"])

    def made(path: Path, mode: int) -> None:
        os.chown(path, uid, uid)
        os.chmod(path, mode)  # explicitly: the grader's umask in uid mode is 077

    target.mkdir()
    made(target, 0o700)
    if source.is_dir():
        for name, info, fd, base in files.walk(source, submissions.MAX_DEPTH):
            destination = target / os.fsdecode(name)
            if stat.S_ISDIR(info.st_mode):
                destination.mkdir()
                made(destination, 0o700)
            elif stat.S_ISREG(info.st_mode):
                destination.write_bytes(files.read_regular_file(base, submissions.MAX_FILE_BYTES, dir_fd=fd))
                made(destination, 0o600)
        program = target / Path(job["program"]).relative_to(source)
    else:
        program = target / source.name
        program.write_bytes(files.read_regular_file(source, submissions.MAX_PROGRAM_BYTES))
        made(program, 0o600)
    return {"submission": str(target), "program": str(program)}


PROGRESS_FD = "--progress-fd"  # after JOB.json: the pipe the grader follows this job's runs on (pool.py)
EVENT_TEXT = 200  # characters of each text of an event: a line stays under PIPE_BUF, written whole or not at all


def progress_writer(fd: int) -> Callable[[dict[str, Any]], None]:
    """Each run's start and end, a JSON line on the grader's pipe. Never a stop for the grade: the pipe
    is not waited on (a line it has no room for is dropped) and a grader gone is ignored. Not passed
    on: no run, launcher or program of the job inherits it."""
    os.set_inheritable(fd, False)
    os.set_blocking(fd, False)

    def tell(event: dict[str, Any]) -> None:
        line = json.dumps({key: printable(value)[:EVENT_TEXT] if isinstance(value, str) else value
                           for key, value in event.items()}, ensure_ascii=False)
        with contextlib.suppress(OSError):  # full (BlockingIOError), or the grader gone (BrokenPipeError)
            os.write(fd, (line + "\n").encode())

    return tell


def run_job(job_path: Path, progress_fd: int | None = None) -> int:
    began = time.monotonic()  # where the job's time went: observations.json's "timings" (grading/timings.py)
    job = json.loads(job_path.read_text())
    folder = Path(job["folder"])
    limits = Limits(**job["limits"])
    cgroup = monitor = None
    prefix: list[str] = []
    uid = claim = None
    scratch: list[tuple[str, int]] = []  # uid mode: what it left in /tmp, /var/tmp, /dev/shm (removed)
    mode = job.get("sandbox_mode", "bwrap" if job["sandboxed"] else "none")
    if job["sandboxed"]:
        uid, claim = claim_uid()  # held until this process ends: the uid is this job's alone
        if mode == "uid":  # the submissions folder is closed to the job's uid: it reads a copy of its own
            job = {**job, **own_copy(job, folder / "submission", uid)}
        cgroup = Cgroup.create(job_cgroup_name(job), limits)
        spec = Spec(uid=uid, limits=dataclasses.asdict(limits),
                    read_only=base_read_only() + job.get("data", []), hidden=job["hidden"],
                    own=[job["submission"]], cgroup_procs=cgroup.procs_files() if cgroup else [],
                    gpus=job.get("gpus"), mode=mode, job_folder=str(folder))
        prefix = enter.prefix(spec.write(folder / "sandbox.json"))
    steps = {"sandbox_setup": time.monotonic() - began}
    grade_plan = plan_for(job, prefix)
    steps["plan"] = time.monotonic() - began - steps["sandbox_setup"]
    done: dict[Cell, list[Sample]] = {}
    references: dict[Cell, list[Sample]] = {}
    if job["sandboxed"]:
        monitor = Monitor(cgroup, folder / "runs", limits, job["program"], scratch_uid=uid if mode == "uid" else None)
        began_monitor = time.monotonic()
        monitor.start()
        steps["sandbox_setup"] += time.monotonic() - began_monitor
    started = time.monotonic()
    try:
        execute(grade_plan, done, references, progress_writer(progress_fd) if progress_fd is not None else None)
    finally:
        executed = time.monotonic()
        if monitor is not None:
            monitor.stop()
        if cgroup is not None:
            peak = cgroup.peak_memory()
            cgroup.remove()
        if uid is not None:
            end_processes_of(uid)  # nothing of it outlives the job
            if mode == "uid":  # nothing of it reaches the next job of the uid either
                scratch = remove_scratch(uid)
                private.hand_back(folder, uid)
                shutil.rmtree(folder / "submission", ignore_errors=True)
            if claim is not None:  # claimed with the uid
                os.close(claim)
    steps["sandbox_teardown"] = time.monotonic() - executed
    program_runs = _program_runs(done)
    if monitor is not None and any("timed out after" in (s.reason or "") for runs in done.values()
                                   for s in runs):
        monitor.breaches.append(limits.breach("wall"))  # the runner's watchdog ended it
    planted, left = entries_left(done)
    account = {"sandboxed": job["sandboxed"], "mode": mode, "cgroup": cgroup is not None,
               "breaches": monitor.breaches if monitor else [],
               "refusals": refusals(program_runs, job["hidden"], [job["submission"]]),
               "forged": planted + (forged_observations(program_runs, monitor.program_pids)
                                    if monitor is not None and cgroup is not None else []),
               "left": left,
               "outside": [f"{printable(path)} ({size_text(size)}, counted as its output, removed)"
                           for path, size in scratch],
               "peak_memory_bytes": peak if cgroup is not None else None,
               "peak_output_bytes": monitor.peak_bytes if monitor else None}
    files.write_json(folder / OBSERVATIONS, {
        "id": job["id"], "wall_seconds": time.monotonic() - started, "sandbox": account,
        "done": stored.runs_to_json(done), "references": stored.runs_to_json(references),
        # From this process's start of the job (its interpreter's start before it is not counted); judged later,
        # in the grader's process (outcome.py): no judging here.
        "timings": timings.grade_timings(timings.run_rows(done, references), steps, time.monotonic() - began,
                                         sandbox=f"sandbox mode {mode}")})
    if not job.get("keep"):  # what a regrade judges is stored: the weights were read for it, and are no more
        disk.release_weights([Path(s.run_dir) for runs in (*done.values(), *references.values()) for s in runs],
                             folder)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("COLUMNS", "120")
    fd = int(sys.argv[3]) if sys.argv[2:3] == [PROGRESS_FD] else None
    sys.exit(run_job(Path(sys.argv[1]), fd))
