"""The lab contract: what every lab shares with the harness (see labs/README.md).

A lab is launched with argv only. It learns rank, local rank and world size from whichever
launcher started it (torchrun, horovodrun, mpirun, srun, or none), prints for people on
rank 0 only, and rank 0 writes one JSON result record to the path given by --record.
The harness reads that record and nothing else of a lab.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import ipaddress
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

SCHEMA = "distlab-record"
SCHEMA_VERSION = 1

# How each launcher tells a process who it is: (launcher, variable that marks it,
# rank, local rank, world size, local world size). First match wins: horovodrun --mpi
# sets both the Horovod and the Open MPI variables, torchrun only its own.
LAUNCHER_ENV = [
    ("torchrun", "TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
    ("horovodrun", "HOROVOD_RANK", "HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_SIZE"),
    ("mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpirun", "PMI_RANK", "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE", "MPI_LOCALNRANKS"),  # MPICH
    ("srun", "SLURM_PROCID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE"),
]


@dataclass(frozen=True)
class Topology:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    launcher: str = "none"
    hostname: str = field(default_factory=socket.gethostname)

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def detect_topology(env: dict[str, str] | None = None) -> Topology:
    env = dict(os.environ) if env is None else env
    for launcher, marker, rank, local_rank, size, local_size in LAUNCHER_ENV:
        if marker in env:
            world_size = int(env[size])
            return Topology(
                rank=int(env[rank]),
                local_rank=int(env.get(local_rank, 0)),
                world_size=world_size,
                local_world_size=int(env.get(local_size, "").split("(")[0] or world_size),
                launcher=launcher,
            )
    return Topology()


def say(topology: Topology, *parts: Any) -> None:
    """Print for people: rank 0 only, flushed at once so launchers do not interleave lines."""
    if topology.is_rank0:
        print(*parts, flush=True)


def add_contract_args(parser: argparse.ArgumentParser, backends: list[str], default_backend: str) -> None:
    """The flags every lab accepts, so the harness can drive any lab the same way."""
    group = parser.add_argument_group("lab contract")
    group.add_argument("--backend", choices=backends, default=default_backend, help="communication backend")
    group.add_argument("--record", type=Path, help="rank 0 writes the JSON result record here")
    group.add_argument("--smoke", action="store_true", help="seconds-long run for tests")
    group.add_argument("--seed", type=int, default=0, help="random seed")
    group.add_argument("--timeout", type=float, default=120.0,
                       help="collective timeout in seconds: a hung peer is reported by the backend")


def init_torch_distributed(backend: str, topology: Topology, timeout_s: float) -> Any:
    """Join a torch.distributed process group from any launcher's environment.

    torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Under mpirun, horovodrun
    or srun only MASTER_ADDR/MASTER_PORT must come from outside (distlab run passes them);
    rank and size come from the launcher's own variables.
    """
    import torch
    import torch.distributed as dist

    os.environ.setdefault("RANK", str(topology.rank))
    os.environ.setdefault("WORLD_SIZE", str(topology.world_size))
    os.environ.setdefault("LOCAL_RANK", str(topology.local_rank))
    if topology.world_size == 1:
        # A single process still gets a real process group, on a port of its own.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise SystemExit(f"error: {var} is not set; launch with `distlab run` or torchrun, or export it")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise SystemExit("error: backend nccl needs GPUs and none is visible; use --backend gloo")
        device = torch.device("cuda", topology.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    timeout = dt.timedelta(seconds=timeout_s)
    store = _loopback_store(topology, timeout)
    # device_id binds NCCL communicators to this rank's GPU eagerly; Gloo takes none.
    dist.init_process_group(backend, timeout=timeout, device_id=device if backend == "nccl" else None,
                            **({"store": store, "rank": topology.rank, "world_size": topology.world_size}
                               if store else {}))
    return device


def horovod_stall_timeouts(timeout_s: float) -> None:
    """Horovod's twin of the collective timeout, set before hvd.init() reads it.

    A rank that stops submitting tensors stalls the others. Horovod's stall inspector then names
    the missing ranks and tensors (after half of --timeout) and shuts the job down (at --timeout),
    so the run ends with that report instead of hanging until the harness's watchdog. A value the
    user exported wins. Measured here: it works under the MPI controller (mpirun); under
    horovodrun --gloo, Horovod 0.28.1 never runs the check, and the watchdog ends the hang.
    """
    os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", str(max(1, int(timeout_s / 2))))
    os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(max(1, int(timeout_s))))


def _loopback_store(topology: Topology, timeout: dt.timedelta) -> Any:
    """On one node, the process group's key-value store, listening on loopback only; else None.

    With None, init_process_group makes its own store from MASTER_ADDR/MASTER_PORT (env://),
    and rank 0's TCPStore then listens on every interface of the host, open to anyone on the
    network while the run lasts. When MASTER_ADDR is a loopback address no other host needs it,
    so rank 0 serves the store from a socket bound there. Under torchrun's shared agent store
    (TORCHELASTIC_USE_AGENT_STORE) the agent serves it and every rank is a client: None.
    """
    import torch.distributed as dist

    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" or not _is_loopback(address):
        return None
    listen_fd = None
    if topology.rank == 0:
        # detach(): the store owns the descriptor from here, so Python never closes it.
        listen_fd = socket.create_server((address, port), backlog=max(128, topology.world_size)).detach()
    return dist.TCPStore(address, port, topology.world_size, is_master=topology.rank == 0, timeout=timeout,
                         master_listen_fd=listen_fd)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False  # unresolvable here: let torch report it, naming the address


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _version(dist_name: str) -> str | None:
    try:
        return metadata.version(dist_name)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    if os.environ.get("DISTLAB_GIT_COMMIT"):
        return os.environ["DISTLAB_GIT_COMMIT"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
        if out.returncode == 0:
            return out.stdout.strip()
    return None


def _mpi_library() -> str | None:
    if "mpi4py" not in sys.modules:  # importing mpi4py initialises MPI; only report it if the lab did
        return None
    from mpi4py import MPI

    return MPI.Get_library_version().splitlines()[0].strip().rstrip("\x00")  # Open MPI ends it with a NUL


def _gpus() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"count": 0, "models": [], "driver": None}
    if not torch.cuda.is_available():
        return {"count": 0, "models": [], "driver": None}
    driver = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        driver = out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout else None
    count = torch.cuda.device_count()
    return {"count": count, "models": [torch.cuda.get_device_name(i) for i in range(count)], "driver": driver}


def provenance(topology: Topology, backend: str) -> dict[str, Any]:
    """Everything a number depends on, so a result can be traced and compared."""
    nccl = None
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
    threads = None
    with contextlib.suppress(ImportError):
        import torch

        threads = torch.get_num_threads()
    return {
        "versions": {
            "python": platform.python_version(),
            "torch": _version("torch"),
            "torchvision": _version("torchvision"),
            "horovod": _version("horovod"),
            "mpi4py": _version("mpi4py"),
            "mpi": _mpi_library(),
            "nccl": nccl,
        },
        "hardware": {"cpu_model": _cpu_model(), "cores": os.cpu_count(), "gpus": _gpus()},
        "hostname": topology.hostname,
        "world_size": topology.world_size,
        "threads_per_rank": threads,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "backend": backend,
        "launcher": topology.launcher,
        "git_commit": _git_commit(),
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_json_atomic(path: Path, data: Any) -> None:
    """Write to a temporary file in the same folder, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=False)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass
class Record:
    """The one machine-readable result of a lab run. Rank 0 writes it."""

    lab: str
    config: dict[str, Any]
    topology: Topology
    backend: str
    status: str = "ok"
    reason: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    start: str = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc).isoformat())

    def check(self, name: str, passed: bool, **detail: Any) -> bool:
        """A correctness check; any failed check fails the run."""
        self.checks[name] = {"passed": bool(passed), **detail}
        if not passed and self.status == "ok":
            self.status, self.reason = "failed", f"check {name} failed: {detail}"
        return bool(passed)

    def to_dict(self) -> dict[str, Any]:
        return _jsonable({
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "lab": self.lab,
            "status": self.status,
            "reason": self.reason,
            "metrics": self.metrics,
            "checks": self.checks,
            "config": self.config,
            "ranks": self.ranks,
            "provenance": {**provenance(self.topology, self.backend), "start": self.start,
                           "end": dt.datetime.now(dt.timezone.utc).isoformat(),
                           "argv": sys.argv},
        })


@contextlib.contextmanager
def lab_run(lab: str, args: argparse.Namespace, topology: Topology) -> Iterator[Record]:
    """Run a lab's body; rank 0 writes the record whatever happens, then the exit code says it.

    Exit codes: 0 ok, 1 a correctness check failed, 2 bad input (SystemExit), else the error.
    """
    record = Record(lab=lab, config=vars(args).copy(), topology=topology, backend=args.backend)
    exit_code = 0
    try:
        yield record
    except SystemExit as stop:
        if stop.code not in (0, None):
            record.status, record.reason = "failed", str(stop.code)
            exit_code = stop.code if isinstance(stop.code, int) else 2
            if not isinstance(stop.code, int):
                print(stop.code, file=sys.stderr, flush=True)
    except BaseException as error:  # the record must say why, then the error propagates
        record.status, record.reason = "failed", f"{type(error).__name__}: {error}"
        if topology.is_rank0 and args.record:
            write_json_atomic(args.record, record.to_dict())
        traceback.print_exc()
        raise
    if record.status != "ok" and exit_code == 0:
        exit_code = 1
    if topology.is_rank0 and args.record:
        write_json_atomic(args.record, record.to_dict())
    if exit_code:
        say(topology, f"{lab}: FAILED: {record.reason}")
        sys.exit(exit_code)
