"""Clocks that time the device's work, not the queue of it: one rule for every lab.

CUDA runs kernels asynchronously: a call returns as soon as the kernel is queued, so
time.perf_counter() around GPU work measures how fast the CPU enqueues it (a ResNet-18 step is
queued in a few milliseconds whatever the GPU takes). Each reading of the clock on a CUDA device
therefore waits for the device's queue first. That wait empties the queue, so a lab reads the
clock where a step or a phase ends, never inside a step it wants to run at full speed. On a CPU
every operation has finished when it returns: the readings are plain perf_counter().
"""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device) -> None:
    """Wait until every kernel queued on `device` has finished (a no-op on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device) -> float:
    """perf_counter() once the device has finished what was queued on it: a reading of finished work."""
    synchronize(device)
    return time.perf_counter()
