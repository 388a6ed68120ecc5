"""`distlab run`: start one lab at one world size through a real launcher and keep everything.

Each run gets a fresh directory under the results root (never reused, never overwritten):

    <results>/<lab>/<UTC time>-ws<N>-<launcher>[-k]/
        command.txt     the exact launcher command line
        launcher.log    everything the launcher printed
        logs/           the launcher's own per-rank files
        rank.<r>.log    each rank's output, gathered from logs/
        record.json     the lab's result record (or the harness's, with status "failed")
        run.json        what the harness saw: exit code, wall time, failing rank, timeout
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import psutil

from harness import record as records
from harness.labs import REPO
from harness.launchers import LAUNCHERS, Failure, LaunchSpec
from labs.common.contract import Record, Topology, write_json_atomic

KILL_GRACE_S = 5.0  # SIGTERM first, so launchers can pass it on; SIGKILL after this
LOG_TAIL_LINES = 20
# A rank stuck outside the collectives (a hang, a skipped all-reduce) leaves its peers waiting in
# one; each backend's own timeout then ends them with one of these, naming no culprit.
COLLECTIVE_TIMEOUT = re.compile("|".join([
    r"Timed out waiting \d+ms for \w+ operation",  # Gloo, waiting for one send or recv
    r"Application timeout caused pair closure",  # Gloo, the same timeout seen by a connection
    r"Watchdog caught collective operation timeout",  # NCCL
    r"wait timeout after \d+ms",  # TCPStore, waiting for a peer at a barrier
]))
# Horovod's stall inspector instead reports on rank 0, naming the missing ranks. It runs under the
# MPI controller (mpirun); Horovod 0.28.1's Gloo controller (horovodrun --gloo) never fires it, as
# measured here, so there only the watchdog ends a hang.
HOROVOD_STALL = re.compile(r"stalled for longer than \d+ seconds\. Will shutdown")
# Collective timeout handed to the labs (their --timeout): under the watchdog, so a backend names
# the stuck collective before the watchdog has to end the run, but never so short that a slow
# start or a checkpoint write on rank 0 trips it.
COLLECTIVE_TIMEOUT_S = (30.0, 120.0)


@dataclass
class RunRequest:
    lab: str
    program: Path
    world_size: int
    launcher: str
    backend: str
    lab_args: list[str] = field(default_factory=list)
    threads: int = 1
    timeout_s: float = 900.0
    results_root: Path = Path("results")
    python: str = sys.executable
    max_restarts: int = 0
    placement: dict[str, Any] = field(default_factory=dict)  # multi-node LaunchSpec fields
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. GLOO_SOCKET_IFNAME, MASTER_ADDR


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

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def default_threads(world_size: int) -> int:
    """Cores shared evenly between ranks, at least one each."""
    return max(1, (os.cpu_count() or 1) // world_size)


def new_run_dir(results_root: Path, lab: str, world_size: int, launcher: str) -> Path:
    """A directory no earlier run used: mkdir without exist_ok is the atomic claim."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = results_root / lab / f"{stamp}-ws{world_size}-{launcher}"
    base.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        candidate = base if attempt == 1 else base.with_name(f"{base.name}-{attempt}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise RuntimeError(f"could not claim a run directory under {base.parent}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _git_commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=5)
        if out.returncode == 0:
            return out.stdout.strip()
    return None


def run_processes(run_id: str) -> list[psutil.Process]:
    """Every process started for this run, found by the marker all of them inherit.

    Launchers start ranks in sessions of their own (horovodrun) or through daemons
    (mpirun's prted), so a process group alone does not reach them all.
    """
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("DISTLAB_RUN_ID") == run_id:
                found.append(proc)
    return found


def stop_run(process: subprocess.Popen[str], run_id: str) -> None:
    """End the launcher and every rank it started: TERM, a grace period, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        for proc in run_processes(run_id):
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        deadline = time.monotonic() + (KILL_GRACE_S if sig == signal.SIGTERM else 2.0)
        while time.monotonic() < deadline:
            if process.poll() is not None and not run_processes(run_id):
                return
            time.sleep(0.1)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=2)


def _pump(stream: TextIO, sinks: list[TextIO], echo: bool, on_line: Callable[[str], None] | None) -> None:
    for line in stream:
        for sink in sinks:
            sink.write(line)
            sink.flush()
        if echo:
            sys.stdout.write(line)
            sys.stdout.flush()
        if on_line:
            on_line(line.rstrip("\n"))


def _stack_dumps(run_id: str, program: Path) -> str:
    """Each rank's Python stack via py-spy, when it is installed: where a hang sits."""
    py_spy = Path(sys.executable).parent / "py-spy"
    if not py_spy.exists():
        return ""
    dumps = []
    for proc in run_processes(run_id):
        with contextlib.suppress(psutil.Error, OSError, subprocess.SubprocessError):
            if str(program) in " ".join(proc.cmdline()):
                out = subprocess.run([str(py_spy), "dump", "--pid", str(proc.pid)], capture_output=True,
                                     text=True, timeout=20)
                dumps.append(f"== pid {proc.pid} ==\n{out.stdout}{out.stderr}")
    return "\n".join(dumps)


def collective_timeout(watchdog_s: float) -> float:
    low, high = COLLECTIVE_TIMEOUT_S
    return min(high, max(low, watchdog_s / 2))


def _gives(args: list[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in args)


def gather_rank_logs(request: RunRequest, run_dir: Path) -> dict[int, Path]:
    """One rank.<r>.log per rank, whatever layout the launcher used."""
    gathered = {}
    for rank, parts in sorted(LAUNCHERS[request.launcher].rank_logs(run_dir / "logs").items()):
        target = run_dir / f"rank.{rank}.log"
        with target.open("w") as out:
            for part in parts:
                out.write(f"==> {part.relative_to(run_dir)} <==\n")
                out.write(part.read_text(errors="replace"))
        gathered[rank] = target
    return gathered


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_lab(request: RunRequest, echo: bool = True, on_line: Callable[[str], None] | None = None) -> RunResult:
    node = request.placement.get("node_rank") if request.placement.get("nnodes", 1) > 1 else None
    run_dir = new_run_dir(request.results_root, request.lab, request.world_size,
                          request.launcher + (f"-node{node}" if node is not None else ""))
    (run_dir / "logs").mkdir()
    record_path = run_dir / "record.json"
    run_id = uuid.uuid4().hex
    env = dict(os.environ)
    env.update({
        "DISTLAB_RUN_ID": run_id,
        "OMP_NUM_THREADS": str(request.threads),
        "PYTHONUNBUFFERED": "1",  # ranks' lines reach the logs as they happen
        "MASTER_ADDR": "127.0.0.1",  # single node: rendezvous stays on loopback
        "MASTER_PORT": str(_free_port()),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        **LAUNCHERS[request.launcher].env,
        **request.extra_env,
    })
    commit = _git_commit()
    if commit:
        env["DISTLAB_GIT_COMMIT"] = commit
    spec = LaunchSpec(
        program=request.program,
        lab_args=["--backend", request.backend, "--record", str(record_path),
                  *([] if _gives(request.lab_args, "--timeout") else
                    ["--timeout", f"{collective_timeout(request.timeout_s):g}"]),
                  *request.lab_args],
        world_size=request.world_size,
        log_dir=run_dir / "logs",
        python=request.python,
        env_names=tuple(name for name in ("DISTLAB_RUN_ID", "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "MASTER_ADDR",
                                          "MASTER_PORT", "PYTHONPATH", "DISTLAB_GIT_COMMIT", *request.extra_env)
                        if name in env),
        max_restarts=request.max_restarts,
        **request.placement,
    )
    command = LAUNCHERS[request.launcher].command(spec)
    shown_env = {"OMP_NUM_THREADS": str(request.threads), **LAUNCHERS[request.launcher].env}
    (run_dir / "command.txt").write_text(
        " ".join(f"{name}={shlex.quote(value)}" for name, value in shown_env.items()) + f" {shlex.join(command)}\n")

    started = time.monotonic()
    timed_out = interrupted = False
    sinks = [(run_dir / "launcher.log").open("w")]
    if request.launcher == "python":  # no launcher to keep rank 0's output: keep it ourselves
        sinks.append((run_dir / "logs" / "rank.0.out").open("w"))
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               text=True, env=env, start_new_session=True)
    pump = threading.Thread(target=_pump, args=(process.stdout, sinks, echo, on_line), daemon=True)
    pump.start()
    try:
        process.wait(timeout=request.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        stacks = _stack_dumps(run_id, request.program)
        if stacks:
            (run_dir / "stacks.txt").write_text(stacks)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        stop_run(process, run_id)  # also on success: no rank may outlive its run
        pump.join(timeout=5)
        for sink in sinks:
            sink.close()
    wall = time.monotonic() - started

    rank_logs = gather_rank_logs(request, run_dir)
    launcher_output = (run_dir / "launcher.log").read_text(errors="replace")
    failure = None
    if process.returncode != 0 and not (timed_out or interrupted):
        failure = LAUNCHERS[request.launcher].failure(launcher_output) or Failure(
            0 if request.world_size == 1 else None, process.returncode, None)

    if timed_out:
        reason = f"timed out after {request.timeout_s:g} s: hang suspected (each rank's last lines are in its log)"
    elif interrupted:
        reason = "interrupted (Ctrl-C)"
    elif failure:
        reason = f"{failure.describe()} (launcher exit code {process.returncode})"
    else:
        reason = None

    record, record_error = None, None
    try:
        record = records.load(record_path)
    except records.RecordError as error:
        record_error = str(error)
        if record_path.exists():  # keep the unreadable file for inspection, never half-read it
            os.replace(record_path, run_dir / "record.corrupt.json")
    rank0_elsewhere = (record is None and not reason and process.returncode == 0
                       and request.placement.get("nnodes", 1) > 1 and not record_path.exists())
    if rank0_elsewhere:
        # Rank 0 ran on another node and wrote the record there; this node's part went well.
        record_error = None
    elif record is None:
        record = _harness_record(request, reason or record_error or "no record")
        write_json_atomic(record_path, record)
    elif reason and not (record["status"] == "failed" and failure and failure.exit_code in (1, 2)):
        # The launcher's account comes first: when rank 1 dies, rank 0 typically fails too
        # ("connection reset", "Horovod has been shut down"), and that is a consequence.
        # Unless the ranks ended with the contract's own codes (1: a check failed, 2: bad input):
        # then the lab's reason is the cause, and the launcher only reports it.
        record.update(status="failed", reason=reason, lab_status=record["status"], lab_reason=record["reason"])
        write_json_atomic(record_path, record)
    elif reason:
        reason = f"{record['reason']} ({reason})"

    lab_ok = record is None or record["status"] == "ok"
    status = "ok" if process.returncode == 0 and lab_ok and not record_error else "failed"
    final_reason = reason or (record or {}).get("reason") or record_error
    hang_reason = None if timed_out or status == "ok" else _collective_timeout(rank_logs, launcher_output)
    if hang_reason:
        final_reason = f"{hang_reason} ({final_reason})"
        if record is not None and record_path.exists():
            record["reason"] = final_reason
            write_json_atomic(record_path, record)
    result = RunResult(run_dir, process.returncode if process.returncode is not None else -9, status,
                       None if status == "ok" else final_reason, record, failure, wall, timed_out, interrupted,
                       hang_suspected=timed_out or bool(hang_reason))
    write_json_atomic(run_dir / "run.json", {
        "lab": request.lab, "program": str(request.program), "world_size": request.world_size,
        "launcher": request.launcher, "backend": request.backend, "threads_per_rank": request.threads,
        "oversubscribed": request.world_size * request.threads > (os.cpu_count() or 1),
        "command": command, "returncode": result.returncode, "status": status, "reason": result.reason,
        "failure": asdict(failure) if failure else None, "timed_out": timed_out, "interrupted": interrupted,
        "hang_suspected": result.hang_suspected,
        "wall_seconds": wall, "record_error": record_error, "run_id": run_id,
        "rank_logs": {rank: str(path.name) for rank, path in rank_logs.items()},
        "placement": {k: str(v) if isinstance(v, Path) else v for k, v in request.placement.items()},
        "max_restarts": request.max_restarts,
        # torchrun keeps one log folder per attempt: attempts after the first are restarts.
        "restarts": max(0, len(list((run_dir / "logs").glob("*/attempt_*"))) - 1),
    })
    if interrupted:
        raise KeyboardInterrupt
    return result


def _collective_timeout(rank_logs: dict[int, Path], launcher_output: str) -> str | None:
    """A failed run's hang, as the backends' own timeouts reported it; None if none did."""
    waited = [rank for rank, log in sorted(rank_logs.items())
              if COLLECTIVE_TIMEOUT.search(log.read_text(errors="replace"))]
    if waited:
        # The ranks that timed out were waiting for the others. Those that did not were stuck
        # elsewhere: a person should look at them first. When all timed out, each was waiting
        # in a different collective (a rank skipped one). Only this node's ranks are judged.
        stuck = [rank for rank in sorted(rank_logs) if rank not in waited]
        if stuck:
            return (f"hang suspected: a collective timed out on rank {_ranks(waited)}; rank {_ranks(stuck)} never "
                    f"reported it, look there first")
        return "hang suspected: a collective timed out on every rank, each waiting in a different one"
    if HOROVOD_STALL.search(launcher_output):
        return "hang suspected: Horovod's stall inspector shut the job down; rank 0's log names the missing ranks"
    return None


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _harness_record(request: RunRequest, reason: str) -> dict[str, Any]:
    """The record of a run whose lab wrote none (a crash, a kill, a hang)."""
    topology = Topology(world_size=request.world_size, launcher=request.launcher)
    rec = Record(lab=request.lab, config={"lab_args": request.lab_args}, topology=topology,
                 backend=request.backend, status="failed", reason=reason)
    data = rec.to_dict()
    data["provenance"]["threads_per_rank"] = request.threads
    data["provenance"]["written_by"] = "harness"
    return data
