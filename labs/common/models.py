"""The training labs' model on its device: the ResNet-18, the device a rank drives, the images moved
there and normalised, the precision (autocast), and counting the correct answers of a test set."""

from __future__ import annotations

import argparse
import contextlib
import functools
from dataclasses import dataclass

import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader

from labs.common.data import CIFAR10_MEAN, CIFAR10_STD, CLASSES
from labs.common.host import rank_device


@functools.cache
def _normalisation(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # Made once per device: creating them at every batch would copy from host memory synchronously
    # and make the CPU wait for the GPU's queue each step.
    mean = torch.tensor(CIFAR10_MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(CIFAR10_STD, device=device).view(1, 3, 1, 1) * 255
    return mean, std


def to_device(images: torch.Tensor, labels: torch.Tensor, device: torch.device,
              channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images to normalised floats on the device (converting there: 4x less to copy)."""
    images = images.to(device, non_blocking=True)
    mean, std = _normalisation(device)
    images = (images.float() - mean) / std
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, labels.to(device, non_blocking=True)


def build_model(stem: str) -> nn.Module:
    """torchvision's ResNet-18 for 10 classes, with the CIFAR stem or ImageNet's standard one."""
    model = torchvision.models.resnet18(num_classes=CLASSES)
    if stem == "cifar":
        # The standard stem (7x7 conv stride 2, then max-pool) shrinks a 32x32 image to 8x8 before the
        # first block: cheap, but it throws away most of the detail. A 3x3 conv with stride 1 and no
        # pool keeps 32x32, at about 16x the compute.
        model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")  # as torchvision does
        model.maxpool = nn.Identity()
    return model


def model_tag(args: argparse.Namespace) -> str:
    """What a checkpoint must match to be loaded into this run's model."""
    return f"resnet18-{args.stem}-stem-{CLASSES}-classes"


def pick_device(args: argparse.Namespace, local_rank: int = 0) -> torch.device:
    """This process's device: GPU local_rank with --device cuda (the distributed labs then make it the
    current device themselves, torch.cuda.set_device), else the CPU. More ranks than GPUs, asked for
    with --device cuda, share them (host.rank_device): Gloo carries CUDA tensors between ranks on one GPU."""
    if args.device == "cuda":
        device = torch.device(rank_device("cuda", local_rank, 1, torch.cuda.device_count()))
        # cuDNN picks the fastest convolution algorithm for these fixed shapes on the first steps.
        torch.backends.cudnn.benchmark = True
        return device
    return torch.device("cpu")


def set_bn_eval(model: nn.Module, bn_eval: bool) -> None:
    """Put BatchNorm layers back in eval mode after model.train() when --bn-eval asks for it."""
    if bn_eval:
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()


@dataclass
class Precision:
    """Autocast and, for fp16 only, gradient scaling (bf16 has fp32's range and needs none)."""

    device: torch.device
    dtype: torch.dtype | None  # None: plain fp32
    scaler: torch.amp.GradScaler

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None)


def make_precision(args: argparse.Namespace, device: torch.device) -> Precision:
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    return Precision(device, dtype, torch.amp.GradScaler(device.type, enabled=dtype == torch.float16))


@torch.no_grad()
def count_correct(model: nn.Module, loader: DataLoader, precision: Precision, args: argparse.Namespace,
                  device: torch.device) -> torch.Tensor:
    """[correct, total] on this process's share of the test set, as a float64 tensor on the device."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for images, labels, _ in loader:
        images, labels = to_device(images, labels, device, args.channels_last)
        with precision.autocast():
            predicted = model(images).argmax(dim=1)
        counts[0] += (predicted == labels).sum()
        counts[1] += len(labels)
    return counts
