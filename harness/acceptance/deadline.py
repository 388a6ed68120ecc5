"""The steps under a hard deadline, overall and per step: each step gets its share of the time left
(Clock), is stopped when that runs out (SIGINT: it keeps and reports what finished, then SIGKILL),
and every process it left is ended (run_step)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from harness.acceptance.processes import STEP_TOKEN, end_leftovers
from harness.acceptance.steps import Step

DEADLINE_S = 510  # the default --deadline on one GPU: 8.5 minutes, 90 s inside a 10-minute command
# A step past its time gets SIGINT, then this long to stop its runs and write what it has, then SIGKILL.
GRACE_S = 30.0
RESERVE_S = GRACE_S + 10.0  # kept back at the end of the deadline: the last step's grace and the archive
MIN_STEP_S = 20.0  # a step that would get less is not started (named so in acceptance.json)


class Clock:
    """The overall deadline, counted from when the acceptance began: DISTLAB_ACCEPTANCE_STARTED (epoch
    seconds, set by docker/gpu-acceptance.sh before its install) or now."""

    def __init__(self, deadline_s: float | None) -> None:
        started = os.environ.get("DISTLAB_ACCEPTANCE_STARTED", "")
        try:
            before = min(max(0.0, time.time() - float(started)), 3600.0) if started else 0.0
        except ValueError:
            before = 0.0
        self.zero = time.monotonic() - before
        self.deadline_s = deadline_s

    def elapsed(self) -> float:
        return time.monotonic() - self.zero

    def left(self) -> float:
        return float("inf") if self.deadline_s is None else self.deadline_s - self.elapsed()

    def limit(self, step: Step, later: list[Step]) -> float:
        """Seconds this step may run: its share of the time left (less the reserve), weighed by the
        estimates of it and the steps after it. A step that ends early leaves its time to the others."""
        if self.deadline_s is None:
            return float("inf")
        usable = self.left() - RESERVE_S
        weights = sum(s.estimate_s for s in [step, *later] if s.argv is not None)
        return usable * step.estimate_s / weights if weights else usable


# What a step runs: distlab itself, as its entry point finds the harness (distlab/__init__.py): in a
# wheel, harness/ lies inside the distlab package, and `-m harness...` found nothing there.
DISTLAB_MODULE = "distlab"


def run_step(step: Step, limit_s: float, env: dict[str, str], log: Any, cwd: Path) -> dict[str, Any]:
    """One step as a process of its own (`python -m distlab ...`), stopped at its limit:
    SIGINT first (distlab stops the run in flight, keeps the finished ones, writes its report),
    SIGKILL GRACE_S later; then nothing it started is left running. cwd: the results folder, not a
    checkout, so the steps import the installed distlab and never a tree that happens to lie beside."""
    token = uuid.uuid4().hex
    started = time.monotonic()
    log.write(f"\n== {step.name}: distlab {' '.join(step.argv or [])}\n")
    log.flush()
    stdout = step.stdout_to.open("w") if step.stdout_to else log
    stopped, interrupted = "", False
    try:
        program = [str(step.script)] if step.script else ["-m", DISTLAB_MODULE]
        process = subprocess.Popen([sys.executable, *program, *(step.argv or [])],
                                   stdin=subprocess.DEVNULL, stdout=stdout, stderr=log, cwd=cwd,
                                   start_new_session=True, env={**env, STEP_TOKEN: token})
        try:
            code = process.wait(timeout=min(limit_s, 1e7))
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as why:
            interrupted = isinstance(why, KeyboardInterrupt)  # Ctrl-C on the acceptance: this step, then no other
            stopped = "Ctrl-C" if interrupted else f"stopped at its deadline ({limit_s:.0f} s)"
            process.send_signal(signal.SIGINT)
            try:
                code = process.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
                stopped += f", killed {GRACE_S:.0f} s later"
    finally:
        if step.stdout_to:
            stdout.close()
    leftovers = end_leftovers(token)
    seconds = time.monotonic() - started
    status = "stopped" if stopped else "ok" if code in step.ok_codes else "failed"
    if status == "ok" and step.stdout_to and step.stdout_to.suffix == ".json" and not json_file(step.stdout_to):
        # doctor exits 1 both when it names a problem and when it crashes: only its facts tell them apart
        status, stopped = "failed", f"exit {code} and no JSON on its stdout ({step.stdout_to.name}): see the log"
    outcome: dict[str, Any] = {"status": status, "exit_code": code, "seconds": round(seconds, 1),
                               "limit_s": None if limit_s == float("inf") else round(limit_s, 1)}
    if stopped:
        outcome["note"] = stopped
    if interrupted:
        outcome["interrupted"] = True
    if leftovers:
        outcome["processes_ended_after"] = leftovers
    log.write(f"== {step.name}: {status} (exit {code}) in {seconds:.1f} s\n")
    log.flush()
    return outcome


def json_file(path: Path) -> bool:
    """Whether a step's product is whole: one JSON document."""
    try:
        json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return True
