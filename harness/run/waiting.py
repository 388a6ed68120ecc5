"""Launching and waiting: the launcher started, its output drained, and the run waited for until it
ends, the watchdog fires (each rank's Python stack kept, via py-spy) or a signal stops it; then
every process of the run is stopped, whatever happened."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import psutil

from harness.files import write_bytes
from harness.run import cpu_time
from harness.run.output import OutputPump, keep_streamed_passes
from harness.run.processes import RunProcesses, StopSignals, stop_run, subreaper
from harness.run.rendezvous import serve_store
from harness.run.run_dir import OBSERVE_DIR
from harness.run.state import Outcome, PreparedRun


def stack_dumps(processes: RunProcesses, program: Path) -> str:
    """Each rank's Python stack via py-spy, when it is installed: where a hang sits."""
    py_spy = Path(sys.executable).parent / "py-spy"
    if not py_spy.exists():
        return ""
    dumps = []
    for proc in processes.find():
        with contextlib.suppress(psutil.Error, OSError, subprocess.SubprocessError):
            if str(program) in " ".join(proc.cmdline()):
                out = subprocess.run([str(py_spy), "dump", "--pid", str(proc.pid)], capture_output=True,
                                     text=True, timeout=20)
                dumps.append(f"== pid {proc.pid} ==\n{out.stdout}{out.stderr}")
    return "\n".join(dumps)


def launch_and_wait(run: PreparedRun, outcome: Outcome, caught: StopSignals, echo: bool,
                     on_line: Callable[[str], None] | None) -> None:
    """Start the launcher, drain its output, and wait for it, the watchdog or a signal; then stop
    every process of the run, whatever happened (also on success: no rank may outlive its run)."""
    request = run.request
    sinks: list[IO[bytes]] = [(run.run_dir / "launcher.log").open("wb")]
    if request.launcher == "python":  # no launcher to keep rank 0's output: keep it ourselves
        sinks.append((run.run_dir / "logs" / "rank.0.out").open("wb"))
    processes = RunProcesses(run.run_id)
    clock = cpu_time.read_clock()
    queue = cpu_time.RunQueue()
    started = outcome.launched = time.monotonic()
    pump = process = None
    try:
        with subreaper():
            try:
                if caught.signum is None:
                    if run.store_socket is not None:
                        processes.add(serve_store(run))
                        run.store_socket.close()  # the helper holds it now
                    process = subprocess.Popen(run.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, env=run.env, start_new_session=True)
                    processes.add(process)
                    outcome.launcher_pid = process.pid
                    assert process.stdout is not None  # stdout=PIPE
                    pump = OutputPump(process.stdout, sinks, echo, on_line)
                    pump.start()
                    wait_for_end(run, process, processes, outcome, caught, started, queue)
            finally:
                first = caught.signum if caught.signum is not None else signal.SIGTERM
                stop_run(processes, first)
                if process is not None:
                    outcome.returncode = process.returncode
                if caught.signum is not None and outcome.stopped_by is None and not outcome.timed_out:
                    outcome.stopped_by = caught.signum
    finally:
        if run.store_socket is not None:
            run.store_socket.close()
        if pump is not None:
            pump.join(timeout=5)
            outcome.errors += pump.errors
            # After stop_run: no process of the run is left to change the file once it is written.
            if request.observe:
                kept = keep_streamed_passes(run.run_dir / OBSERVE_DIR, pump.passes)
                if kept:
                    outcome.errors.append(kept)
        for sink in sinks:
            with contextlib.suppress(OSError, ValueError):
                sink.close()
        outcome.wall = time.monotonic() - started
        # After stop_run: every process of the run is reaped, so its CPU time counts as ours.
        ended = cpu_time.read_clock()
        outcome.others_cores = cpu_time.others_cores(clock, ended)
        outcome.steal_cores = cpu_time.steal_cores(clock, ended)
        outcome.run_queue = queue.mean()


def wait_for_end(run: PreparedRun, process: subprocess.Popen[bytes], processes: RunProcesses, outcome: Outcome,
          caught: StopSignals, started: float, queue: cpu_time.RunQueue | None = None) -> None:
    deadline = started + run.request.timeout_s
    while True:
        if queue is not None:
            queue.sample()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=0.2)
            return
        if caught.signum is not None:
            outcome.stopped_by = caught.signum
            return
        if time.monotonic() >= deadline:
            outcome.timed_out = True
            stacks = stack_dumps(processes, run.request.program)
            if stacks:
                with contextlib.suppress(OSError):
                    write_bytes(run.run_dir / "stacks.txt", stacks.encode(errors="replace"))
            return
