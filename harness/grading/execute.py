"""A plan's runs, in order, each through the runner like `distlab run` starts one, and observed."""

from __future__ import annotations

from harness.console import run_progress
from harness.grading import samples
from harness.grading.cells import run_cell
from harness.grading.plan import Cell, GradePlan
from harness.observe import accuracy
from harness.run.request import RunRequest
from harness.run.runner import run_lab
from harness.verdict.profiles import LabExpectation
from harness.verdict.verdicts import Sample


def execute(grade_plan: GradePlan, done: dict[Cell, list[Sample]],
            references: dict[Cell, list[Sample]] | None = None) -> None:
    """Run every planned cell `repeats` times into `done` (and each cell's reference runs into
    `references`), which keep every finished run even if Ctrl-C stops the rest.

    A cell with a reference runs it just before each of its own runs: reference, run, reference,
    run. Another program competing for the CPUs then slows both alike, and the ratio holds (a
    reference measured minutes earlier, under another load, is what failed correct labs). A
    student's program gets one more run of the course lab after its last (GradePlan.bracketed), so
    that every run of it sits between two of the lab's (verdict/pairing.pair_references).
    """
    references = {} if references is None else references
    cells = grade_plan.cells()
    total = 0
    for lab, ws in cells:
        runs = grade_plan.runs(lab)
        total += runs + (runs + grade_plan.bracketed(lab) if grade_plan.reference(lab, ws) else 0)
    # One evaluating process for the grade's runs, between them (harness/observe/accuracy.py).
    with run_progress(total) as progress, accuracy.Evaluator() as evaluator:

        def one_run(label: str, request: RunRequest, exp: LabExpectation | None = None,
                    metric_name: str = "") -> Sample:
            progress.started(label)
            if exp is not None and exp.cell != "one-host":  # two hosts, or stopped and resumed (cells.py)
                sample = run_cell(exp, request, evaluator, progress.line)
                progress.ended(f"{sample.status} in {sample.wall_seconds:.0f} s" + (f": {sample.reason}"
                                                                                   if sample.reason else ""))
                return sample
            result = run_lab(request, echo=False, on_line=progress.line)
            sample = samples.observed_sample(result, exp, request, evaluator) if exp else \
                samples.timed(result, metric_name)
            progress.ended(f"ok in {result.wall_seconds:.0f} s" if result.ok else f"FAILED: {result.reason}")
            return sample

        for lab, ws in cells:
            reference = grade_plan.reference(lab, ws)
            reference_request = grade_plan.reference_request(lab, ws)  # None exactly where reference is
            request = grade_plan.request(lab, ws)
            runs = grade_plan.runs(lab)
            for repeat in range(1, runs + 1):
                if reference and reference_request:
                    references.setdefault((lab, ws), []).append(
                        one_run(f"{reference.name} for {lab} ws={ws} run {repeat}", reference_request,
                                metric_name=reference.metric))
                done.setdefault((lab, ws), []).append(
                    one_run(f"{lab} ws={ws} run {repeat}/{runs}", request, grade_plan.profile.labs[lab]))
            if reference and reference_request and grade_plan.bracketed(lab):
                references[lab, ws].append(one_run(f"{reference.name} for {lab} ws={ws} after run {runs}",
                                                   reference_request, metric_name=reference.metric))


def harness_overhead(wall_seconds: float, *runs: dict[Cell, list[Sample]]) -> float:
    """Total wall time over the sum of the runs' wall times, labs and references (1.0: no overhead)."""
    total = sum(s.wall_seconds for group in runs for samples in group.values() for s in samples)
    return wall_seconds / total if total else float("nan")
