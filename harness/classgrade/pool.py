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
from pathlib import Path

from harness.catalog import REPO
from harness.classgrade import sandbox
from harness.grading.plan import GradePlan

STOP_GRACE_S = 60.0  # a job told to stop (SIGTERM) ends its run and its processes within this


def default_jobs(grade_plan: GradePlan, gpus: int) -> int:
    ranks = max(ws for _, ws in grade_plan.cells())
    if grade_plan.profile.on_gpus:
        return max(1, gpus // ranks)
    return max(1, (os.cpu_count() or 1) // (ranks * grade_plan.profile.threads_per_rank))


def gpus_of(slot: int, grade_plan: GradePlan) -> list[int] | None:
    if not grade_plan.profile.on_gpus:
        return None
    ranks = max(ws for _, ws in grade_plan.cells())
    return list(range(slot * ranks, (slot + 1) * ranks))


class Pool:
    """Up to `size` jobs at once, each a process; a slot (its GPUs) per running job; each job claims its own uid."""

    def __init__(self, size: int, sandboxed: bool) -> None:
        self.size, self.sandboxed = size, sandboxed
        self.running: dict[int, tuple[subprocess.Popen[bytes], str]] = {}  # slot -> (process, id)
        self.folders: dict[int, Path] = {}  # slot -> the running job's folder

    def free_slot(self) -> int | None:
        return next((slot for slot in range(self.size) if slot not in self.running), None)

    def start(self, slot: int, student: str, job_path: Path, env: dict[str, str]) -> None:
        with (job_path.parent / "stdout.log").open("wb") as log:
            process = subprocess.Popen([sys.executable, "-m", "harness.classgrade.job", str(job_path)],
                                       stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
                                       env=env, start_new_session=True)
        self.running[slot] = (process, student)
        self.folders[slot] = job_path.parent

    def finished(self) -> list[tuple[str, int]]:
        ended = []
        for slot, (process, student) in list(self.running.items()):
            if process.poll() is not None:
                ended.append((student, process.returncode))
                del self.running[slot]
        return ended

    def stop(self) -> None:
        """SIGTERM to every job's session (its run is stopped and accounted); SIGKILL after the grace."""
        for process, _ in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for process, _ in self.running.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        # A job killed before its own sweep leaves its sandbox's processes to ours.
        for slot in self.running if self.sandboxed else ():
            with contextlib.suppress(OSError, ValueError, KeyError):
                spec = json.loads((self.folders[slot] / "sandbox.json").read_text())
                sandbox.end_processes_if_unclaimed(spec["uid"])
        self.running.clear()
