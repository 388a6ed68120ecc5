"""From runs to verdicts: `judge` on runs however they were got (executed now, on Slurm's nodes,
stored by a class job), `run_grade` for a plan executed here and judged."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.grading.execute import execute, harness_overhead
from harness.grading.plan import Cell, GradePlan
from harness.verdict.evaluate import grade_verdicts
from harness.verdict.pairing import pair_references, reference_rates
from harness.verdict.verdicts import Sample, Verdict

Executor = Callable[[GradePlan, dict[Cell, list[Sample]], dict[Cell, list[Sample]]], None]


def judge(grade_plan: GradePlan, done: dict[Cell, list[Sample]], references: dict[Cell, list[Sample]],
          rates: dict[Cell, float | None] | None = None) -> list[Verdict]:
    """Every verdict of these runs: each run paired with its reference runs, then the profile's
    bands, checks and claims per cell and across world sizes. Needs nothing of this host. `rates`:
    the cells' reference rates (pairing.reference_rates of these references), where the caller
    needs them too, computed once."""
    pair_references(grade_plan.reference, done, references)
    if rates is None:
        rates = reference_rates(grade_plan.reference, references)
    return grade_verdicts(grade_plan.profile, grade_plan.labs, done, rates)


@dataclass
class Grade:
    """A plan's runs and what was concluded from them."""

    plan: GradePlan
    done: dict[Cell, list[Sample]] = field(default_factory=dict)
    references: dict[Cell, list[Sample]] = field(default_factory=dict)
    verdicts: list[Verdict] = field(default_factory=list)
    wall_seconds: float = 0.0
    interrupted: KeyboardInterrupt | None = None  # Ctrl-C or SIGTERM: the verdicts cover what finished
    # Seconds of the grade's own steps outside its runs (grading/timings.GRADE_STEPS): where its time went.
    steps: dict[str, float] = field(default_factory=dict)

    @property
    def runs(self) -> int:
        return sum(len(samples) for samples in self.done.values())

    @property
    def overhead(self) -> float:
        return harness_overhead(self.wall_seconds, self.done, self.references)

    @property
    def failed(self) -> int:
        return sum(v.passed is False for v in self.verdicts)


def run_grade(grade_plan: GradePlan, execute_cells: Executor = execute) -> Grade:
    """Execute the plan (`execute_cells`: how its cells run; on Slurm as a job array) and judge
    what finished. A stop (Ctrl-C, SIGTERM) ends the runs, not the grade: it is a failed verdict."""
    grade = Grade(grade_plan)
    started = time.monotonic()
    try:
        execute_cells(grade_plan, grade.done, grade.references)
    except KeyboardInterrupt as stop:  # the run in flight is stopped; what finished is judged
        grade.interrupted = stop
    grade.wall_seconds = time.monotonic() - started
    grade.verdicts = judge(grade_plan, grade.done, grade.references)
    grade.steps["judge"] = time.monotonic() - started - grade.wall_seconds
    if grade.interrupted is not None:
        planned = sum(grade_plan.runs(lab) for lab, _ in grade_plan.cells())
        grade.verdicts.append(Verdict("grade", None, "completed", f"interrupted after {grade.runs} run(s)",
                                      f"{planned} run(s)", False, f"{grade.interrupted or 'Ctrl-C'}: the verdicts "
                                      "above cover only the runs that finished"))
    return grade
