"""Joining the process group from any launcher, with nothing listening beyond loopback on one host.

labs/ddp/train.py writes the steps out where a student reads them: torch.cuda.set_device, then
dist.init_process_group(store=loopback_store(...), timeout=...). init_torch_distributed is the same
steps as one call, for the labs that are about something else (check, collectives, benchmarks).
Horovod joins with hvd.init(); horovod_stall_timeouts gives it the twin of the collective timeout.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
from typing import Any

from labs.common.host import free_port
from labs.common.topology import Topology


def loopback_store(topology: Topology, timeout: dt.timedelta) -> Any:
    """The store for dist.init_process_group(store=...): on one host, served from loopback only; else None.

    With None, init_process_group makes its own store from MASTER_ADDR/MASTER_PORT (env://), and
    rank 0's TCPStore then listens on every interface of the host, open to anyone on the network
    while the run lasts. When MASTER_ADDR is a loopback address no other host needs it, so rank 0
    serves the store from a socket bound there. Under torchrun's shared agent store
    (TORCHELASTIC_USE_AGENT_STORE) the agent serves it and every rank is a client: None.

    It also fills in what torch's rendezvous reads and only torchrun sets: RANK, WORLD_SIZE and
    LOCAL_RANK from the launcher's own variables (mpirun, horovodrun, srun), and for a single
    process MASTER_ADDR/MASTER_PORT on a port of its own. Under the other launchers
    MASTER_ADDR/MASTER_PORT must come from outside (distlab run exports them).
    """
    import torch.distributed as dist

    os.environ.setdefault("RANK", str(topology.rank))
    os.environ.setdefault("WORLD_SIZE", str(topology.world_size))
    os.environ.setdefault("LOCAL_RANK", str(topology.local_rank))
    if topology.world_size == 1:
        # A single process still gets a real process group, on a port of its own.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise SystemExit(f"error: {var} is not set; launch with `distlab run` or torchrun, or export it")

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


def init_torch_distributed(backend: str, topology: Topology, timeout_s: float) -> Any:
    """Join a torch.distributed process group from any launcher's environment; returns this rank's device.

    The steps of labs/ddp/train.py in one call: the GPU of this local rank (nccl only), then the
    process group with its collective timeout and the loopback store.
    """
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        if not torch.cuda.is_available():
            raise SystemExit("error: backend nccl needs GPUs and none is visible; use --backend gloo")
        device = torch.device("cuda", topology.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    timeout = dt.timedelta(seconds=timeout_s)
    store = loopback_store(topology, timeout)
    # device_id binds NCCL communicators to this rank's GPU eagerly; Gloo takes none.
    dist.init_process_group(backend, store=store, rank=topology.rank, world_size=topology.world_size,
                            timeout=timeout, device_id=device if backend == "nccl" else None)
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
