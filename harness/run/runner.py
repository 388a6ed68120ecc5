"""`distlab run`: start one lab at one world size through a real launcher and keep everything.

Each run gets a fresh directory under the results root (never reused, never overwritten):

    <results>/<lab>/<UTC time>-ws<N>-<launcher>[-k]/
        command.txt     the exact launcher command line
        launcher.log    everything the launcher printed, byte for byte
        logs/           the launcher's own per-rank files
        rank.<r>.log    each rank's output, gathered from logs/, byte for byte
        record.json     the lab's result record (or the harness's, with status "failed")
        run.json        what the harness saw: exit code, wall time, failing rank, timeout, signal

However a run ends (success, a failed rank, a hang, Ctrl-C, SIGTERM or SIGHUP to the harness, an
error of the harness itself, a full disk), it ends the same way: every process of the run is
stopped (found by the launcher's session and process tree, processes orphaned to the harness, and
the DISTLAB_RUN_ID variable they inherit), then record.json and run.json are written once, with
the reason. Nothing the program writes is trusted: files it could have replaced are read only if
they are regular files of bounded size, and harness files are written by rename, never through
a link the program planted.

This module is the one run, step by step; each step lives in a module named for it: the request
(request.py), the run directory (run_dir.py), the environment and command line (launch.py), the
rendezvous store (rendezvous.py), launching and waiting with the watchdog (waiting.py, output.py),
and the accounting (accounting.py: hangs.py, epochs.py, record.py).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable

from harness.run.accounting import account, account_harness_error
from harness.run.errors import RunRefused, RunStopped
from harness.run.launch import launch_plan
from harness.run.processes import StopSignals
from harness.run.rendezvous import bind_store
from harness.run.request import RunRequest
from harness.run.run_dir import folder_problem, new_run_dir, reserve_space
from harness.run.state import Outcome, PreparedRun, RunResult
from harness.run.waiting import launch_and_wait


def run_lab(request: RunRequest, echo: bool = True, on_line: Callable[[str], None] | None = None) -> RunResult:
    """Run one lab once and account for it; the RunResult says how it went.

    Steps: prepare the run directory and the command (refusals raise RunRefused, a UsageError,
    before anything starts), launch and wait (watchdog, signals), stop every process of the run,
    then collect the rank logs and decide the outcome, writing record.json and run.json once each.
    A signal (Ctrl-C, SIGTERM, SIGHUP) stops the run the same way and is raised as RunStopped
    once run.json is written; an error of the harness itself is written to harness-error.txt,
    reported in run.json and raised as HarnessError.
    """
    request.validate()
    began = time.monotonic()
    with StopSignals() as caught:
        run = _prepare(request)
        outcome = Outcome()
        try:
            launch_and_wait(run, outcome, caught, echo, on_line)
            result = account(run, outcome)
        except Exception as error:  # a bug or a broken environment: the run still ends accounted for
            result = account_harness_error(run, outcome, error)
        if outcome.launched is not None:  # where the run's time went (observe/timeline.py)
            result.stamps = {"began": began, "launched": outcome.launched,
                             "exited": outcome.launched + outcome.wall, "accounted": time.monotonic()}
        signum = caught.signum
    if signum is not None:
        raise RunStopped(signum)
    return result


def _prepare(request: RunRequest) -> PreparedRun:
    """The run directory, the space kept for its accounts, the environment and the command line."""
    placement = request.placement
    node = placement.get("node_rank") if placement.get("nnodes", 1) > 1 else None
    store_socket = bind_store(request)
    try:
        run_dir = new_run_dir(request.results_root, request.lab, request.world_size,
                              request.launcher + (f"-node{node}" if node is not None else ""))
    except RunRefused:
        if store_socket is not None:
            store_socket.close()
        raise
    reserve = run_dir / ".reserve"
    try:
        (run_dir / "logs").mkdir()
        reserve_space(reserve)
        run_id = uuid.uuid4().hex
        env, spec, command, shown = launch_plan(request, run_dir, run_id, store_socket is not None)
        (run_dir / "command.txt").write_text(shown + "\n")
    except OSError as error:
        if store_socket is not None:
            store_socket.close()
        for leftover in (reserve, run_dir / "command.txt"):  # nothing started: take back what we made
            with contextlib.suppress(OSError):
                leftover.unlink()
        for folder in (run_dir / "logs", run_dir):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise RunRefused(folder_problem(request.results_root, error)) from None
    return PreparedRun(request, run_dir, run_id, env, command, spec, reserve, store_socket)
