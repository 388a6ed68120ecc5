"""The labs the harness knows, one row each: the catalog. The harness meets a lab only through its
program path, the argv of the lab contract and the record it writes (labs/README.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.usage import UsageError, did_you_mean
from labs.common.backends import ALL_BACKENDS, TORCH_BACKENDS
from labs.common.host import REPO


@dataclass(frozen=True)
class Lab:
    name: str
    program: str  # relative to the repository root
    backends: tuple[str, ...]
    default_backend: str
    max_world_size: int | None = None  # None: as many as the launcher can start
    summary: str = ""
    gpu_backend: str | None = None  # the backend it uses on GPUs; None: not a GPU lab
    # A data-parallel training lab: the grade checks its shards, replicas, checkpoints and steps from
    # what the observer saw on every rank, and measures its final accuracy itself (harness/observe/observations.py).
    data_parallel: bool = False

    @property
    def path(self) -> Path:
        return REPO / self.program

    def runs_at(self, world_size: int) -> bool:
        """Whether the lab runs at this world size (a single-device lab runs at 1 only)."""
        return self.max_world_size is None or world_size <= self.max_world_size

    def check_backend(self, backend: str) -> None:
        """UsageError unless the lab uses `backend`: the one rule for run, grade and template."""
        if backend not in self.backends:
            raise UsageError(f"lab {self.name} does not use backend {backend!r}; choose one of: "
                             f"{', '.join(self.backends)}")


LABS = {lab.name: lab for lab in [
    Lab("check", "labs/check/check.py", ALL_BACKENDS, "gloo",
        summary="connectivity check: every rank all-reduces a known tensor", gpu_backend="nccl"),
    Lab("baseline", "labs/baseline/train.py", ("none",), "none", max_world_size=1,
        summary="ResNet-18 on CIFAR-10, one device", data_parallel=True),
    Lab("ddp", "labs/ddp/train.py", TORCH_BACKENDS, "gloo",
        summary="the baseline with PyTorch DistributedDataParallel", gpu_backend="nccl", data_parallel=True),
    Lab("horovod", "labs/horovod/train.py", ("horovod",), "horovod",
        summary="the baseline with Horovod's DistributedOptimizer", gpu_backend="horovod", data_parallel=True),
    Lab("collectives", "labs/collectives/collectives.py", ALL_BACKENDS, "gloo",
        summary="broadcast, reduce, all-reduce, all-gather, reduce-scatter, barrier, all-to-all, send/recv",
        gpu_backend="nccl"),
    Lab("allreduce_bench", "labs/allreduce_bench/allreduce_bench.py", ALL_BACKENDS, "gloo",
        summary="all-reduce bus bandwidth against message size (nccl-tests style)", gpu_backend="nccl"),
    Lab("scaling", "labs/scaling/scaling.py", TORCH_BACKENDS + ("horovod",), "gloo",
        summary="synthetic-data training steps for strong and weak scaling", gpu_backend="nccl"),
    Lab("fsdp", "labs/fsdp/train.py", TORCH_BACKENDS, "gloo",
        summary="DDP, ZeRO-1 and FSDP2 on one model: memory per rank against the formula, sharded checkpoints",
        gpu_backend="nccl"),
    Lab("deepspeed", "labs/deepspeed/train.py", TORCH_BACKENDS, "gloo",
        summary="DeepSpeed ZeRO stages 1-3 on the fsdp lab's model: the single-process steps, memory per rank",
        gpu_backend="nccl"),
    Lab("tensor_parallel", "labs/tensor_parallel/tensor_parallel.py", TORCH_BACKENDS, "gloo",
        summary="a transformer MLP block split Megatron-style, with DTensor and by hand", gpu_backend="nccl"),
    Lab("pipeline", "labs/pipeline/pipeline.py", TORCH_BACKENDS, "gloo",
        summary="GPipe over ranks with micro-batches: exact against one process, the bubble measured",
        gpu_backend="nccl"),
]}


def find_lab(name: str) -> Lab:
    """The catalog's lab of that name, else UsageError listing them: the one rule for every command."""
    if name not in LABS:
        raise UsageError(f"unknown lab {name!r}{did_you_mean(name, LABS)}; choose one of: {', '.join(LABS)}")
    return LABS[name]


# Which launchers can start ranks that use a backend. torch.distributed needs only
# MASTER_ADDR/MASTER_PORT besides rank and size, so mpirun can start it too.
LAUNCHERS_FOR_BACKEND = {
    "gloo": ("torchrun", "mpirun", "python"),
    "nccl": ("torchrun", "mpirun", "python"),
    "mpi": ("mpirun", "python"),
    "horovod": ("horovodrun", "mpirun", "python"),
    "none": ("python",),
}
def backend_for(lab: Lab, world_size: int, gpus_visible: int) -> tuple[str, str]:
    """The backend a run uses when none is asked for, and why: the one rule for `distlab run`, grade,
    scale and `make lab-X GPUS=N`. The GPU backend whenever every rank can have a GPU of its own,
    the lab's CPU backend otherwise: a DDP run on a GPU host must not train on the CPUs unasked."""
    if lab.gpu_backend and gpus_visible >= world_size:
        return lab.gpu_backend, f"{gpus_visible} GPU(s) visible for {world_size} rank(s)"
    if lab.gpu_backend and gpus_visible:
        return lab.default_backend, f"only {gpus_visible} GPU(s) visible for {world_size} rank(s): on the CPUs"
    return lab.default_backend, "no GPU visible" if lab.gpu_backend else f"{lab.name} runs on {lab.default_backend}"


DEFAULT_LAUNCHER = {"gloo": "torchrun", "nccl": "torchrun", "mpi": "mpirun", "horovod": "horovodrun", "none": "python"}
