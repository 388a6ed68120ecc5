"""Verdicts: what the grader concludes from a lab's runs, one row per comparison.

The row (Verdict) and the run it is reached from (Sample), the metric a run measured, a row's
margin (how far a comparison was from failing) and a lesson row's (as_lesson). The rows are reached
in evaluate.py (per cell and across world sizes), the speed rows by one rule (speed.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.verdict.expectations import LabExpectation

LESSON = "lesson"  # a verdict's `measured` where an observed check is a lesson: failed, at no cost (passed None)
NOT_RUN = "not run"  # a Sample's status where its cell could not run here (grading/cells.py), with the reason


@dataclass(frozen=True)
class Verdict:
    lab: str
    world_size: int | None  # None: a check across world sizes
    check: str
    measured: str
    expected: str
    passed: bool | None  # None: not applicable here (said why in detail)
    detail: str = ""
    # How far a numeric comparison was from failing, as a fraction of its threshold: 0.25 is 25% above
    # a floor (or below a ceiling), negative where it failed; None for a comparison without a number.
    # The robustness sweep's figure is the smallest seen (harness/benchmarks/robustness.py).
    margin: float | None = None
    # A speed row's interference: what other work did on the cores during its runs (speed_rule).
    interference: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Sample:
    """One run as the grader sees it: the harness's account, the lab's record (its claims), and what
    the harness observed and measured of the run itself."""

    run_dir: str
    status: str
    reason: str | None
    wall_seconds: float
    record: dict[str, Any] | None
    observed: list[dict[str, Any]] = field(default_factory=list)  # harness/observe/observations.py checks, as dicts
    # Metrics the harness measured itself (final_accuracy, img_per_sec); None where it could not,
    # and measure_errors says why.
    measured: dict[str, float | None] = field(default_factory=dict)
    measure_errors: dict[str, str] = field(default_factory=dict)
    # The reference rate this run is paired with (verdict/pairing.pair_references): the reference run
    # just before it, or the mean of those just before and after it. None: judged against the cell's rate.
    reference: float | None = None
    # Entries of the run's folder that are not regular files or folders (links, FIFOs, devices), by
    # path from the folder: never followed or opened (grading/samples.py, inspect_run_dir).
    untrusted: list[str] = field(default_factory=list)
    cpu: dict[str, Any] | None = None  # the run's CPUs as the harness saw them (run/accounting.py, cpu_account)
    start_up: str = ""  # what took its time before training, as observed (observe/observations.start_up)
    # Where the run's time went: seconds per phase (observe/timeline.py), for the user, never for a verdict.
    phases: dict[str, float] = field(default_factory=dict)


def is_lesson(verdict: Verdict) -> bool:
    """An observed finding the course teaches that nothing the program output depended on: shown with
    its lesson and fix, costing nothing unless a rubric says so (classgrade/rubric.py, lessons_cost)."""
    return verdict.passed is None and verdict.measured == LESSON


def metric(record: dict[str, Any] | None, name: str) -> float | None:
    value = (record or {}).get("metrics", {}).get(name)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def sample_metric(sample: Sample, name: str) -> float | None:
    """The harness's own measurement where it made or tried one (None if it failed: the program's
    claim never stands in for it), else the program's record."""
    return sample.measured[name] if name in sample.measured else metric(sample.record, name)


def above(value: float, floor: float | None) -> float | None:
    """The margin of value >= floor, as a fraction of the floor (None without a positive floor)."""
    return value / floor - 1 if floor else None


def below(value: float, ceiling: float | None) -> float | None:
    """The margin of value <= ceiling, as a fraction of the ceiling (None without a positive ceiling)."""
    return 1 - value / ceiling if ceiling else None


def within(distance: float, tolerance: float) -> float | None:
    """The margin of distance <= tolerance, as a fraction of the tolerance."""
    return 1 - distance / tolerance if tolerance else None


def failures(failed: list[Sample]) -> str:
    """What the failed runs of a cell said: how many, and the first one's reason."""
    return f"{len(failed)} run(s) failed" + (f"; the first: {failed[0].reason}" if failed[0].reason else "")


def as_lesson(exp: LabExpectation, verdict: Verdict) -> Verdict:
    """A lesson row (ddp-local-bn) shows what a mistake costs: being worse than a band is its point,
    so its bands and comparisons are reported, never graded. It still fails for what would fail any
    row: a crash, a check, an observed mistake, a contradicted claim, its time budget."""
    if not exp.lesson or verdict.passed is None:
        return verdict
    return dataclasses.replace(verdict, passed=None, margin=None,
                               detail=f"lesson: {exp.lesson} {verdict.detail}".strip())
