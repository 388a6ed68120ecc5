"""A job watched from outside while it runs, and what the sandbox refused it named from its output."""

from __future__ import annotations

import contextlib
import os
import re
import threading
from pathlib import Path
from typing import Any

from harness.classgrade.sandbox.cgroups import Cgroup
from harness.classgrade.sandbox.enter import HERE
from harness.classgrade.sandbox.limits import Limits
from harness.classgrade.sandbox.uid import scratch_left


def folder_usage(folder: Path, limits: Limits) -> tuple[Any, str | None]:
    """The job's folder measured (harness/files.tree_usage: by directory descriptors, no link followed),
    and the breach it is, if any: too large, too many entries, too deep, or not measurable at all
    (then the walk's error is the breach: a folder the grader cannot measure is not under its limit)."""
    from harness.files import tree_usage  # here: the entering program has only the standard library

    usage = tree_usage(folder, max_entries=limits.files, max_depth=limits.depth)
    if usage.bytes > limits.output_bytes:
        return usage, "output"
    if usage.error is None:
        return usage, None
    if usage.entries > limits.files:
        return usage, "files"
    return usage, "depth" if usage.error.startswith("folders nested") else "unmeasurable"


class Monitor(threading.Thread):
    """Watches a job's cgroup and folder while it runs; stops it at a breach and keeps the breach's name.
    Also notes every process of the job that ran `program` (its pid inside the sandbox too), so that
    the observation files can be checked against the processes that really ran it."""

    def __init__(self, cgroup: Cgroup | None, folder: Path, limits: Limits, program: str,
                 interval_s: float = 0.25, scratch_uid: int | None = None) -> None:
        super().__init__(daemon=True)
        self.cgroup, self.folder, self.limits, self.program = cgroup, folder, limits, program
        # uid mode: the job's files in /tmp, /var/tmp, /dev/shm count as its output (uid.scratch_left)
        self.scratch_uid = scratch_uid
        self.peak_scratch_bytes = 0
        self.interval_s = interval_s
        self.breaches: list[str] = []
        self.program_pids: set[int] = set()  # pids as the sandbox numbered them (NSpid's last)
        self.peak_bytes = self.peak_entries = 0
        self.unmeasurable: str | None = None  # why the folder could not be measured, where it could not
        self._done = threading.Event()

    def _breach(self, what: str) -> None:
        text = self.limits.breach(what)
        if text not in self.breaches:
            self.breaches.append(text)
        if self.cgroup is not None:
            self.cgroup.kill()

    def _note_processes(self) -> None:
        for pid in self.cgroup.pids() if self.cgroup else []:
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                wrapper = os.path.basename(cmdline[0]) in (b"bwrap", b"setpriv", b"prlimit") or str(HERE).encode() \
                    in cmdline  # the sandbox's own processes carry the command line too
                if self.program.encode() in cmdline and not wrapper:
                    status = Path(f"/proc/{pid}/status").read_text()
                    nspid = re.search(r"^NSpid:\s*(.+)$", status, re.M)
                    self.program_pids.add(int(nspid.group(1).split()[-1]) if nspid else pid)

    def check(self) -> None:
        if self.cgroup is not None:
            if self.cgroup.process_limit_hits():
                self._breach("processes")
            if self.cgroup.oom_kills() and self.limits.breach("memory") not in self.breaches:
                self.breaches.append(self.limits.breach("memory"))  # the kernel has ended the process already
            self._note_processes()
        usage, breach = folder_usage(self.folder, self.limits)
        if self.scratch_uid is not None:
            scratch = sum(size for _, size in scratch_left(self.scratch_uid))
            self.peak_scratch_bytes = max(self.peak_scratch_bytes, scratch)
            usage.bytes += scratch
            if usage.bytes > self.limits.output_bytes:
                breach = "output"
        self.peak_bytes = max(self.peak_bytes, usage.bytes)
        self.peak_entries = max(self.peak_entries, usage.entries)
        if breach is not None:
            if breach == "unmeasurable":
                self.unmeasurable = usage.error
            self._breach(breach)

    def run(self) -> None:
        while not self._done.wait(self.interval_s):
            self.check()

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=5)
        self.check()


# What the sandbox refuses shows in the program's output as the system's own error; each named once.
DENIALS = (
    (re.compile(r"Network is unreachable|\[Errno 101\]|Cannot assign requested address"),
     "tried to reach the network beyond loopback (the sandbox has loopback only)"),
    (re.compile(r"Read-only file system|\[Errno 30\]"),
     "tried to write outside its own folder (everything else is read-only)"),
    (re.compile(r"Resource temporarily unavailable|can't start new thread|BlockingIOError: \[Errno 11\]"),
     "was refused a new process or thread (its process limit)"),
    (re.compile(r"Too many open files|\[Errno 24\]"), "ran out of open files (its open-file limit)"),
    (re.compile(r"File size limit exceeded|SIGXFSZ|\[Errno 27\]"), "wrote a file past its file-size limit"),
    (re.compile(r"No space left on device|\[Errno 28\]"), "filled its private /tmp or /dev/shm"),
    (re.compile(r"Operation not permitted|\[Errno 1\]\b"), "tried something only root may do"),
    (re.compile(r"Permission denied|\[Errno 13\]"), "was refused a file it may not touch (permission denied)"),
)


def denials(texts: list[str]) -> list[str]:
    """The sandbox's refusals found in a run's output, by name, in DENIALS order."""
    return [name for pattern, name in DENIALS if any(pattern.search(text) for text in texts)]
