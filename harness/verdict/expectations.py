"""What a profile expects of a lab's runs: its rows (LabExpectation), their metric bands (Band), and
the profile itself (Profile), where its numbers were measured and which hosts it fits. profiles.py
reads and checks them from a profile's TOML."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Band:
    metric: str
    min: float | None = None
    max: float | None = None
    value: float | None = None
    tolerance: float | None = None
    expected: dict[int, float] = field(default_factory=dict)  # per world size
    at_least_fraction: float | None = None
    # Throughput as a ratio to the lab's reference (a plain loop) measured in the same grade run,
    # on the same machine at the same threads: this is what carries from one CPU to another.
    at_least_ratio: dict[int, float] = field(default_factory=dict)  # per world size

    def describe(self, world_size: int) -> str:
        if self.at_least_ratio:
            if world_size not in self.at_least_ratio:
                return "n/a"
            return f">= {self.at_least_ratio[world_size]:g} x reference"
        if self.expected:
            if world_size not in self.expected:
                return "n/a"
            return f">= {self.at_least_fraction:g} x {self.expected[world_size]:.4g}"
        if self.value is not None:
            return f"{self.value:.4g} ± {self.tolerance:.4g}"
        low = "-inf" if self.min is None else f"{self.min:.4g}"
        high = "inf" if self.max is None else f"{self.max:.4g}"
        return f"[{low}, {high}]"


@dataclass(frozen=True)
class LabExpectation:
    lab: str  # the profile's name for this cell row: the catalog lab, or a variant of it ("ddp-sync-bn")
    world_sizes: tuple[int, ...]
    args: tuple[str, ...] = ()
    world_size_args: dict[int, tuple[str, ...]] = field(default_factory=dict)  # added at that world size
    backend: str | None = None
    launcher: str | None = None
    time_budget_s: float = 600.0
    required_checks: tuple[str, ...] = ()
    accuracy_delta: float | None = None
    accuracy_metric: str = "final_accuracy"
    efficiency_min: dict[int, float] = field(default_factory=dict)
    throughput_metric: str = "img_per_sec"
    bands: tuple[Band, ...] = ()
    reference: str | None = None  # the plain loop its throughput is a ratio to (harness/verdict/references.py)
    # True where the reference is the same work as the row (the course's lab beside a student's
    # program, against_course_lab): other work slows both alike, and the interval alone decides.
    reference_alike: bool = False
    program_lab: str = ""  # the catalog lab it runs (`lab = "ddp"`); the row's own name when not given
    # The row whose world-size-1 runs stand for this row's (a data-parallel lab's: the single-device
    # baseline): its accuracy and scaling efficiency are compared with them. Default: its own.
    single_device: str | None = None
    # A row that shows an effect the course teaches (e.g. BatchNorm over small per-rank batches): its
    # bands and comparisons across world sizes are reported with this explanation instead of graded
    # (being worse is its point); its run, checks, observations, claims and time budget are graded.
    lesson: str = ""
    # How each run of the row is made (harness/grading/cells.py): "one-host" (a run on this host),
    # "two-hosts" (its ranks split over two network-namespace hosts that share the run's folder) or
    # "resume" (stopped after stop_after_epochs training epochs, restarted from its checkpoint by
    # torchrun, and compared with an uninterrupted run).
    cell: str = "one-host"
    stop_after_epochs: int = 1

    @property
    def catalog_lab(self) -> str:
        return self.program_lab or self.lab

    def args_at(self, world_size: int) -> list[str]:
        return [*self.args, *self.world_size_args.get(world_size, ())]


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    description: str
    provisional: bool
    auto_select: bool
    measured: dict[str, Any]
    match: dict[str, Any]
    labs: dict[str, LabExpectation]
    # OMP threads of every rank and reference run; None: the runner's default (cores / world size).
    # The CPU profiles say 1 (see harness/profiles/plans/cpu-grade.toml for why).
    threads_per_rank: int | None = None
    # Seconds a cell may spend on more pairs (reference, run) when its speed interval still reaches
    # a floor after the planned runs (grading/execute.py); past it, the row is "not comparable".
    speed_budget_s: float = 0.0

    def fits(self, host: dict[str, Any]) -> bool:
        """host: {"gpus": count, "gpu_models": [...], "cores": n} (from distlab doctor's facts).

        A CPU profile fits CPU hosts; a GPU profile fits any host with at least one GPU of its model
        (match.gpus is how many it was measured on: a grade runs the world sizes the host can).
        """
        want = self.match.get("gpus", 0)
        if (want == 0) != (host["gpus"] == 0):
            return False
        model = self.match.get("gpu_model", "")
        if model and not any(model.lower() in m.lower() for m in host["gpu_models"]):
            return False
        return host["cores"] >= self.match.get("min_cores", 1)

    @property
    def on_gpus(self) -> bool:
        return self.match.get("gpus", 0) > 0
