"""Where a grade's time went (`distlab grade --timings`, and the JSON summary's "timings"): each run's
phases (observe/timeline.py, on Sample.phases), the grade's own steps around them, and what none of
them accounts for, so that nothing hides. For the user's information, never for a verdict."""

from __future__ import annotations

from typing import Any

from harness.grading.plan import Cell
from harness.grading.stored import cell_key
from harness.observe.timeline import EVALUATE, PHASES
from harness.verdict.verdicts import Sample

RUN_COLUMNS = (*PHASES, EVALUATE)
# `distlab grade`'s own steps, outside its runs, in order (commands/grade.py and grading/judge.py time them).
GRADE_STEPS = ("plan", "judge", "write")
# `distlab grade` runs no sandbox (only grade-class does, classgrade/sandbox/): its setup is no phase here.
NO_SANDBOX = "no sandbox in distlab grade (grade-class sets one up per job)"


def run_rows(done: dict[Cell, list[Sample]], references: dict[Cell, list[Sample]]) -> list[dict[str, Any]]:
    """One row per run, the cell's runs in order and each cell's reference runs after them."""
    rows = []
    for reference, runs in ((False, done), (True, references)):
        for cell, samples in runs.items():
            for number, sample in enumerate(samples, 1):
                phases = {phase: round(sample.phases.get(phase, 0.0), 3) for phase in RUN_COLUMNS}
                rows.append({"cell": cell_key(cell), "run": number, "reference": reference, "status": sample.status,
                             "phases": phases, "seconds": round(sum(phases.values()), 3)})
    return rows


def grade_timings(rows: list[dict[str, Any]], steps: dict[str, float], wall_seconds: float,
                  sandbox: str = NO_SANDBOX) -> dict[str, Any]:
    """The grade's timings: `rows` (run_rows), `steps` the grade's own outside its runs (seconds, in order:
    GRADE_STEPS for `distlab grade`; a class job's sandbox setup and teardown too), and its wall time
    from the command's start; "unaccounted" is the wall time less every run and step (the evaluator's
    start and end, the progress display, the gaps between runs). `sandbox`: what the runs ran in."""
    totals = {phase: round(sum(row["phases"][phase] for row in rows), 3) for phase in RUN_COLUMNS}
    own = {step: round(seconds, 3) for step, seconds in steps.items()}
    unaccounted = wall_seconds - sum(totals.values()) - sum(own.values())
    return {"clock": "CLOCK_MONOTONIC", "runs": rows, "phase_totals": totals,
            "runs_seconds": round(sum(totals.values()), 3), "grade_steps": own,
            "wall_seconds": round(wall_seconds, 3), "unaccounted_seconds": round(unaccounted, 3),
            "unaccounted_share": round(unaccounted / wall_seconds, 4) if wall_seconds > 0 else None,
            "sandbox": sandbox}
