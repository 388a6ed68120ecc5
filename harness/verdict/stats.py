"""Small statistics for repeated measurements: mean and a 95% confidence interval, speedup and
efficiency, and the Amdahl fit of a scaling study.

Throughput on shared machines is noisy, so a single sample proves little: grading and
scaling compare intervals from repeats.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# Two-sided 95% Student t quantiles by degrees of freedom; beyond 30 the normal 1.96 is close.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042}


def t95(dof: int) -> float:
    if dof < 1:
        return math.inf
    known = [d for d in T95 if d <= dof]
    return T95[max(known)] if dof <= 30 else 1.96


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def __str__(self) -> str:
        if self.n < 2:
            return f"{self.mean:.4g} (1 sample)"
        return f"{self.mean:.4g} ± {self.half_width:.2g}"


def mean_ci(samples: list[float]) -> Interval:
    """Mean and 95% CI (Student t). One sample: the interval is that sample alone."""
    if not samples:
        raise ValueError("no samples")
    mean = statistics.fmean(samples)
    if len(samples) < 2:
        return Interval(mean, mean, mean, 1)
    half = t95(len(samples) - 1) * statistics.stdev(samples) / math.sqrt(len(samples))
    return Interval(mean, mean - half, mean + half, len(samples))


def spread(values: list[float]) -> float:
    """The standard deviation of repeated measurements; 0 for one (the caller decides what one run
    without a spread measured means)."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def speedup(throughput: float, base_throughput: float) -> float:
    return throughput / base_throughput


def efficiency(throughput: float, world_size: int, base_throughput: float, base_world_size: int = 1) -> float:
    """Throughput per rank against the baseline's: T(n) / (n T(1)) when the baseline is one rank."""
    return (throughput / world_size) / (base_throughput / base_world_size)


def amdahl_speedup(world_size: float, serial_fraction: float) -> float:
    """Amdahl's law: a fraction s of the work does not parallelise, so n ranks give 1 / (s + (1 - s) / n)."""
    return 1.0 / (serial_fraction + (1.0 - serial_fraction) / world_size)


def fit_amdahl(world_sizes: list[int], speedups: list[float], base_world_size: int = 1) -> float:
    """The serial fraction in [0, 1] whose Amdahl curve is closest to the measured speedups (least squares).

    Speedups are relative to base_world_size, so the curve is too: A(n) / A(base). A grid finds the
    basin, golden-section search then narrows it to about 1e-9.
    """
    if len(world_sizes) != len(speedups) or not world_sizes:
        raise ValueError("need one speedup per world size")

    def error(s: float) -> float:
        base = amdahl_speedup(base_world_size, s)
        pairs = zip(world_sizes, speedups, strict=True)
        return sum((measured - amdahl_speedup(n, s) / base) ** 2 for n, measured in pairs)

    step = 1e-3
    best = min((i * step for i in range(int(1 / step) + 1)), key=error)
    low, high = max(0.0, best - step), min(1.0, best + step)
    ratio = (5 ** 0.5 - 1) / 2
    while high - low > 1e-10:
        left, right = high - ratio * (high - low), low + ratio * (high - low)
        if error(left) <= error(right):
            high = right
        else:
            low = left
    return (low + high) / 2


def ratio_interval(ratios: list[float]) -> Interval:
    """The geometric mean of ratios and its 95% interval (Student t over their logarithms: a ratio
    is as far off at half as at double). Fewer than two ratios: no spread is known, so the interval
    is everything (0, inf), and nothing can be concluded from it."""
    if not ratios or any(r <= 0 for r in ratios):
        raise ValueError("ratios must be positive")
    logs = [math.log(r) for r in ratios]
    centre = statistics.fmean(logs)
    if len(logs) < 2:
        return Interval(math.exp(centre), 0.0, math.inf, len(logs))
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Interval(math.exp(centre), math.exp(centre - half), math.exp(centre + half), len(logs))


def ratio_of_intervals(top: list[float], bottom: list[float]) -> Interval:
    """The ratio of two geometric means and its 95% interval (Welch over the logarithms, the fewer
    runs' degrees of freedom): scaling efficiency from the runs at two world sizes."""
    if not top or not bottom or any(r <= 0 for r in [*top, *bottom]):
        raise ValueError("values must be positive")
    a, b = [math.log(v) for v in top], [math.log(v) for v in bottom]
    centre = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return Interval(math.exp(centre), 0.0, math.inf, min(len(a), len(b)))
    spread = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    half = t95(min(len(a), len(b)) - 1) * spread
    return Interval(math.exp(centre), math.exp(centre - half), math.exp(centre + half), min(len(a), len(b)))
