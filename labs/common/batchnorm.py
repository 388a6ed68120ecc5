"""BatchNorm over the global batch, for CPUs: what torch's SyncBatchNorm does, which refuses CPU modules.

With a small batch per rank, each rank's BatchNorm normalises with the mean and variance of its
own few images: noisy statistics, and a model that learns less than the same global batch on one
process (labs/TRAINING.md measures it). The fix is to compute the statistics over the global
batch: every rank adds up its sum, sum of squares and count, one all-reduce per BatchNorm layer
per forward, and normalises with the totals. The all-reduce is differentiable (torch.distributed.nn's
by default, Horovod's hvd.allreduce in the Horovod lab), so backward sends the gradients of the
statistics through an all-reduce too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.distributed.nn.functional as dist_nn
from torch import nn


class GlobalBatchNorm2d(nn.BatchNorm2d):
    """nn.BatchNorm2d whose training statistics are the global batch's (eval is unchanged).
    `all_reduce`: a differentiable sum over ranks (default: torch.distributed's process group)."""

    all_reduce: Callable[[torch.Tensor], torch.Tensor] = staticmethod(dist_nn.all_reduce)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(images)
        channels = images.shape[1]
        count = images.numel() // channels
        local = torch.cat([images.sum((0, 2, 3)), (images * images).sum((0, 2, 3)),
                           images.new_tensor([float(count)])])
        total = self.all_reduce(local)  # sums over ranks; differentiable
        n = total[-1]
        mean = total[:channels] / n
        var = total[channels:2 * channels] / n - mean * mean  # biased, as BatchNorm normalises
        with torch.no_grad():  # running statistics as nn.BatchNorm2d keeps them (unbiased variance)
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var * n / (n - 1), self.momentum)
            self.num_batches_tracked += 1
        shape = (1, channels, 1, 1)
        normalised = (images - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        return normalised * self.weight.view(shape) + self.bias.view(shape)


def replace_batchnorm(module: nn.Module, make: Callable[[nn.BatchNorm2d], nn.Module]) -> nn.Module:
    """Every nn.BatchNorm2d of `module` replaced by make(it), which gets its parameters and buffers."""
    if isinstance(module, nn.BatchNorm2d) and not isinstance(module, GlobalBatchNorm2d):
        replacement = make(module)
        replacement.load_state_dict(module.state_dict())
        return replacement
    for name, child in module.named_children():
        setattr(module, name, replace_batchnorm(child, make))
    return module


def convert_to_global_batchnorm(module: nn.Module,
                                all_reduce: Callable[[torch.Tensor, str], torch.Tensor] | None = None) -> nn.Module:
    """The CPU counterpart of nn.SyncBatchNorm.convert_sync_batchnorm: every nn.BatchNorm2d becomes a
    GlobalBatchNorm2d, summing over ranks with all_reduce(tensor, name) (default: torch.distributed,
    unnamed). Horovod matches collectives across ranks by name: the layer's own name, the same every
    step, lets its response cache skip the negotiation (unnamed, each call gets a new name)."""
    converted = replace_batchnorm(module, lambda bn: GlobalBatchNorm2d(bn.num_features, bn.eps, bn.momentum,
                                                                       bn.affine, bn.track_running_stats))
    if all_reduce is not None:
        for name, layer in converted.named_modules():
            if isinstance(layer, GlobalBatchNorm2d):
                layer.all_reduce = functools.partial(all_reduce, name=f"batchnorm.{name}")
    return converted
