"""The processes of a run: how the harness finds every one of them, and how it ends them.

Launchers start ranks in sessions of their own (torchrun, horovodrun) or through daemons
(mpirun's prted), and a program can wipe its environment or double-fork a daemon; so no single
net catches all. Four are used together: the launcher's process tree and its session, orphans
re-parented to the harness (a child subreaper while runs last, Linux), and the DISTLAB_RUN_ID
variable every process of the run inherits unless it clears its environment.

Signals that end a run (Ctrl-C, SIGTERM, SIGHUP) are noted, not raised, while it lasts
(StopSignals), so the runner can stop the run in order and account for it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil

KILL_GRACE_S = 5.0  # the first signal, so launchers can pass it on; SIGKILL after this
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what Ctrl-C, timeout, Slurm, CI send


def run_processes(run_id: str, session: int | None = None, *, sessions: tuple[int, ...] = ()) -> list[psutil.Process]:
    """Every live process started for this run that can be found from outside it.

    By the marker all of them inherit (DISTLAB_RUN_ID) and, given the launcher's pid, by its
    session: launchers start ranks in sessions of their own (torchrun, horovodrun) or through
    daemons (mpirun's prted), and a program can wipe its environment, so neither alone is enough.
    While the run lasts the harness also finds them as descendants (see RunProcesses).
    """
    wanted = {*sessions, *(() if session is None else (session,))}
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if os.getsid(proc.pid) in wanted or proc.environ().get("DISTLAB_RUN_ID") == run_id:
                found.append(proc)
    return found


_PR_SET_CHILD_SUBREAPER = 36  # prctl(2)
_subreaper_lock = threading.Lock()
_subreaper_users = 0


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """While runs last, orphans of the run's processes are re-parented to the harness (Linux).

    A rank that double-forks a daemon with a clean environment and a session of its own escapes
    every other net; as a child subreaper the harness still sees it among its own children.
    """
    global _subreaper_users
    libc = None
    with contextlib.suppress(OSError, AttributeError):
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
    with _subreaper_lock:
        _subreaper_users += 1
        if libc is not None and _subreaper_users == 1:
            libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield
    finally:
        with _subreaper_lock:
            _subreaper_users -= 1
            if libc is not None and _subreaper_users == 0:
                libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


class RunProcesses:
    """How the harness finds the processes of one run: the launcher's session and tree, orphans
    re-parented to the harness since the run started, and the DISTLAB_RUN_ID marker."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.since = time.time() - 1.0  # a process older than the run is never one of its own
        self.me = psutil.Process()
        self.children_before = {child.pid for child in self._children()}
        self.roots: list[subprocess.Popen[bytes]] = []  # the launcher and helpers, reaped by Popen
        self.adopted: set[int] = set()

    def _children(self) -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            return self.me.children()
        return []

    def add(self, process: subprocess.Popen[bytes]) -> None:
        self.roots.append(process)

    def find(self) -> list[psutil.Process]:
        own = {root.pid for root in self.roots}
        found: dict[int, psutil.Process] = {}
        for root in self.roots:
            if root.poll() is not None:  # reaped: its pid may be another's by now; its orphans are ours
                continue
            with contextlib.suppress(psutil.Error):
                parent = psutil.Process(root.pid)
                found[root.pid] = parent
                for child in parent.children(recursive=True):
                    found[child.pid] = child
        for child in self._children():  # orphans the harness adopted as subreaper
            if child.pid not in self.children_before and child.pid not in own:
                self.adopted.add(child.pid)
                found[child.pid] = child
                with contextlib.suppress(psutil.Error):
                    for grandchild in child.children(recursive=True):
                        found[grandchild.pid] = grandchild
        for proc in run_processes(self.run_id, sessions=tuple(root.pid for root in self.roots)):
            found[proc.pid] = proc
        found.pop(os.getpid(), None)
        alive = []
        for proc in found.values():
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() >= self.since:
                    alive.append(proc)
        return alive

    def reap(self) -> None:
        """Collect the exit status of adopted orphans: a dead child of ours is a zombie until then."""
        for child in self._children():
            if child.pid not in self.children_before and child.pid not in {r.pid for r in self.roots}:
                self.adopted.add(child.pid)
        for pid in list(self.adopted):
            with contextlib.suppress(ChildProcessError, OSError):
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    self.adopted.discard(pid)


def stop_run(processes: RunProcesses, first: int = signal.SIGTERM) -> None:
    """End the launcher and every process of the run: `first` (the signal the harness got, or
    SIGTERM), a grace period for launchers to pass it on, then SIGKILL; then reap orphans."""
    for sig, grace in ((first, KILL_GRACE_S), (signal.SIGKILL, 2.0)):
        for root in processes.roots:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if root.poll() is None:
                    os.killpg(root.pid, sig)
        for proc in processes.find():
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        if _all_gone(processes, grace):
            break
    for root in processes.roots:
        with contextlib.suppress(subprocess.TimeoutExpired):
            root.wait(timeout=2)
    processes.reap()


def _all_gone(processes: RunProcesses, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while True:
        processes.reap()
        if all(root.poll() is not None for root in processes.roots) and not processes.find():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


class StopSignals:
    """Ctrl-C, SIGTERM and SIGHUP noted, not raised: the run loop sees them and stops the run in
    order. Only in the main thread (the only one Python delivers signals to)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                with contextlib.suppress(OSError, ValueError):
                    self.previous[sig] = signal.signal(sig, self._note)
        return self

    def _note(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(sig, handler)
