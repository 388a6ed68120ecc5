"""Up to N submissions graded at once, each a job process of its own (job.py), each on a slot: its
GPUs on a GPU host; each job claims its own sandbox uid."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.catalog import REPO
from harness.classgrade.job import PROGRESS_FD
from harness.classgrade.sandbox.cgroups import Cgroup, job_cgroup_name
from harness.classgrade.sandbox.limits import GIB, Limits, size_text
from harness.classgrade.sandbox.uid import end_processes_if_unclaimed
from harness.grading.plan import GradePlan
from labs.common.host import usable_cores

STOP_GRACE_S = 60.0  # a job told to stop (SIGTERM) ends its run and its processes within this


def default_jobs(grade_plan: GradePlan, gpus: int) -> int:
    ranks = max(ws for _, ws in grade_plan.cells())
    if grade_plan.profile.on_gpus:
        return max(1, gpus // ranks)
    return max(1, usable_cores().count // (ranks * (grade_plan.profile.threads_per_rank or 1)))


def gpus_of(slot: int, grade_plan: GradePlan) -> list[int] | None:
    if not grade_plan.profile.on_gpus:
        return None
    ranks = max(ws for _, ws in grade_plan.cells())
    return list(range(slot * ranks, (slot + 1) * ranks))


# The grader's own side of a job (its process and the evaluator it starts, both outside the sandbox):
# what it may use. Evaluating rank 0's ResNet-18 on the CPU peaked at 1.5 GiB here; the rest reads
# JSON. Past it, or past its deadline, the job is ended and marked, and the class goes on.
GRADER_LIMITS = Limits(memory_bytes=8 * GIB, processes=1024)
EVALUATOR_S = 300.0  # the most one evaluation may take (observe/accuracy.Evaluator's timeout)
DEADLINE_MARGIN_S = 120.0  # planning, the job's start, the sweep at its end


def job_deadline_s(grade_plan: GradePlan) -> float:
    """How long one submission's job may take: every run of its plan (and every reference run) at its
    own timeout, an evaluation after each, a speed row's extra pairs, and a margin."""
    total = DEADLINE_MARGIN_S
    for lab, ws in grade_plan.cells():
        runs = grade_plan.runs(lab)
        total += runs * (grade_plan.request(lab, ws).timeout_s + EVALUATOR_S)
        reference = grade_plan.reference_request(lab, ws)
        if reference is not None:  # and the extra pairs a speed row may take (execute.py), the last at its timeouts
            total += (runs + grade_plan.bracketed(lab)) * reference.timeout_s + grade_plan.profile.speed_budget_s \
                + reference.timeout_s + grade_plan.request(lab, ws).timeout_s + EVALUATOR_S
    return total


@dataclass
class Running:
    process: subprocess.Popen[bytes]
    student: str
    folder: Path
    started: float
    deadline_s: float | None
    cgroup: Cgroup | None  # the grader side's own limits (GRADER_LIMITS), where cgroups are writable
    events: int | None = None  # the read end of the job's progress pipe (Pool(follow=True)); None once closed
    partial: bytes = b""  # the start of an event line not yet whole


@dataclass(frozen=True)
class Ended:
    student: str
    code: int
    reason: str = ""  # why the pool ended it ("" when it ended by itself)


class Pool:
    """Up to `size` jobs at once, each a process in a session of its own; a slot (its GPUs) per
    running job; each job claims its own uid. `command`: what a job runs (its job.json appended).
    `follow`: each job is given a pipe to tell its runs' starts and ends on (job.progress_writer),
    read by `events`."""

    def __init__(self, size: int, sandboxed: bool,
                 command: tuple[str, ...] = (sys.executable, "-m", "harness.classgrade.job"),
                 follow: bool = False) -> None:
        self.size, self.sandboxed, self.command, self.follow = size, sandboxed, command, follow
        self.running: dict[int, Running] = {}
        self._told: list[tuple[str, dict[str, Any]]] = []  # read from jobs that ended, not yet given by `events`

    def free_slot(self) -> int | None:
        return next((slot for slot in range(self.size) if slot not in self.running), None)

    def start(self, slot: int, student: str, job_path: Path, env: dict[str, str],
              deadline_s: float | None = None, cgroup_name: str | None = None) -> None:
        group = Cgroup.create(cgroup_name, GRADER_LIMITS) if cgroup_name and self.sandboxed else None

        def join() -> None:  # in the child, before it runs anything: all it starts is limited with it
            for procs in group.procs_files() if group else []:
                Path(procs).write_text(str(os.getpid()))

        read_end, write_end = os.pipe() if self.follow else (None, None)
        told = [PROGRESS_FD, str(write_end)] if write_end is not None else []
        try:
            with (job_path.parent / "stdout.log").open("wb") as log:
                process = subprocess.Popen([*self.command, str(job_path), *told], stdout=log,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO, env=env,
                                           start_new_session=True, preexec_fn=join if group else None,
                                           pass_fds=() if write_end is None else (write_end,))
        except BaseException:
            for end in (read_end, write_end):
                if end is not None:
                    os.close(end)
            raise
        if write_end is not None:
            os.close(write_end)  # the job's alone: its end (or its death) is the pipe's end of file
        self.running[slot] = Running(process, student, job_path.parent, time.monotonic(), deadline_s, group,
                                     read_end)

    def events(self, timeout_s: float) -> list[tuple[str, dict[str, Any]]]:
        """The runs' events the jobs told since the last look, (student, event) in order, waiting up
        to `timeout_s` for the first: a job that tells something, or ends, wakes the grader at once."""
        told, self._told = self._told, []
        watched = {job.events: job for job in self.running.values() if job.events is not None}
        if told or not watched:
            if not told:
                time.sleep(timeout_s)  # nothing to wait on (no pipes): the pool's own pace
            return told
        ready, _, _ = select.select(list(watched), [], [], timeout_s)
        for fd in ready:
            told += self._read(watched[fd])
        return told

    def _read(self, job: Running) -> list[tuple[str, dict[str, Any]]]:
        """What one read of a job's pipe holds, as events; at its end of file the pipe is closed."""
        assert job.events is not None
        chunk = os.read(job.events, 1 << 16)
        if not chunk:  # the job ended (or closed it): nothing more comes
            os.close(job.events)
            job.events = None
        *lines, job.partial = (job.partial + chunk).split(b"\n")
        told = []
        for line in lines:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    told.append((job.student, event))
        return told

    def finished(self) -> list[Ended]:
        """The jobs that ended since the last look, and those ended now for passing their deadline or
        the grader's memory limit."""
        ended = []
        for slot, job in list(self.running.items()):
            reason = ""
            if job.process.poll() is None:
                if job.deadline_s is None or time.monotonic() - job.started <= job.deadline_s:
                    continue
                reason = f"the grader's job for it ran past its deadline of {job.deadline_s:.0f} s and was ended"
                self._end([job])
            elif job.cgroup is not None and job.cgroup.oom_kills():
                reason = (f"the grader's job for it used more than {size_text(GRADER_LIMITS.memory_bytes)} "
                          "of memory and was ended")
            self._release(job)
            ended.append(Ended(job.student, job.process.returncode, reason))
            del self.running[slot]
        return ended

    def stop(self) -> None:
        """SIGTERM to every job's session (its run is stopped and accounted); SIGKILL after the grace."""
        self._end(list(self.running.values()))
        for job in self.running.values():
            self._release(job)
        self.running.clear()

    def _end(self, jobs: list[Running]) -> None:
        for job in jobs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for job in jobs:
            try:
                job.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job.process.pid, signal.SIGKILL)
                job.process.wait()

    def _release(self, job: Running) -> None:
        """What an ended job may have left: its sandbox's processes (a job killed before its own
        sweep), its cgroups (the run's, made by the job, and the grader side's)."""
        if job.events is not None:  # its last runs' events, kept for `events`: read without waiting
            os.set_blocking(job.events, False)
            while job.events is not None:
                try:
                    self._told += self._read(job)
                except BlockingIOError:  # nothing more now: whatever still holds the pipe is no job's
                    os.close(job.events)
                    job.events = None
        if not self.sandboxed:
            return
        with contextlib.suppress(OSError, ValueError, KeyError):
            spec = json.loads((job.folder / "sandbox.json").read_text())
            end_processes_if_unclaimed(spec["uid"])
        with contextlib.suppress(OSError, ValueError, KeyError):
            the_job = json.loads((job.folder / "job.json").read_text())
            Cgroup.remove_named(job_cgroup_name(the_job))
        if job.cgroup is not None:
            job.cgroup.remove()
