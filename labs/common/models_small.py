"""The small model and data the parallelism labs share (fsdp, tensor_parallel, pipeline).

A stack of transformer feed-forward blocks (LayerNorm, up-projection, GELU, down-projection,
residual) and a classification head: the part of a transformer where most of the parameters are,
small enough to train in seconds on a CPU. The data is synthetic and decided by the step number
alone, so every world size, every strategy and a single-process oracle see the same global batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DATA_SEED = 4321  # fixed, like a real data set: the teacher and the inputs do not change with --seed


class MLPBlock(nn.Module):
    """x + down(gelu(up(norm(x)))): a transformer's feed-forward block (Megatron's MLP)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class BlockStack(nn.Module):
    """`layers` MLP blocks and a linear classification head."""

    def __init__(self, dim: int, hidden: int, layers: int, classes: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MLPBlock(dim, hidden) for _ in range(layers))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def synthetic_batch(step: int, global_batch: int, dim: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `step`: inputs and labels, the same on every rank and at every world size.

    The label is the argmax of a fixed random linear teacher, so there is something to learn and
    the loss goes down. Each rank takes its own slice of the global batch.
    """
    teacher = torch.randn(dim, classes, generator=torch.Generator().manual_seed(DATA_SEED))
    inputs = torch.randn(global_batch, dim, generator=torch.Generator().manual_seed(DATA_SEED + 1 + step))
    return inputs, (inputs @ teacher).argmax(dim=1)


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes of the part of a tensor this rank holds: a DTensor's local shard, a plain tensor whole."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()
