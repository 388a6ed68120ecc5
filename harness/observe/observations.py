"""What the harness's observer saw on every rank of a run, read back, and the run's training timed.

The observer (harness/on_ranks/observer) sits in every rank and writes what torch itself did there:
the process group, every sample index the data loaders handed out, the optimizer steps, every
torch.save and the final state of the trained model. This module reads it (`load`) and times the
run's training from it (`throughput`); data_parallel.py judges the run from it.

No torch here: the grader reads JSON only (harness/observe/accuracy.py loads the weights, in a subprocess).

Throughput, timed by the harness (`throughput`): on each rank, the images of the training batches
received after the run's first WARMUP_STEPS optimizer steps, over the time the training passes took
from then (the first epoch from the end of step WARMUP_STEPS, each later one from its first draw
from the loader) to their last step; the run's rate is the sum of the ranks' rates. This is the
labs' own TrainClock rule (labs/common/timing.py), measured from outside: the grade uses it, and a
record claiming much more is a contradicted claim (compare_claims).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OBSERVATIONS_SCHEMA = "distlab-observations"
WEIGHTS_FILE = "final_weights.pt"
WARMUP_STEPS = 3  # the first optimizer steps of a run, left out of its throughput (start-up)


@dataclass(frozen=True)
class LoaderPass:
    loader: int
    dataset_len: int | None
    sampler: str
    batches: int
    steps: int
    batch_sizes: list[int]
    indices: list[int]
    started: float | None = None  # the rank's perf_counter when the pass first drew from its loader
    step_times: list[float] = field(default_factory=list)  # when each optimizer step of the pass ended
    step_images: list[int] = field(default_factory=list)  # images the pass had handed out by each step


@dataclass
class RankObservation:
    rank: int
    process_groups: list[dict[str, Any]]
    optimizer_steps: int
    passes: list[LoaderPass]
    saves: list[dict[str, Any]]
    model: dict[str, Any] | None
    errors: list[str]

    @property
    def training_epochs(self) -> list[LoaderPass]:
        return [p for p in self.passes if p.steps > 0]


@dataclass
class Observations:
    directory: Path
    ranks: dict[int, RankObservation] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # unreadable files, the observer's own errors

    @property
    def weights(self) -> Path:
        return self.directory / WEIGHTS_FILE


def load(observe_dir: Path | str) -> Observations:
    """Every rank.<r>.json the observer wrote under observe_dir, and its error files."""
    directory = Path(observe_dir)
    observations = Observations(directory)
    for path in sorted(directory.glob("rank.*.json")):
        try:
            data = json.loads(path.read_text())
            if data.get("schema") != OBSERVATIONS_SCHEMA:
                raise ValueError(f"schema {data.get('schema')!r}")
            rank = int(data["rank"])
            observations.ranks[rank] = RankObservation(
                rank=rank, process_groups=data["process_groups"], optimizer_steps=int(data["optimizer_steps"]),
                passes=[LoaderPass(p["loader"], p["dataset_len"], p["sampler"], p["batches"], p["steps"],
                                   p["batch_sizes"], p["indices"], p.get("started"), p.get("step_times", []),
                                   p.get("step_images", [])) for p in data["loader_passes"]],
                saves=data["saves"], model=data["model"], errors=data["errors"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            observations.problems.append(f"{path.name} unreadable ({type(error).__name__}: {error})")
    for path in sorted(directory.glob("observer-errors.*.txt")):
        first = path.read_text(errors="replace").splitlines()[:1]
        observations.problems.append(f"observer error in {path.name}: {first[0] if first else '?'}")
    return observations



def throughput(observations: Observations, warmup_steps: int = WARMUP_STEPS) -> float | None:
    """Training images per second of the whole run as the harness timed it (the rule above); None
    when a rank left no timed training after its warm-up (too few steps, or no observations)."""
    rates = []
    for rank in (observations.ranks[r] for r in sorted(observations.ranks)):
        images, seconds, steps_before = 0, 0.0, 0
        for epoch in rank.training_epochs:
            timed = len(epoch.step_times)
            if not timed or epoch.started is None or len(epoch.step_images) != timed:
                return None  # observations of an older observer, or steps the observer could not place
            warm = warmup_steps - steps_before  # steps of this epoch still in the warm-up
            steps_before += timed
            if warm >= timed:
                continue
            start, first = (epoch.started, 0) if warm <= 0 else \
                (epoch.step_times[warm - 1], epoch.step_images[warm - 1])
            images += epoch.step_images[-1] - first
            seconds += epoch.step_times[-1] - start
        if not images or seconds <= 0:
            return None
        rates.append(images / seconds)
    return sum(rates) if rates else None
