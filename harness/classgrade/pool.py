"""Up to N submissions graded at once, each a job process of its own (job.py), each on a slot: its
GPUs on a GPU host; each job claims its own sandbox uid."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness.catalog import REPO
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


@dataclass(frozen=True)
class Ended:
    student: str
    code: int
    reason: str = ""  # why the pool ended it ("" when it ended by itself)


class Pool:
    """Up to `size` jobs at once, each a process in a session of its own; a slot (its GPUs) per
    running job; each job claims its own uid. `command`: what a job runs (its job.json appended)."""

    def __init__(self, size: int, sandboxed: bool,
                 command: tuple[str, ...] = (sys.executable, "-m", "harness.classgrade.job")) -> None:
        self.size, self.sandboxed, self.command = size, sandboxed, command
        self.running: dict[int, Running] = {}

    def free_slot(self) -> int | None:
        return next((slot for slot in range(self.size) if slot not in self.running), None)

    def start(self, slot: int, student: str, job_path: Path, env: dict[str, str],
              deadline_s: float | None = None, cgroup_name: str | None = None) -> None:
        group = Cgroup.create(cgroup_name, GRADER_LIMITS) if cgroup_name and self.sandboxed else None

        def join() -> None:  # in the child, before it runs anything: all it starts is limited with it
            for procs in group.procs_files() if group else []:
                Path(procs).write_text(str(os.getpid()))

        with (job_path.parent / "stdout.log").open("wb") as log:
            process = subprocess.Popen([*self.command, str(job_path)], stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, cwd=REPO, env=env, start_new_session=True,
                                       preexec_fn=join if group else None)
        self.running[slot] = Running(process, student, job_path.parent, time.monotonic(), deadline_s, group)

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
