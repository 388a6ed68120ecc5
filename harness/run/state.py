"""What one run carries from step to step: the prepared run, how its launcher ended, and its result."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.run.launchers import Failure, LaunchSpec
from harness.run.request import RunRequest


@dataclass
class RunResult:
    run_dir: Path
    returncode: int
    status: str
    reason: str | None
    record: dict[str, Any] | None
    failure: Failure | None
    wall_seconds: float
    timed_out: bool = False
    interrupted: bool = False
    hang_suspected: bool = False  # the watchdog fired, or a backend's collective timeout did
    stopped_by: str | None = None  # the signal that stopped the run: SIGINT, SIGTERM, SIGHUP
    # The CPUs the run had, as the harness counted and measured them (accounting.cpu_account):
    # ranks and threads here, the cores that were ours, and what other processes used of them.
    cpu: dict[str, Any] | None = None
    # When run_lab began, launched the launcher, saw it end and had accounted for the run, in seconds of
    # time.monotonic() (CLOCK_MONOTONIC: the ranks' timeline is stamped on the same clock; observe/timeline.py).
    stamps: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class PreparedRun:
    """A prepared run: where it lives, what starts it, and how its processes are found."""

    request: RunRequest
    run_dir: Path
    run_id: str
    env: dict[str, str]
    command: list[str]
    spec: LaunchSpec
    reserve: Path
    store_socket: socket.socket | None = None  # the rendezvous store's, served on loopback

    @property
    def record_path(self) -> Path:
        return self.run_dir / "record.json"


@dataclass
class Outcome:
    """How the launcher ended, as the harness saw it."""

    returncode: int | None = None
    wall: float = 0.0
    timed_out: bool = False
    stopped_by: int | None = None
    launcher_pid: int | None = None
    errors: list[str] = field(default_factory=list)  # the harness's own trouble: lost output, a crash
    others_cores: float | None = None  # the cores other processes kept busy meanwhile (cpu_time.py)
    steal_cores: float | None = None  # the cores a hypervisor took from ours meanwhile (cpu_time.py)
    run_queue: float | None = None  # the host's runnable tasks, mean of samples while it ran (cpu_time.RunQueue)
    launched: float | None = None  # time.monotonic() just before the launcher started (its wall time counts from it)
