"""The labs the harness knows: one row each. The harness meets a lab only through its
program path, the argv of the lab contract and the record it writes (labs/README.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TORCH_BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class Lab:
    name: str
    program: str  # relative to the repository root
    backends: tuple[str, ...]
    default_backend: str
    max_world_size: int | None = None  # None: as many as the launcher can start
    summary: str = ""

    @property
    def path(self) -> Path:
        return REPO / self.program


LABS = {lab.name: lab for lab in [
    Lab("check", "labs/check/check.py", ("gloo", "nccl", "mpi", "horovod"), "gloo",
        summary="connectivity check: every rank all-reduces a known tensor"),
    Lab("baseline", "labs/baseline/train.py", ("none",), "none", max_world_size=1,
        summary="ResNet-18 on CIFAR-10, one device"),
    Lab("ddp", "labs/ddp/train.py", TORCH_BACKENDS, "gloo",
        summary="the baseline with PyTorch DistributedDataParallel"),
    Lab("horovod", "labs/horovod/train.py", ("horovod",), "horovod",
        summary="the baseline with Horovod's DistributedOptimizer"),
    Lab("collectives", "labs/collectives/collectives.py", ("gloo", "nccl", "mpi", "horovod"), "gloo",
        summary="broadcast, reduce, all-reduce, all-gather, reduce-scatter, barrier, all-to-all, send/recv"),
    Lab("allreduce_bench", "labs/allreduce_bench/allreduce_bench.py", ("gloo", "nccl", "mpi", "horovod"), "gloo",
        summary="all-reduce bus bandwidth against message size (nccl-tests style)"),
    Lab("scaling", "labs/scaling/scaling.py", TORCH_BACKENDS + ("horovod",), "gloo",
        summary="synthetic-data training steps for strong and weak scaling"),
]}

# Which launchers can start ranks that use a backend. torch.distributed needs only
# MASTER_ADDR/MASTER_PORT besides rank and size, so mpirun can start it too.
LAUNCHERS_FOR_BACKEND = {
    "gloo": ("torchrun", "mpirun", "python"),
    "nccl": ("torchrun", "mpirun", "python"),
    "mpi": ("mpirun", "python"),
    "horovod": ("horovodrun", "mpirun", "python"),
    "none": ("python",),
}
DEFAULT_LAUNCHER = {"gloo": "torchrun", "nccl": "torchrun", "mpi": "mpirun", "horovod": "horovodrun", "none": "python"}
