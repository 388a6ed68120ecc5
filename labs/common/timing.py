"""Clocks that time the device's work, not the queue of it: one rule for every lab; the training
labs' clock and the history of their epochs, reported in the record.

CUDA runs kernels asynchronously: a call returns as soon as the kernel is queued, so
time.perf_counter() around GPU work measures how fast the CPU enqueues it (a ResNet-18 step is
queued in a few milliseconds whatever the GPU takes). Each reading of the clock on a CUDA device
therefore waits for the device's queue first. That wait empties the queue, so a lab reads the
clock where a step or a phase ends, never inside a step it wants to run at full speed. On a CPU
every operation has finished when it returns: the readings are plain perf_counter().
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

import torch


def synchronize(device: torch.device) -> None:
    """Wait until every kernel queued on `device` has finished (a no-op on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device) -> float:
    """perf_counter() once the device has finished what was queued on it: a reading of finished work."""
    synchronize(device)
    return time.perf_counter()


TIMING_WARMUP_STEPS = 3  # first steps of a run left out of img_per_sec: allocator, cuDNN autotuning, workers


class TrainClock:
    """Training-only throughput: images and seconds of training steps.

    Leaves out the first TIMING_WARMUP_STEPS steps of the run (start-up) and everything between
    epochs (evaluation, checkpoints). On a GPU it synchronises only where it reads the clock,
    so it does not stall the queue of kernels at every step.
    """

    def __init__(self, device: torch.device, skip: int = TIMING_WARMUP_STEPS) -> None:
        self.device, self.skip = device, skip
        self.steps = self.images = 0
        self.seconds = 0.0
        self.mark: float | None = None
        self.epoch_start = 0.0

    def _now(self) -> float:
        return now(self.device)

    def start_epoch(self) -> None:
        self.epoch_start = self._now()
        self.mark = self.epoch_start if self.steps >= self.skip else None

    def step(self, images: int) -> None:
        self.steps += 1
        if self.steps == self.skip:
            self.mark = self._now()
        elif self.steps > self.skip:
            self.images += images

    def end_epoch(self) -> float:
        """Seconds the epoch's training took, start-up included."""
        now = self._now()
        if self.mark is not None:
            self.seconds += now - self.mark
        return now - self.epoch_start

    @property
    def img_per_sec(self) -> float | None:
        return self.images / self.seconds if self.seconds > 0 else None


@dataclass
class History:
    """Per-epoch results; kept in the checkpoint, so a resumed run reports the whole run."""

    train_loss: list[float]
    test_accuracy: list[float]
    epoch_seconds: list[float]
    elapsed_seconds: float = 0.0  # training + evaluation, summed over runs
    time_to_target_seconds: float | None = None

    @classmethod
    def empty(cls) -> History:
        return cls([], [], [])

    def add(self, loss: float, accuracy: float, epoch_seconds: float, elapsed: float,
            target: float | None) -> None:
        self.train_loss.append(loss)
        self.test_accuracy.append(accuracy)
        self.epoch_seconds.append(epoch_seconds)
        self.elapsed_seconds += elapsed
        if target is not None and accuracy >= target and self.time_to_target_seconds is None:
            self.time_to_target_seconds = self.elapsed_seconds


def report(record: Any, history: History, clock: TrainClock, args: argparse.Namespace, lr: float,
           global_batch: int, img_per_sec: float | None) -> None:
    """The metrics every training lab writes in its record."""
    record.metrics.update({
        "img_per_sec": img_per_sec,
        "epoch_seconds": history.epoch_seconds,
        "train_loss": history.train_loss,
        "test_accuracy": history.test_accuracy,
        "final_accuracy": history.test_accuracy[-1] if history.test_accuracy else None,
        "target_accuracy": args.target_accuracy,
        "time_to_target_seconds": history.time_to_target_seconds,
        "elapsed_seconds": history.elapsed_seconds,
        "timed_steps": max(0, clock.steps - clock.skip),
        "global_batch": global_batch,
        "peak_lr": lr,
    })


def epoch_line(epoch: int, args: argparse.Namespace, history: History) -> str:
    return (f"epoch {epoch + 1}/{args.epochs}: loss {history.train_loss[-1]:.4f}  "
            f"test accuracy {history.test_accuracy[-1]:.4f}  {history.epoch_seconds[-1]:.1f} s")
