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
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import datetime as dt
import errno
import io
import ipaddress
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from harness import files, schema_check, tensorboard
from harness import record as records
from harness.catalog import REPO
from harness.files import (
    NotARegularFile,
    copy_regular_file,
    read_regular_file,
    replace,
    set_aside,
    write_bytes,
    write_json,
)
from harness.launchers import LAUNCHERS, Failure, LaunchSpec, harness_flag, signal_name
from harness.processes import KILL_GRACE_S, RunProcesses, StopSignals, run_processes, stop_run, subreaper
from harness.usage import UsageError
from labs.common.contract import Record
from labs.common.host import free_port, git_commit
from labs.common.topology import Topology

LOG_TAIL_LINES = 20
LOG_SCAN_BYTES = 1 << 20  # what is read of a log's end to name a failure or a hang
OBSERVER = Path(__file__).resolve().parent / "observer"  # prepended to every rank's PYTHONPATH (sitecustomize)
OBSERVE_DIR = "observe"  # in the run directory: one rank.<r>.json per rank, rank 0's final_weights.pt
RUN_DIR_PLACEHOLDER = "{run_dir}"  # in a lab argument: this run's directory (e.g. --checkpoint {run_dir}/ck.pt)
RESERVE_BYTES = 256 << 10  # set aside at the start, so record.json and run.json fit on a full disk
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")  # lab, launcher, backend: parts of paths
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
__all__ = ["KILL_GRACE_S", "HarnessError", "RunRefused", "RunRequest", "RunResult", "RunStopped", "collective_timeout",
           "default_threads", "gather_rank_logs", "new_run_dir", "printable", "run_lab", "run_processes", "tail"]


class RunRefused(UsageError):
    """A run that cannot start (bad request, results folder unwritable or full): one line, exit 2."""


class HarnessError(RuntimeError):
    """The harness itself failed around a run; run.json says so and names the file with the details."""

    exit_code = 1


class RunStopped(KeyboardInterrupt):
    """A signal (Ctrl-C, SIGTERM, SIGHUP) stopped the run; raised once its run.json is written.

    A KeyboardInterrupt, so whoever handles Ctrl-C handles these too; exit_code is 128 + the signal.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal_name(signum)}")


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
    # The harness's observer on every rank (harness/observer): what each rank's data loaders fetched,
    # its optimizer steps, saves, process group and final weights, written to <run dir>/observe.
    observe: bool = True
    backend_reason: str = ""  # why this backend: asked for, or the hardware rule (catalog.backend_for)
    # A command the launcher runs inside (`distlab grade-class`: harness/classgrade/sandbox.py), before
    # the launcher's own line; RUN_DIR_PLACEHOLDER in it names the run directory. Empty: none.
    sandbox: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Refuse what no run can start with; called on creation and again by run_lab."""
        for what, name in (("lab", self.lab), ("launcher", self.launcher), ("backend", self.backend)):
            if not isinstance(name, str) or not SAFE_NAME.fullmatch(name):
                raise RunRefused(f"{what} name {name!r} may hold only letters, digits, '.', '_', '+' and '-' "
                                 "(it names folders)")
        if self.launcher not in LAUNCHERS:
            raise RunRefused(f"unknown launcher {self.launcher!r}; choose one of: {', '.join(LAUNCHERS)}")
        for what, value, low in (("world size", self.world_size, 1), ("threads per rank", self.threads, 1),
                                 ("max restarts", self.max_restarts, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise RunRefused(f"{what} {value!r} must be a whole number >= {low}")
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) \
                or timeout <= 0:
            raise RunRefused(f"timeout {timeout!r} must be a finite number of seconds above 0 (the watchdog "
                             "would be off otherwise)")
        if not all(isinstance(arg, str) for arg in self.lab_args):
            raise RunRefused("the lab's arguments must be strings")
        for arg in self.lab_args:
            if "\0" in arg:
                raise RunRefused(f"lab argument {arg!r} holds a NUL byte, which no command line can carry")
        for arg in self.lab_args[:self.lab_args.index("--")] if "--" in self.lab_args else self.lab_args:
            owned = harness_flag(arg)
            if owned:
                raise RunRefused(f"{arg!r} after -- would override {owned}, which distlab run sets itself "
                                 f"({_OWNED_WHY[owned]}); remove it from the lab's arguments")


_OWNED_WHY = {"--record": "the record is written into the run directory",
              "--backend": "choose it with distlab's own --backend"}


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

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def default_threads(world_size: int) -> int:
    """Cores shared evenly between ranks, at least one each."""
    return max(1, (os.cpu_count() or 1) // world_size)


def new_run_dir(results_root: Path, lab: str, world_size: int, launcher: str) -> Path:
    """A directory no earlier run used: mkdir without exist_ok is the atomic claim.

    `lab` and `launcher` become path parts, so each must be one plain name (never '..' or a path).
    """
    for what, name in (("lab", lab), ("launcher", launcher)):
        if not SAFE_NAME.fullmatch(name):
            raise RunRefused(f"{what} name {name!r} may hold only letters, digits, '.', '_', '+' and '-' "
                             "(it names a folder under the results root)")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = Path(results_root) / lab / f"{stamp}-ws{world_size}-{launcher}"
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, 1000):
            candidate = base if attempt == 1 else base.with_name(f"{base.name}-{attempt}")
            try:
                candidate.mkdir()
                return candidate
            except FileExistsError:
                continue
    except OSError as error:
        raise RunRefused(_folder_problem(Path(results_root), error)) from None
    raise RunRefused(f"could not claim a run directory under {base.parent}")


def _folder_problem(root: Path, error: OSError) -> str:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"results folder {root} is full ({error.strerror}); free some space or choose another --results"
    return (f"results folder {root} is not writable ({error.strerror or error}); choose another --results")


def _read_end(path: Path, limit: int = LOG_SCAN_BYTES) -> str:
    """The last `limit` bytes of a log, decoded for people; '' if it is not a regular file."""
    try:
        return read_regular_file(path, limit, tail=True).decode(errors="replace")
    except (OSError, ValueError):
        return ""


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """A log's last lines, for a terminal (escape sequences shown, not obeyed)."""
    return printable("\n".join(_read_end(path, 64 << 10).splitlines()[-lines:]))


# --- rank output --------------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Text safe for a terminal: control characters (escape sequences) shown, not obeyed."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class _Pump(threading.Thread):
    """Drain the launcher's output as bytes, whatever they are: written to the logs as received,
    decoded (with replacement) only to show them. A sink that fails (a full disk) is dropped and
    the error kept; the pipe is always drained, so the launcher never blocks on it."""

    def __init__(self, stream: IO[bytes], sinks: list[IO[bytes]], echo: bool,
                 on_line: Callable[[str], None] | None) -> None:
        super().__init__(daemon=True)
        self.stream, self.sinks, self.echo, self.on_line = stream, sinks, echo, on_line
        self.errors: list[str] = []
        self.bytes = 0

    def run(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = b""
        fd = self.stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            self.bytes += len(chunk)
            for sink in list(self.sinks):
                try:
                    sink.write(chunk)
                    sink.flush()
                except (OSError, ValueError) as error:
                    self.errors.append(f"{getattr(sink, 'name', 'log')}: output lost after {self.bytes - len(chunk)} "
                                       f"bytes ({getattr(error, 'strerror', None) or error})")
                    self.sinks.remove(sink)
            if self.echo:
                try:
                    sys.stdout.write(printable(decoder.decode(chunk)))
                    sys.stdout.flush()
                except (OSError, ValueError):  # nobody reads our output any more (a closed pipe)
                    self.echo = False
            if self.on_line:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if len(pending) > 1 << 16:  # a line without end: shown in pieces
                    lines.append(pending)
                    pending = b""
                for line in lines:
                    try:
                        self.on_line(printable(line.decode(errors="replace").rstrip("\r")))
                    except Exception as error:  # the caller's display failed; the output still flows
                        self.errors.append(f"on_line: {type(error).__name__}: {error}")
                        self.on_line = None
                        break


def _stack_dumps(processes: RunProcesses, program: Path) -> str:
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


def collective_timeout(watchdog_s: float) -> float:
    low, high = COLLECTIVE_TIMEOUT_S
    return min(high, max(low, watchdog_s / 2))


def _gives(args: list[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in args)


def gather_rank_logs(request: RunRequest, run_dir: Path) -> dict[int, Path]:
    """One rank.<r>.log per rank, whatever layout the launcher used, byte for byte.

    Only regular files are read (a FIFO or a link the program left in logs/ is skipped), and each
    rank.<r>.log is written by rename.
    """
    gathered = {}
    for rank, parts in sorted(LAUNCHERS[request.launcher].rank_logs(run_dir / "logs").items()):
        target = run_dir / f"rank.{rank}.log"
        fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                for part in parts:
                    out.write(f"==> {part.relative_to(run_dir)} <==\n".encode())
                    try:
                        copy_regular_file(part, out)
                    except NotARegularFile as refused:  # left there by the program: not read
                        out.write(f"(not read: {refused})\n".encode())
            replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        gathered[rank] = target
    return gathered


# --- one run, step by step ----------------------------------------------------------------------

@dataclass
class _Run:
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
class _Outcome:
    """How the launcher ended, as the harness saw it."""

    returncode: int | None = None
    wall: float = 0.0
    timed_out: bool = False
    stopped_by: int | None = None
    launcher_pid: int | None = None
    errors: list[str] = field(default_factory=list)  # the harness's own trouble: lost output, a crash


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
    with StopSignals() as caught:
        run = _prepare(request)
        outcome = _Outcome()
        try:
            _launch_and_wait(run, outcome, caught, echo, on_line)
            result = _account(run, outcome)
        except Exception as error:  # a bug or a broken environment: the run still ends accounted for
            result = _account_harness_error(run, outcome, error)
        signum = caught.signum
    if signum is not None:
        raise RunStopped(signum)
    return result


def _prepare(request: RunRequest) -> _Run:
    """The run directory, the space kept for its accounts, the environment and the command line."""
    placement = request.placement
    node = placement.get("node_rank") if placement.get("nnodes", 1) > 1 else None
    store_socket = _bind_rendezvous_store(request)
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
        _reserve_space(reserve)
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
        raise RunRefused(_folder_problem(request.results_root, error)) from None
    return _Run(request, run_dir, run_id, env, command, spec, reserve, store_socket)


def launch_plan(request: RunRequest, run_dir: Path, run_id: str, store_served: bool = False
                ) -> tuple[dict[str, str], LaunchSpec, list[str], str]:
    """What a run starts: the environment, the launch spec, the launcher's command line, and that
    command as a person would paste it (the settings that matter in front)."""
    env = dict(os.environ)
    observer = [str(OBSERVER)] if request.observe else []
    env.update({
        "DISTLAB_RUN_ID": run_id,
        "OMP_NUM_THREADS": str(request.threads),
        "PYTHONUNBUFFERED": "1",  # ranks' lines reach the logs as they happen
        "MASTER_ADDR": "127.0.0.1",  # single node: rendezvous stays on loopback
        "MASTER_PORT": str(free_port()),
        "PYTHONPATH": os.pathsep.join(filter(None, [*observer, str(REPO), env.get("PYTHONPATH")])),
        **({"DISTLAB_OBSERVE_DIR": str(run_dir / OBSERVE_DIR)} if request.observe else {}),
        **backend_env(request.backend, run_dir),
        **LAUNCHERS[request.launcher].env,
        **request.extra_env,
    })
    commit = git_commit()
    if commit:
        env["DISTLAB_GIT_COMMIT"] = commit
    spec = LaunchSpec(
        program=request.program,
        lab_args=["--backend", request.backend, "--record", str(run_dir / "record.json"),
                  *([] if _gives(request.lab_args, "--timeout") else
                    ["--timeout", f"{collective_timeout(request.timeout_s):g}"]),
                  *(arg.replace(RUN_DIR_PLACEHOLDER, str(run_dir)) for arg in request.lab_args)],
        world_size=request.world_size,
        log_dir=run_dir / "logs",
        python=request.python,
        env_names=tuple(name for name in ("DISTLAB_RUN_ID", "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "MASTER_ADDR",
                                          "MASTER_PORT", "PYTHONPATH", "DISTLAB_GIT_COMMIT", "DISTLAB_OBSERVE_DIR",
                                          *backend_env(request.backend, run_dir), *request.extra_env)
                        if name in env),
        max_restarts=request.max_restarts,
        rdzv_store_served=store_served,
        **request.placement,
    )
    command = [*(arg.replace(RUN_DIR_PLACEHOLDER, str(run_dir)) for arg in request.sandbox),
               *LAUNCHERS[request.launcher].command(spec)]
    shown_env = {"OMP_NUM_THREADS": str(request.threads), **backend_env(request.backend, run_dir),
                 **LAUNCHERS[request.launcher].env}
    shown = " ".join(f"{name}={shlex.quote(value)}" for name, value in shown_env.items()) + f" {shlex.join(command)}"
    return env, spec, command, shown


def backend_env(backend: str, run_dir: Path) -> dict[str, str]:
    """Settings a backend needs from the environment. NCCL: torch's flight recorder keeps the last
    collectives of every rank and dumps them into the run directory when a collective times out,
    so a GPU hang report says which collective each rank was in."""
    if backend != "nccl":
        return {}
    return {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_FR_DUMP_TEMP_FILE": str(run_dir / "nccl_flight_recorder.rank_")}


def dry_run(request: RunRequest) -> str:
    """The command `run_lab` would start for this request, started nothing and written nothing."""
    run_dir = request.results_root / request.lab / "<new run>"
    return launch_plan(request, run_dir, "<run id>")[3]


def _reserve_space(path: Path) -> None:
    with path.open("wb") as handle:
        try:
            os.posix_fallocate(handle.fileno(), 0, RESERVE_BYTES)
        except OSError as error:
            if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate
                raise
            handle.write(b"\0" * RESERVE_BYTES)
            handle.flush()
            os.fsync(handle.fileno())


def _bind_rendezvous_store(request: RunRequest) -> socket.socket | None:
    """Node 0 of a run whose rendezvous endpoint is on loopback binds the store's socket there.

    torchrun's own c10d store listens on every interface of the host whatever the endpoint says;
    so a helper of the run serves it from this socket instead, and every torchrun is a client.
    """
    endpoint = request.placement.get("rdzv_endpoint")
    if request.launcher != "torchrun" or not endpoint or request.placement.get("node_rank", 0) != 0:
        return None
    host, _, port = str(endpoint).rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return None  # not resolvable here: checked, and reported, before the run by multinode
    if not infos or not all(_loopback(info[4][0]) for info in infos):
        return None
    family, _, _, _, address = infos[0]
    try:
        return socket.create_server(address[:2], family=family, backlog=128)
    except OSError as error:
        raise RunRefused(f"rendezvous endpoint {endpoint} cannot be served here ({error.strerror}); "
                         "choose another port") from None


def _loopback(address: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    return False


def _launch_and_wait(run: _Run, outcome: _Outcome, caught: StopSignals, echo: bool,
                     on_line: Callable[[str], None] | None) -> None:
    """Start the launcher, drain its output, and wait for it, the watchdog or a signal; then stop
    every process of the run, whatever happened (also on success: no rank may outlive its run)."""
    request = run.request
    sinks: list[IO[bytes]] = [(run.run_dir / "launcher.log").open("wb")]
    if request.launcher == "python":  # no launcher to keep rank 0's output: keep it ourselves
        sinks.append((run.run_dir / "logs" / "rank.0.out").open("wb"))
    processes = RunProcesses(run.run_id)
    started = time.monotonic()
    pump = process = None
    try:
        with subreaper():
            try:
                if caught.signum is None:
                    if run.store_socket is not None:
                        processes.add(_serve_store(run))
                        run.store_socket.close()  # the helper holds it now
                    process = subprocess.Popen(run.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, env=run.env, start_new_session=True)
                    processes.add(process)
                    outcome.launcher_pid = process.pid
                    pump = _Pump(process.stdout, sinks, echo, on_line)
                    pump.start()
                    _wait(run, process, processes, outcome, caught, started)
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
        for sink in sinks:
            with contextlib.suppress(OSError, ValueError):
                sink.close()
        outcome.wall = time.monotonic() - started


def _serve_store(run: _Run) -> subprocess.Popen[bytes]:
    fd = run.store_socket.fileno()
    port = run.store_socket.getsockname()[1]
    code = ("import sys; from harness.launchers import serve_rendezvous_store as serve; "
            "serve(int(sys.argv[1]), int(sys.argv[2]))")
    with (run.run_dir / "logs" / "rendezvous-store.log").open("wb") as log:
        return subprocess.Popen([run.request.python, "-c", code, str(fd), str(port), str(run.run_dir)], pass_fds=(fd,),
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=run.env,
                                start_new_session=True)


def _wait(run: _Run, process: subprocess.Popen[bytes], processes: RunProcesses, outcome: _Outcome,
          caught: StopSignals, started: float) -> None:
    deadline = started + run.request.timeout_s
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=0.2)
            return
        if caught.signum is not None:
            outcome.stopped_by = caught.signum
            return
        if time.monotonic() >= deadline:
            outcome.timed_out = True
            stacks = _stack_dumps(processes, run.request.program)
            if stacks:
                with contextlib.suppress(OSError):
                    write_bytes(run.run_dir / "stacks.txt", stacks.encode(errors="replace"))
            return


def _account(run: _Run, outcome: _Outcome) -> RunResult:
    """Rank logs, the failing rank, the record (the lab's, amended, or the harness's) and the reason;
    record.json and run.json written once each."""
    request, run_dir, record_path = run.request, run.run_dir, run.record_path
    rank_logs: dict[int, Path] = {}
    try:
        rank_logs = gather_rank_logs(request, run_dir)
    except OSError as error:
        outcome.errors.append(f"rank logs: {error.strerror or error}")
    launcher_output = _read_end(run_dir / "launcher.log")
    returncode = outcome.returncode
    failure = None
    if returncode not in (0, None) and not (outcome.timed_out or outcome.stopped_by):
        failure = LAUNCHERS[request.launcher].failure(launcher_output) or Failure(
            0 if request.world_size == 1 else None, returncode, None)

    if outcome.timed_out:
        reason = f"timed out after {request.timeout_s:g} s: hang suspected (each rank's last lines are in its log)"
    elif outcome.stopped_by == signal.SIGINT:
        reason = "interrupted (Ctrl-C)"
    elif outcome.stopped_by is not None:
        reason = f"stopped by {signal_name(outcome.stopped_by)}"
    elif failure:
        reason = f"{failure.describe()} (launcher exit code {returncode})"
    else:
        reason = None
    lost = [error for error in outcome.errors if "output lost" in error or error.startswith("rank logs")]
    if lost:  # a full disk comes first: what failed after it (a rank writing its record) follows from it
        reason = f"the results folder could not keep the run's output: {lost[0]}" + (f"; {reason}" if reason else "")

    record, record_error = None, None
    try:
        record = schema_check.check_record(records.load(record_path), str(record_path))
    except records.RecordError as error:
        record_error = str(error)
        if os.path.lexists(record_path):  # keep the unreadable file for inspection, never half-read it
            set_aside(record_path)
    rank0_elsewhere = (record is None and not reason and returncode == 0
                       and request.placement.get("nnodes", 1) > 1 and not os.path.lexists(record_path))
    write_record = False
    if rank0_elsewhere:
        # Rank 0 ran on another node and wrote the record there; this node's part went well.
        record_error = None
    elif record is None:
        record, write_record = _harness_record(request, reason or record_error or "no record"), True
    elif reason and not (record["status"] == "failed" and failure and failure.exit_code in (1, 2)):
        # The launcher's account comes first: when rank 1 dies, rank 0 typically fails too
        # ("connection reset", "Horovod has been shut down"), and that is a consequence.
        # Unless the ranks ended with the contract's own codes (1: a check failed, 2: bad input):
        # then the lab's reason is the cause, and the launcher only reports it.
        record.update(status="failed", reason=reason, lab_status=record["status"], lab_reason=record["reason"])
        write_record = True
    elif reason:
        reason = f"{record['reason']} ({reason})"

    lab_ok = record is None or record["status"] == "ok"
    status = "ok" if returncode == 0 and lab_ok and not record_error and not lost else "failed"
    final_reason = reason or (record or {}).get("reason") or record_error
    hang_reason = None if outcome.timed_out or status == "ok" else _collective_timeout(rank_logs, launcher_output)
    if hang_reason:
        final_reason = f"{hang_reason} ({final_reason})"
        if record is not None:
            record["reason"] = final_reason
            write_record = True
    result = RunResult(run_dir, returncode if returncode is not None else -9, status,
                       None if status == "ok" else printable(str(final_reason)), record, failure, outcome.wall,
                       outcome.timed_out, outcome.stopped_by is not None,
                       hang_suspected=outcome.timed_out or bool(hang_reason),
                       stopped_by=signal_name(outcome.stopped_by) if outcome.stopped_by is not None else None)
    _release(run)
    if write_record:
        _write_record(run, outcome, record)
    if record is not None:
        try:
            write_epochs_csv(run.run_dir / "epochs.csv", record)
        except OSError as error:
            outcome.errors.append(f"epochs.csv: {error.strerror or error}")
    _write_run_json(run, outcome, result, rank_logs, record_error)
    return result


def _write_record(run: _Run, outcome: _Outcome, record: dict[str, Any]) -> None:
    """The one place record.json is written by the harness (by rename: whatever the program left there
    is replaced or set aside, never written through)."""
    try:
        write_json(run.record_path, record)
    except OSError as error:
        outcome.errors.append(f"record.json: {error.strerror or error}")


# A training lab's per-epoch metrics (labs/TRAINING.md, "The record"), as a table for spreadsheets.
EPOCH_COLUMNS = ("train_loss", "test_accuracy", "epoch_seconds")


def write_epochs_csv(path: Path, record: dict[str, Any]) -> None:
    """epochs.csv beside record.json: one row per epoch, when the record has per-epoch metrics."""
    metrics = record.get("metrics") or {}
    columns = [name for name in EPOCH_COLUMNS if isinstance(metrics.get(name), list)]
    if not columns or len({len(metrics[name]) for name in columns}) != 1:
        return
    rows = zip(*(metrics[name] for name in columns), strict=True)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["epoch", *columns])
    table = [[epoch, *row] for epoch, row in enumerate(rows, 1)]
    writer.writerows(table)
    staged = path.with_name(f".{path.name}.tmp")  # written whole, then renamed: never half a table
    staged.write_text(text.getvalue())
    files.replace(staged, path)
    tensorboard.write_epochs(path.with_name("tensorboard"), columns, table)  # only with distlab[tensorboard]


def _release(run: _Run) -> None:
    """Give back the space kept at the start: record.json and run.json fit even on a full disk."""
    with contextlib.suppress(OSError):
        run.reserve.unlink()


def _write_run_json(run: _Run, outcome: _Outcome, result: RunResult, rank_logs: dict[int, Path],
                    record_error: str | None) -> None:
    request = run.request
    data = {
        "lab": request.lab, "program": str(request.program), "world_size": request.world_size,
        "launcher": request.launcher, "backend": request.backend, "backend_reason": request.backend_reason,
        "threads_per_rank": request.threads,
        "observe_dir": OBSERVE_DIR if request.observe else None,
        "oversubscribed": request.world_size * request.threads > (os.cpu_count() or 1),
        "command": run.command, "returncode": result.returncode, "status": result.status, "reason": result.reason,
        "failure": asdict(result.failure) if result.failure else None, "timed_out": outcome.timed_out,
        "interrupted": result.interrupted, "stopped_by": result.stopped_by,
        "hang_suspected": result.hang_suspected,
        "wall_seconds": outcome.wall, "record_error": record_error, "run_id": run.run_id,
        "launcher_pid": outcome.launcher_pid, "harness_errors": outcome.errors,
        "rank_logs": {rank: str(path.name) for rank, path in rank_logs.items()},
        "placement": {k: str(v) if isinstance(v, Path) else v for k, v in request.placement.items()},
        "max_restarts": request.max_restarts,
        # torchrun keeps one log folder per attempt: attempts after the first are restarts.
        "restarts": max(0, len(list((run.run_dir / "logs").glob("*/attempt_*"))) - 1),
    }
    try:
        write_json(run.run_dir / "run.json", data)
    except OSError as error:
        raise HarnessError(f"run {run.run_dir} ended ({result.reason or result.status}) but run.json could not be "
                           f"written: {error.strerror or error}") from None


def _account_harness_error(run: _Run, outcome: _Outcome, error: Exception) -> RunResult:
    """The harness failed around the run: every process is already stopped (see _launch_and_wait);
    keep the traceback, say so in run.json, and raise one line."""
    details = run.run_dir / "harness-error.txt"
    reason = f"harness error: {type(error).__name__}: {error} (details in {details.name})"
    outcome.errors.append(reason)
    _release(run)
    with contextlib.suppress(OSError):
        write_bytes(details, "".join(traceback.format_exception(error)).encode(errors="replace"))
    result = RunResult(run.run_dir, outcome.returncode if outcome.returncode is not None else -9, "failed",
                       printable(reason), None, None, outcome.wall, outcome.timed_out,
                       outcome.stopped_by is not None,
                       stopped_by=signal_name(outcome.stopped_by) if outcome.stopped_by is not None else None)
    if not os.path.lexists(run.record_path):
        _write_record(run, outcome, _harness_record(run.request, reason))
    with contextlib.suppress(HarnessError):
        _write_run_json(run, outcome, result, {}, None)
    raise HarnessError(f"{printable(str(error))} ({type(error).__name__}); the run is stopped, details in "
                       f"{details}") from error


def _collective_timeout(rank_logs: dict[int, Path], launcher_output: str) -> str | None:
    """A failed run's hang, as the backends' own timeouts reported it; None if none did."""
    waited = [rank for rank, log in sorted(rank_logs.items()) if COLLECTIVE_TIMEOUT.search(_read_end(log))]
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
