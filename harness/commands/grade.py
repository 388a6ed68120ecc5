"""`distlab grade`: run each lab at each world size, then compare what was measured with a profile.

    plan (profile, cells, every request checked)  ->  execute (runner.run_lab per cell and repeat)
    ->  verdicts.grade_verdicts  ->  report (terminal table, Markdown, HTML, JUnit, step summary)

Runs go through the same path as `distlab run` (request.build_request, then runner.run_lab: real
launchers, one run directory each). `distlab calibrate` runs the same plan and writes a profile.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.catalog import LABS, find_lab
from harness.commands import doctor
from harness.console import console, print_json, run_progress
from harness.observe import accuracy, data_parallel, observations
from harness.report import pages
from harness.run.launch import dry_run
from harness.run.request import RunRequest, build_request
from harness.run.run_dir import OBSERVE_DIR, RUN_DIR_PLACEHOLDER, new_run_dir
from harness.run.runner import run_lab
from harness.run.state import RunResult
from harness.usage import UsageError
from harness.verdict import profiles
from harness.verdict.profiles import LabExpectation, Profile, against_course_lab
from harness.verdict.references import PROGRAM_PAIRS, REFERENCES, Reference, course_lab
from harness.verdict.verdicts import Sample, Verdict, grade_verdicts, sample_metric, unjudged


def accuracy_claim_tolerance(test_images: int | None) -> float:
    """How far a program's own final accuracy may honestly be from the harness's measurement of rank
    0's weights: one test image. Once the replicas are one model (parameters and buffers bitwise
    equal, observed), the program and the harness apply the same function to the same images; they
    batch them differently (each rank its own shard, the harness the whole set), and the rounding of
    another batch shape can flip an argmax only where two logits tie to within it, which one image
    in the test sets graded here allows for. Where only the ranks' buffers differ, each rank evaluated
    a model of its own and the two numbers are not compared (observed.compare_claims). The 1e-9
    absorbs the claim's float repr."""
    return (1 + 1e-9) / test_images if test_images else 0.0


@dataclass
class GradePlan:
    profile: Profile
    labs: list[str]
    world_sizes: list[int] | None  # None: each lab's own list from the profile
    repeats: int
    programs: dict[str, Path]
    results_root: Path
    timeout_s: float | None
    gpus: int | None = None  # GPUs visible: a GPU profile grades the world sizes they can hold
    # Each cell's requests, built once (by plan, which checks them all before anything starts) and
    # reused by every step after it: the runs, the reference runs, the rates, the pairing.
    _requests: dict[tuple[str, int, bool], RunRequest] = field(default_factory=dict, init=False, repr=False)
    _references: dict[tuple[str, int], tuple[Reference, RunRequest] | None] = field(
        default_factory=dict, init=False, repr=False)

    def cells(self) -> list[tuple[str, int]]:
        planned = []
        for lab in self.labs:
            exp = self.profile.labs[lab]
            # Expectations exist only where the profile has them: --world-sizes selects among those.
            sizes = [ws for ws in exp.world_sizes if not self.world_sizes or ws in self.world_sizes]
            if self.profile.on_gpus and self.gpus is not None:
                sizes = [ws for ws in sizes if ws <= self.gpus]  # one GPU per rank
            planned += [(lab, ws) for ws in sizes if LABS[exp.catalog_lab].runs_at(ws)]
        return planned

    def program(self, lab: str) -> Path | None:
        """The student's program graded in a row, or None: the course's own lab."""
        return self.programs.get(lab) or self.programs.get(self.profile.labs[lab].catalog_lab)

    def bracketed(self, lab: str) -> bool:
        """A student's program timed against the course lab: its runs are bracketed by the lab's
        (lab, program, lab, ..., lab) and there are at least PROGRAM_PAIRS of them."""
        return self.program(lab) is not None and self.profile.labs[lab].reference is not None

    def runs(self, lab: str) -> int:
        """Runs of each cell of a row: --repeats, at least PROGRAM_PAIRS for a bracketed program."""
        return max(self.repeats, PROGRAM_PAIRS) if self.bracketed(lab) else self.repeats

    def request(self, lab: str, world_size: int, course: bool = False) -> RunRequest:
        """The run of one cell (`course`: with the course's lab, whatever program the row grades),
        built the first time it is asked for and the same object after."""
        key = (lab, world_size, course)
        if key not in self._requests:
            self._requests[key] = self.build_request(lab, world_size, course)
        return self._requests[key]

    def build_request(self, lab: str, world_size: int, course: bool = False) -> RunRequest:
        """A cell's run, checked like `distlab run` checks its own (request.build_request)."""
        exp = self.profile.labs[lab]
        return build_request(exp.catalog_lab, world_size, exp.args_at(world_size),
                             launcher=exp.launcher if world_size > 1 else None, backend=exp.backend,
                             threads=self.profile.threads_per_rank,
                             timeout_s=self.timeout_s or exp.time_budget_s * 2, results_root=self.results_root,
                             program=None if course else self.program(lab), gpus=self.gpus)

    def reference(self, lab: str, world_size: int) -> tuple[Reference, RunRequest] | None:
        """What a cell's throughput is a ratio to, and its run: the profile's plain loop, or for a
        student's program the course's lab (harness/verdict/references.py). Built once per cell."""
        if (lab, world_size) not in self._references:
            self._references[lab, world_size] = self._build_reference(lab, world_size)
        return self._references[lab, world_size]

    def _build_reference(self, lab: str, world_size: int) -> tuple[Reference, RunRequest] | None:
        exp = self.profile.labs[lab]
        if exp.reference is None:
            return None
        if self.program(lab):
            reference = course_lab(LABS[exp.catalog_lab], exp.throughput_metric)
            return reference, reference.request(self.request(lab, world_size, course=True))
        reference = REFERENCES[exp.reference]
        return reference, reference.request(self.request(lab, world_size))


def plan(args: argparse.Namespace) -> GradePlan:
    """The grade asked for on the command line, every run validated before the first one starts:
    a bad cell found after an hour helps nobody."""
    host = doctor.fingerprint()
    try:
        profile = profiles.resolve(args.profile, host)
    except profiles.ProfileError as error:
        raise UsageError(str(error)) from None
    asked = [lab for lab in (args.labs or "").split(",") if lab] or list(profile.labs)
    for lab in asked:
        if lab not in profile.labs:
            find_lab(lab)
        if not any(row == lab or exp.catalog_lab == lab for row, exp in profile.labs.items()):
            raise UsageError(f"profile {profile.name} has no expectations for lab {lab}; "
                             f"its labs: {', '.join(profile.labs)}")
    # --labs ddp grades the rows that run ddp (ddp and a variant such as ddp-sync-bn); a row's own
    # name grades that row; --labs ddp,ddp grades them once. Profile order throughout.
    labs = [row for row, exp in profile.labs.items() if row in asked or exp.catalog_lab in asked]
    # A row whose world size 1 is another's (single_device: the baseline for ddp) brings that row along.
    needed = {profile.labs[row].single_device for row in labs}
    labs = [row for row in profile.labs if row in labs or row in needed]
    programs = {}
    for item in args.program or []:  # LAB=PATH for every row of a lab, or ROW=PATH for one row
        lab, sep, path = item.partition("=")
        if not sep or (lab not in LABS and lab not in profile.labs):
            raise UsageError(f"--program takes LAB=PATH with LAB one of {', '.join(LABS)} (got {item!r})")
        if not Path(path).is_file():
            raise UsageError(f"program {path} for lab {lab} does not exist")
        programs[lab] = Path(path).resolve()
    grade_plan = GradePlan(profile, labs, args.world_sizes, args.repeats, programs, args.results, args.timeout,
                           gpus=host["gpus"])
    grade_plan.profile = dataclasses.replace(profile, labs={
        row: against_course_lab(exp) if grade_plan.program(row) else exp for row, exp in profile.labs.items()})
    if not grade_plan.cells():
        raise UsageError("nothing to run: no lab of the profile runs at the world sizes given")
    for lab, ws in grade_plan.cells():
        grade_plan.request(lab, ws)
    return grade_plan


def show_plan(grade_plan: GradePlan) -> None:
    """--dry-run: the profile chosen, and every run the grade would start, in order; nothing starts."""
    profile = grade_plan.profile
    lines = [f"profile {profile.name} ({profile.path}){' PROVISIONAL' if profile.provisional else ''}: "
             f"{profile.description}", f"{len(grade_plan.cells())} cell(s) x {grade_plan.repeats} repeat(s)"]
    for lab, ws in grade_plan.cells():
        ref = grade_plan.reference(lab, ws)
        if ref:
            when = "before each run and after the last" if grade_plan.bracketed(lab) else "before each run"
            lines.append(f"{ref[0].name} for {lab} ws={ws}, {when}: {dry_run(ref[1])}")
        lines.append(f"{lab} ws={ws} x {grade_plan.runs(lab)}: {dry_run(grade_plan.request(lab, ws))}")
    sys.stdout.write("\n".join(lines) + "\n")


def sample_of(result: RunResult) -> Sample:
    return Sample(str(result.run_dir), result.status, result.reason, result.wall_seconds, result.record, cpu=result.cpu)


def timed(result: RunResult, metric_name: str) -> Sample:
    """A run with its training throughput timed by the harness, where its observer saw training
    (img_per_sec of a data-parallel training lab, or of the course lab timing a student's program)."""
    sample = sample_of(result)
    observe_dir = result.run_dir / OBSERVE_DIR
    if metric_name == "img_per_sec" and observe_dir.is_dir():
        sample.measured[metric_name] = rate = observations.throughput(observations.load(observe_dir))
        if rate is None:
            sample.measure_errors[metric_name] = (
                f"no rank was seen training past its first {observations.WARMUP_STEPS} optimizer steps (the warm-up, "
                "left out)")
    return sample


def observed_sample(result: RunResult, exp: LabExpectation, request: RunRequest,
                    evaluator: accuracy.Evaluator) -> Sample:
    """A run as the grader judges it. For a data-parallel training lab, what the harness saw itself:
    the checks computed from every rank's observations, its training throughput, the accuracy of
    rank 0's final weights measured on the test set, and every claim of the record that these
    contradict."""
    trains_data_parallel = LABS[exp.catalog_lab].data_parallel
    sample = timed(result, exp.throughput_metric) if trains_data_parallel else sample_of(result)
    observe_dir = result.run_dir / OBSERVE_DIR
    # A run that failed is observed too: its own failed check is a claim, what the harness saw the fact.
    if not trains_data_parallel or not observe_dir.is_dir():
        return sample
    lab_args = [arg.replace(RUN_DIR_PLACEHOLDER, str(result.run_dir)) for arg in request.lab_args]
    # Measured always, graded where the profile has an accuracy band: a claim is compared either way.
    measurement = evaluator.measure(observe_dir, lab_args)
    sample.measured[exp.accuracy_metric] = measurement.get("accuracy")
    if measurement.get("error"):
        sample.measure_errors[exp.accuracy_metric] = measurement["error"]
    checks = data_parallel.checks(observations.load(observe_dir), request.backend, request.world_size,
                             train_set_size=measurement.get("train_size"))
    checks += data_parallel.compare_claims(result.record, checks, measurement.get("accuracy"),
                                      accuracy_claim_tolerance(measurement.get("total")),
                                      measured_img_per_sec=sample.measured.get("img_per_sec"))
    sample.observed = [check.to_dict() for check in checks]
    return sample


def execute(grade_plan: GradePlan, done: dict[tuple[str, int], list[Sample]],
            references: dict[tuple[str, int], list[Sample]] | None = None) -> None:
    """Run every planned cell `repeats` times into `done` (and each cell's reference runs into
    `references`), which keep every finished run even if Ctrl-C stops the rest.

    A cell with a reference runs it just before each of its own runs: reference, run, reference,
    run. Another program competing for the CPUs then slows both alike, and the ratio holds (a
    reference measured minutes earlier, under another load, is what failed correct labs). A
    student's program gets one more run of the course lab after its last (GradePlan.bracketed), so
    that every run of it sits between two of the lab's (pair_references).
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
            result = run_lab(request, echo=False, on_line=progress.line)
            sample = observed_sample(result, exp, request, evaluator) if exp else timed(result, metric_name)
            progress.ended(f"ok in {result.wall_seconds:.0f} s" if result.ok else f"FAILED: {result.reason}")
            return sample

        for lab, ws in cells:
            ref = grade_plan.reference(lab, ws)
            request = grade_plan.request(lab, ws)
            runs = grade_plan.runs(lab)
            for repeat in range(1, runs + 1):
                if ref:
                    references.setdefault((lab, ws), []).append(
                        one_run(f"{ref[0].name} for {lab} ws={ws} run {repeat}", ref[1], metric_name=ref[0].metric))
                done.setdefault((lab, ws), []).append(
                    one_run(f"{lab} ws={ws} run {repeat}/{runs}", request, grade_plan.profile.labs[lab]))
            if ref and grade_plan.bracketed(lab):
                references[lab, ws].append(one_run(f"{ref[0].name} for {lab} ws={ws} after run {runs}", ref[1],
                                                   metric_name=ref[0].metric))


def reference_rates(grade_plan: GradePlan, references: dict[tuple[str, int], list[Sample]]
                    ) -> dict[tuple[str, int], float | None]:
    """Each cell's reference rate: the mean of its reference runs. None where none succeeded."""
    rates: dict[tuple[str, int], float | None] = {}
    for (lab, ws), samples in references.items():
        reference, _ = grade_plan.reference(lab, ws)  # type: ignore[misc]
        values = [v for s in samples if s.status == "ok" and (v := sample_metric(s, reference.metric))]
        rates[lab, ws] = statistics.fmean(values) if values else None
    return rates


def pair_references(grade_plan: GradePlan, done: dict[tuple[str, int], list[Sample]],
                    references: dict[tuple[str, int], list[Sample]]) -> None:
    """Each run's own reference rate (Sample.reference), for the paired ratios of band_verdict: the
    reference run just before it, or, where the cell's runs are bracketed (one reference run more
    than runs), the mean of the two around it. A reference run that failed pairs with nothing."""
    for cell, samples in done.items():
        ref = grade_plan.reference(*cell)
        if ref is None or cell not in references:
            continue
        rates = [sample_metric(s, ref[0].metric) if s.status == "ok" else None for s in references[cell]]
        bracketed = len(rates) == len(samples) + 1
        for i, sample in enumerate(samples):
            around = [r for r in (rates[i:i + 2] if bracketed else rates[i:i + 1]) if r]
            sample.reference = statistics.fmean(around) if around else None


def harness_overhead(wall_seconds: float, *runs: dict[tuple[str, int], list[Sample]]) -> float:
    """Total wall time over the sum of the runs' wall times, labs and references (1.0: no overhead)."""
    total = sum(s.wall_seconds for group in runs for samples in group.values() for s in samples)
    return wall_seconds / total if total else float("nan")


def run(args: argparse.Namespace, execute_cells=execute) -> int:
    """`distlab grade`: plan, execute, evaluate, report; exit 0 when every check passed.
    `execute_cells`: how the cells run (harness/commands/slurm.py: as a Slurm job array), like `execute`."""
    grade_plan = plan(args)
    profile = grade_plan.profile
    if getattr(args, "dry_run", False):
        show_plan(grade_plan)
        return 0
    console.print(f"distlab grade: profile {profile.name}"
                  f"{' (PROVISIONAL: numbers not measured on this hardware)' if profile.provisional else ''}; "
                  f"{len(grade_plan.cells())} cell(s) x {grade_plan.repeats} repeat(s)", markup=False)
    done: dict[tuple[str, int], list[Sample]] = {}
    references: dict[tuple[str, int], list[Sample]] = {}
    started, interrupted = time.monotonic(), None
    try:
        execute_cells(grade_plan, done, references)
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: the run in flight is stopped; report what finished
        interrupted = stop
    wall = time.monotonic() - started
    pair_references(grade_plan, done, references)
    verdicts = grade_verdicts(profile, grade_plan.labs, done, reference_rates(grade_plan, references))
    if interrupted is not None:
        finished = sum(len(samples) for samples in done.values())
        verdicts.append(Verdict("grade", None, "completed", f"interrupted after {finished} run(s)",
                                f"{sum(grade_plan.runs(lab) for lab, _ in grade_plan.cells())} run(s)", False,
                                f"{interrupted or 'Ctrl-C'}: the verdicts above cover only the runs that finished"))
    overhead = harness_overhead(wall, done, references)
    report_dir = new_run_dir(args.results, "grade", max(ws for _, ws in grade_plan.cells()), profile.name)
    summary = {"profile": profile.name, "provisional": profile.provisional, "profile_measured": profile.measured,
               "labs": grade_plan.labs, "repeats": grade_plan.repeats, "runs": sum(len(s) for s in done.values()),
               "reference_runs": sum(len(samples) for samples in references.values()),
               "wall_seconds": wall, "harness_overhead": overhead,
               "failed": sum(v.passed is False for v in verdicts), "interrupted": interrupted is not None}
    paths = pages.write_report(report_dir, summary, verdicts, done,
                                {row: exp.single_device for row, exp in profile.labs.items() if exp.single_device})
    console.print(pages.verdict_table(verdicts, f"distlab grade: {profile.name}"))
    pages.append_step_summary(paths["markdown"])
    failed = summary["failed"]
    console.print(f"{'[red]FAILED[/red]' if failed else '[green]passed[/green]'}: {failed} failed check(s); "
                  f"{summary['runs']} run(s) in {wall:.0f} s, harness overhead {overhead:.3f}")
    for why, rows in unjudged(verdicts).items():  # a speed neither passed nor failed: say why
        console.print(f"speed not judged ({', '.join(rows)}): {why}", markup=False)
    console.print(f"report: {paths['html']}  junit: {paths['junit']}", markup=False)
    if getattr(args, "json", False):
        print_json({**summary, "report": {kind: str(path) for kind, path in paths.items()},
                    "failures": [v.to_dict() for v in verdicts if v.passed is False]})
    if interrupted is not None:
        raise interrupted  # the CLI says so and exits 130 (Ctrl-C) or 128 + the signal
    return 1 if failed else 0
