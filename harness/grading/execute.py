"""A plan's runs, in order, each through the runner like `distlab run` starts one, and observed."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from harness.console import run_progress
from harness.grading import samples
from harness.grading.cells import run_cell
from harness.grading.plan import Cell, GradePlan
from harness.observe import accuracy, timeline
from harness.run.request import RunRequest
from harness.run.runner import run_lab
from harness.run.state import RunResult
from harness.verdict.evaluate import speed_undecided
from harness.verdict.expectations import LabExpectation
from harness.verdict.pairing import pair_references, reference_rates
from harness.verdict.verdicts import Sample

# However fast a cell's runs are, at most this many extra pairs: by then a t interval over the
# log ratios is within a factor of 1.3 of its limit, and a row still undecided is not comparable.
MAX_EXTRA_PAIRS = 20


# What starts a run and returns its account: the runner, as `distlab run` starts one (run/runner.py);
# a replay of stored runs in tests/test_replay.py, which drives this same loop.
Runner = Callable[..., RunResult]


def execute(grade_plan: GradePlan, done: dict[Cell, list[Sample]],
            references: dict[Cell, list[Sample]] | None = None,
            on_event: Callable[[dict[str, Any]], None] | None = None, *,
            runner: Runner | None = None, evaluator: accuracy.Evaluator | None = None) -> None:
    """Run every planned cell `repeats` times into `done` (and each cell's reference runs into
    `references`), which keep every finished run even if Ctrl-C stops the rest.

    A cell with a reference runs it just before each of its own runs: reference, run, reference,
    run. Another program competing for the CPUs then slows both alike, and the ratio holds (a
    reference measured minutes earlier, under another load, is what failed correct labs). A
    student's program gets one more run of the course lab after its last (GradePlan.bracketed), so
    that every run of it sits between two of the lab's (verdict/pairing.pair_references).

    Where a speed row's interval still reaches its floor after the planned runs, the cell runs
    another pair (reference, run; for a bracketed program run, lab) while the profile's
    speed_budget_s allows one more as long as the last (verdict/speed.py, speed_rule).

    `on_event`: told each run's start and end as data (console.RunProgress), for a class grade's job
    to pass to the grader. `runner` starts each run (by default run/runner.run_lab); `evaluator`
    measures the runs' final weights (by default one evaluating process for the grade, started here
    and stopped at its end).
    """
    references = {} if references is None else references
    start = runner or run_lab
    cells = grade_plan.cells()
    raised: dict[str, str] = {}  # a run's folder -> the exception the program raised that ended it
    # One evaluating process for the grade's runs, between them (harness/observe/accuracy.py).
    with run_progress(grade_plan.planned_runs(), grade_plan.budget_s(), on_event) as progress, \
            (contextlib.nullcontext(evaluator) if evaluator is not None else accuracy.Evaluator()) as evaluator:

        def one_run(label: str, request: RunRequest, exp: LabExpectation | None = None,
                    metric_name: str = "") -> Sample:
            progress.started(label)
            began = time.monotonic()
            if exp is not None and exp.cell != "one-host":  # two hosts, or stopped and resumed (cells.py)
                sample = evaluated(run_cell(exp, request, evaluator, progress.line), began)
                progress.ended(f"{sample.status} in {sample.wall_seconds:.0f} s" + (f": {sample.reason}"
                                                                                   if sample.reason else ""))
                return sample
            result = start(request, echo=False, on_line=progress.line)
            sample = evaluated(samples.observed_sample(result, exp, request, evaluator) if exp else
                               samples.reference_sample(result, metric_name), began)
            if exp is not None and (said := samples.raised_by_the_program(result)):
                raised[sample.run_dir] = said
            progress.ended(f"ok in {result.wall_seconds:.0f} s" if result.ok else f"FAILED: {result.reason}")
            return sample

        for lab, ws in cells:
            reference = grade_plan.reference(lab, ws)
            reference_request = grade_plan.reference_request(lab, ws)  # None exactly where reference is
            request = grade_plan.request(lab, ws)
            runs, stopped = grade_plan.runs(lab), False
            for repeat in range(1, runs + 1):
                if reference and reference_request:
                    references.setdefault((lab, ws), []).append(
                        one_run(f"{reference.name} for {lab} ws={ws} run {repeat}", reference_request,
                                metric_name=reference.metric))
                sample = one_run(f"{lab} ws={ws} run {repeat}/{runs}", request, grade_plan.profile.labs[lab])
                done.setdefault((lab, ws), []).append(sample)
                if repeat < runs and sample.run_dir in raised and not any(s.status == "ok" for s in done[lab, ws]):
                    # No run of the cell went well and the program raised its own exception: its "run" row
                    # fails whatever the other runs show, and they would end the same way (a speed needs a run
                    # that went well). A failure the machine could have caused is run again as planned.
                    left = grade_plan.cell_runs(lab, ws)
                    progress.add(-(left[0] - repeat) - (left[1] - repeat if left[1] else 0),
                                 f"{lab} ws={ws}: not run again, the program raised {raised[sample.run_dir]}")
                    stopped = True
                    break
            if reference and reference_request and grade_plan.bracketed(lab) and not stopped:
                references[lab, ws].append(one_run(f"{reference.name} for {lab} ws={ws} after run {runs}",
                                                   reference_request, metric_name=reference.metric))
            if not reference or not reference_request:
                continue
            spent, pair_s, extra = 0.0, 0.0, 0
            exp = grade_plan.profile.labs[lab]
            while (spent + pair_s < grade_plan.profile.speed_budget_s and extra < MAX_EXTRA_PAIRS
                   and undecided(grade_plan, (lab, ws), done, references)):
                started, extra = time.monotonic(), extra + 1
                progress.add(2)
                pair = [(f"{reference.name} for {lab} ws={ws} extra pair {extra}", reference_request, None),
                        (f"{lab} ws={ws} extra run {extra}", request, exp)]
                for label, asked, expectation in (pair[::-1] if grade_plan.bracketed(lab) else pair):
                    if expectation is None:
                        references[lab, ws].append(one_run(label, asked, metric_name=reference.metric))
                    else:
                        done[lab, ws].append(one_run(label, asked, expectation))
                pair_s = time.monotonic() - started
                spent += pair_s


def evaluated(sample: Sample, began: float) -> Sample:
    """The sample with the harness's own time on it past its launches' phases (timeline.EVALUATE): its
    observations read, its weights evaluated, its checks; for a cell of its own, the namespaces made too."""
    sample.phases[timeline.EVALUATE] = max(0.0, time.monotonic() - began - sum(sample.phases.values()))
    return sample


def undecided(grade_plan: GradePlan, cell: Cell, done: dict[Cell, list[Sample]],
              references: dict[Cell, list[Sample]]) -> bool:
    """Whether a cell's speed rows need more pairs to decide (verdict/evaluate.py, speed_undecided)."""
    here, theirs = {cell: done.get(cell, [])}, {cell: references.get(cell, [])}
    pair_references(grade_plan.reference, here, theirs)
    return speed_undecided(grade_plan.profile.labs[cell[0]], cell[1], here[cell],
                           reference_rates(grade_plan.reference, theirs).get(cell))


def harness_overhead(wall_seconds: float, *runs: dict[Cell, list[Sample]]) -> float:
    """Total wall time over the sum of the runs' wall times, labs and references (1.0: no overhead)."""
    total = sum(s.wall_seconds for group in runs for samples in group.values() for s in samples)
    return wall_seconds / total if total else float("nan")
