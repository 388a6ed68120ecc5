"""Verdicts: what the grader concludes from a lab's runs, one row per comparison.

Pure functions of the samples and the profile: measured, expected, pass/fail and why. Per run: the
record's own correctness checks, the checks the profile requires, metric bands and the time budget.
Across world sizes: accuracy within a delta of world size 1 (the LR scaling rule should keep it),
and scaling efficiency T(n) / (n T(1)). Where the lab's throughput is a ratio to a reference loop
measured beside it, efficiency is taken over the loop's own: (T(n) / R(n)) / (T(1) / R(1)), the
share of the lab's scaling lost to its communication and synchronisation, with what the machine
does to any n processes (too few cores, another program's load) divided out.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.console import fmt
from harness.verdict.profiles import Band, LabExpectation, Profile
from harness.verdict.stats import efficiency as scaling_efficiency
from harness.verdict.stats import mean_ci

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


def is_lesson(verdict: Verdict) -> bool:
    """An observed finding the course teaches that nothing the program output depended on: shown with
    its lesson and fix, costing nothing unless a rubric says so (classgrade/rubric.py, lessons_cost)."""
    return verdict.passed is None and verdict.measured == LESSON


# Other processes' load a multi-threaded run may have beside it and still be judged: half a core.
# Less than one CPU-bound program takes beside it (the scheduler shares the cores fairly: beside 2
# threads on 2 cores it gets 2/3 of a core, two such programs a core between them), more than the
# kernel's own work and an idle shell or editor.
OTHERS_TOLERANCE = 0.5


def speed_not_judged(samples: list[Sample]) -> str | None:
    """Why these runs' speed cannot be judged, or None. The harness's own account of each run decides:
    more ranks x threads than the cores that were ours (affinity, cgroup quota, host), or, with more
    than one thread per rank, other processes busy on those cores. Measured in the robustness sweep
    (labs/TRAINING.md): there rates fell 3 to 40 times and the lab and its reference loop did not fall
    alike (OpenMP's threads spin-wait for a descheduled partner), so a ratio says nothing about the
    program. One thread per rank beside other programs slows the lab and its loop alike: judged."""
    def count(value: Any) -> Any:
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None

    for sample in samples:
        cpu = sample.cpu if isinstance(sample.cpu, dict) else {}
        ranks, threads, cores = (count(cpu.get(key)) for key in ("ranks_here", "threads_per_rank", "cores"))
        if not (ranks and threads and cores):
            continue
        where = f"{cores} core(s) ({cpu.get('cores_limited_by')}, of the host's {cpu.get('host_cores')})"
        if ranks * threads > cores:
            return f"{ranks} rank(s) x {threads} thread(s) on {where}: the run oversubscribed its cores"
        others = count(cpu.get("others_cores"))
        free = min(cores, (count(cpu.get("cpus")) or cores) - others) if others is not None else cores
        if threads > 1 and ranks * threads > free + OTHERS_TOLERANCE:
            return (f"{ranks} rank(s) x {threads} thread(s) on {where} while other processes kept {others:.2f} "
                    "of them busy: multi-threaded ranks need their cores to themselves")
    return None


NOT_JUDGED = "not judged"


def not_judged(verdict: Verdict, why: str) -> Verdict:
    """A speed row whose conditions cannot support a verdict: neither passed nor failed, and why."""
    return dataclasses.replace(verdict, measured=NOT_JUDGED, passed=None, margin=None,
                               detail=f"{NOT_JUDGED}: {why}; measured {verdict.measured} ({verdict.detail})")


def unjudged(verdicts: list[Verdict]) -> dict[str, list[str]]:
    """The speed rows not judged, by reason: what a grade says at its end."""
    reasons: dict[str, list[str]] = {}
    for v in verdicts:
        if v.measured == NOT_JUDGED:
            why = v.detail.removeprefix(f"{NOT_JUDGED}: ").split("; measured ", 1)[0]
            reasons.setdefault(why, []).append(f"{v.lab} ws={v.world_size} {v.check}")
    return reasons


def metric(record: dict[str, Any] | None, name: str) -> float | None:
    value = (record or {}).get("metrics", {}).get(name)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def sample_metric(sample: Sample, name: str) -> float | None:
    """The harness's own measurement where it made or tried one (None if it failed: the program's
    claim never stands in for it), else the program's record."""
    return sample.measured[name] if name in sample.measured else metric(sample.record, name)


def band_verdict(lab: str, world_size: int, band: Band, samples: list[Sample],
                 reference: float | None = None) -> Verdict:
    """One metric of one cell against its band. `reference`: the cell's reference rate, measured in
    the same grade (None when the band needs none, or when the reference failed).

    Throughput (absolute or as a ratio) is judged on the median over the runs: a slow outlier cannot
    fail a healthy program, noise cannot pass a slow one (no interval is used), and more repeats
    only bring the median closer to the true rate, so the rule gets stricter with them, not looser.
    A ratio is the median of the paired ratios where the runs carry their own reference (each run
    over the reference measured beside it in time: a busy moment slows both), else of the runs over
    the cell's reference rate.
    """
    values = [sample_metric(s, band.metric) for s in samples]
    expected = band.describe(world_size)
    if any(v is None for v in values):
        unmeasured = [s.measure_errors[band.metric] for s in samples if band.metric in s.measure_errors]
        return Verdict(lab, world_size, band.metric, "missing", expected, False,
                       f"the harness could not measure it: {unmeasured[0]}" if unmeasured else
                       f"the record lacks metrics.{band.metric} (a number); see labs/README.md")
    if band.at_least_ratio:
        if world_size not in band.at_least_ratio:
            return Verdict(lab, world_size, f"{band.metric}_ratio", "-", expected, None,
                           f"the profile has no expectation for world size {world_size}")
        paired = [(v, s.reference) for v, s in zip(values, samples, strict=True) if s.reference]
        if paired:
            ratios = [v / r for v, r in paired]  # type: ignore[operator]
            median, floor = statistics.median(ratios), band.at_least_ratio[world_size]
            return Verdict(lab, world_size, f"{band.metric}_ratio", f"{median:.3f}", expected, median >= floor,
                           f"median of {len(ratios)} paired ratio(s) ({', '.join(f'{r:.3f}' for r in ratios)}), "
                           f"each run's {band.metric} over the reference measured around it in this grade "
                           f"(median {statistics.median(values):.4g} against "
                           f"{statistics.median(r for _, r in paired):.4g})", margin=above(median, floor))
        if not reference:
            return Verdict(lab, world_size, f"{band.metric}_ratio", "-", expected, False,
                           "the reference loop did not run successfully, so throughput could not be judged")
        ratios = [v / reference for v in values]  # type: ignore[operator]
        median, floor = statistics.median(ratios), band.at_least_ratio[world_size]
        return Verdict(lab, world_size, f"{band.metric}_ratio", f"{median:.3f}", expected, median >= floor,
                       f"median of {len(ratios)} run(s): {statistics.median(values):.4g} {band.metric} against "
                       f"the reference's {reference:.4g}, measured in this grade on this machine",
                       margin=above(median, floor))
    if band.expected:
        if world_size not in band.expected:
            return Verdict(lab, world_size, band.metric, fmt(mean_ci(values).mean), expected, None,
                           f"the profile has no expectation for world size {world_size}")
        median = statistics.median(values)
        threshold = band.at_least_fraction * band.expected[world_size]
        return Verdict(lab, world_size, band.metric, fmt(median), expected, median >= threshold,
                       f"threshold {threshold:.4g}; median of {len(values)} run(s), 95% CI {mean_ci(values)}",
                       margin=above(median, threshold))
    mean = mean_ci(values).mean
    if band.value is not None:
        passed = abs(mean - band.value) <= band.tolerance
        margin = within(abs(mean - band.value), band.tolerance)
    else:
        passed = (band.min is None or mean >= band.min) and (band.max is None or mean <= band.max)
        sides = [m for m in (above(mean, band.min), below(mean, band.max)) if m is not None]
        margin = min(sides) if sides else None
    how = [f"mean of {len(values)} run(s)"] if len(values) > 1 else []
    if any(band.metric in s.measured for s in samples):
        claimed = [metric(s.record, band.metric) for s in samples]
        how.append("measured by the harness from rank 0's final weights; the program reported "
                   + ", ".join("-" if c is None else f"{c:.4g}" for c in claimed))
    return Verdict(lab, world_size, band.metric, fmt(mean), expected, passed, "; ".join(how), margin=margin)


def above(value: float, floor: float | None) -> float | None:
    """The margin of value >= floor, as a fraction of the floor (None without a positive floor)."""
    return value / floor - 1 if floor else None


def below(value: float, ceiling: float | None) -> float | None:
    """The margin of value <= ceiling, as a fraction of the ceiling (None without a positive ceiling)."""
    return 1 - value / ceiling if ceiling else None


def within(distance: float, tolerance: float) -> float | None:
    """The margin of distance <= tolerance, as a fraction of the tolerance."""
    return 1 - distance / tolerance if tolerance else None


def evaluate_cell(exp: LabExpectation, world_size: int, samples: list[Sample],
                  reference: float | None = None) -> list[Verdict]:
    """Everything checked on the runs of one lab at one world size (`reference`: see band_verdict)."""
    lab = exp.lab
    if samples and all(s.status == NOT_RUN for s in samples):  # nothing ran: one row says why, judged n/a
        return [Verdict(lab, world_size, "run", NOT_RUN, "all ok", None, samples[0].reason or "")]
    failed = [s for s in samples if s.status != "ok"]
    verdicts = [Verdict(lab, world_size, "run", f"{len(samples) - len(failed)}/{len(samples)} ok",
                        "all ok", not failed, failed[0].reason or "" if failed else "")]
    for name in exp.required_checks:
        missing = [s for s in samples if name not in ((s.record or {}).get("checks") or {})]
        bad = [s for s in samples if not ((s.record or {}).get("checks") or {}).get(name, {}).get("passed", False)]
        if missing:
            verdicts.append(Verdict(lab, world_size, f"check:{name}", "missing", "passed", False,
                                    f"the record has no check '{name}' (required for this lab)"))
        else:
            detail = {k: v for k, v in samples[0].record["checks"][name].items() if k != "passed"} if bad else ""
            verdicts.append(Verdict(lab, world_size, f"check:{name}", "passed" if not bad else "FAILED", "passed",
                                    not bad, str(detail) if detail else ""))
    verdicts += observed_verdicts(lab, world_size, samples)
    ok_samples = [s for s in samples if s.status == "ok"]
    slowest = max(s.wall_seconds for s in samples)
    crowded = speed_not_judged(samples)  # the time budget is a speed row too; a run that timed out still fails "run"
    if ok_samples or slowest > exp.time_budget_s:  # failed runs past the budget (a hang, say) fail it too
        why = next((s.start_up for s in samples if s.wall_seconds == slowest and s.start_up), "")
        budget = Verdict(lab, world_size, "time", f"{slowest:.1f} s", f"<= {exp.time_budget_s:g} s",
                         slowest <= exp.time_budget_s, "slowest run's wall time" + (
                             "" if ok_samples else f"; no run finished well ({_failures(failed)})") + (
                             f"; of it, {why}" if why and slowest > exp.time_budget_s else ""),
                         margin=below(slowest, exp.time_budget_s))
        verdicts.append(not_judged(budget, crowded) if crowded else budget)
    else:  # within the budget, a crash's wall time says nothing of the program's speed: not a pass
        verdicts.append(Verdict(lab, world_size, "time", f"{slowest:.1f} s", f"<= {exp.time_budget_s:g} s", None,
                                f"not judged: no run finished well ({_failures(failed)})"))
    crowded = speed_not_judged(ok_samples)
    for band in exp.bands:
        if not ok_samples:
            verdicts.append(Verdict(lab, world_size, f"{band.metric}_ratio" if band.at_least_ratio else band.metric,
                                    "not measured", band.describe(world_size), False,
                                    f"no run finished well to measure {band.metric} in ({_failures(failed)})"))
        elif crowded and band.metric == exp.throughput_metric:
            verdicts.append(not_judged(band_verdict(lab, world_size, band, ok_samples, reference), crowded))
        else:
            verdicts.append(as_lesson(exp, band_verdict(lab, world_size, band, ok_samples, reference)))
    if not any(band.metric == exp.accuracy_metric for band in exp.bands):
        verdicts += shown_accuracy(exp, world_size, ok_samples)
    return verdicts


def _failures(failed: list[Sample]) -> str:
    return f"{len(failed)} run(s) failed" + (f"; the first: {failed[0].reason}" if failed[0].reason else "")


def shown_accuracy(exp: LabExpectation, world_size: int, samples: list[Sample]) -> list[Verdict]:
    """The accuracy the harness measured, where the profile has no band for it: shown, never graded
    (passed None), with what the program reported beside it. Nothing where it was not measured."""
    name = exp.accuracy_metric
    tried = [s for s in samples if name in s.measured]
    if not tried:
        return []
    values = [s.measured[name] for s in tried]
    claimed = ", ".join("-" if c is None else f"{c:.4g}" for c in (metric(s.record, name) for s in tried))
    if any(v is None for v in values):
        errors = [s.measure_errors[name] for s in tried if name in s.measure_errors]
        return [Verdict(exp.lab, world_size, name, "not measured", "no band (shown)", None,
                        f"the harness could not measure it: {errors[0] if errors else 'no answer'}; the program "
                        f"reported {claimed}")]
    how = f"mean of {len(values)} run(s), " if len(values) > 1 else ""
    return [Verdict(exp.lab, world_size, name, fmt(mean_ci(values).mean), "no band (shown)", None,  # type: ignore[arg-type]
                    f"{how}measured by the harness from rank 0's final weights; the program reported {claimed}; "
                    "the profile grades no accuracy here")]


def as_lesson(exp: LabExpectation, verdict: Verdict) -> Verdict:
    """A lesson row (ddp-local-bn) shows what a mistake costs: being worse than a band is its point,
    so its bands and comparisons are reported, never graded. It still fails for what would fail any
    row: a crash, a check, an observed mistake, a contradicted claim, its time budget."""
    if not exp.lesson or verdict.passed is None:
        return verdict
    return dataclasses.replace(verdict, passed=None, margin=None,
                               detail=f"lesson: {exp.lesson} {verdict.detail}".strip())


def observed_verdicts(lab: str, world_size: int, samples: list[Sample]) -> list[Verdict]:
    """One verdict per check the harness computed from its observations (harness/observe/observations.py), over
    the runs of a cell: failed if it failed in any run; a claim of the record that the observations
    contradict is a failed verdict of its own ("claim:...")."""
    verdicts = []
    for name in dict.fromkeys(check["name"] for s in samples for check in s.observed):
        found = [check for s in samples for check in s.observed if check["name"] == name]
        failing = [check for check in found if not check["passed"]]
        label = name if name.startswith("claim:") else f"observed:{name}"
        costing = [check for check in failing if not check.get("lesson")]
        if failing and not costing:  # a lesson in every run that failed it (data_parallel.Check.lesson)
            verdicts.append(Verdict(lab, world_size, label, LESSON, "passed", None, f"lesson: {failing[0]['detail']}"))
        elif failing:
            verdicts.append(Verdict(lab, world_size, label, "FAILED", "passed", False, costing[0]["detail"]))
        elif not any(check.get("applicable", True) for check in found):
            verdicts.append(Verdict(lab, world_size, label, "n/a", "passed", None, found[0]["detail"]))
        else:
            verdicts.append(Verdict(lab, world_size, label, "passed", "passed", True, found[0]["detail"]))
    return verdicts


def evaluate_across(exp: LabExpectation, cells: dict[int, list[Sample]],
                    single_device: list[Sample] | None = None,
                    references: dict[int, float | None] | None = None) -> list[Verdict]:
    """Accuracy invariance and throughput scaling, both against world size 1. `single_device`: the
    world-size-1 runs when they are another row's (the profile's single_device, e.g. the baseline
    for a data-parallel lab). `references`: the reference rate per world size (at 1, that of the runs
    standing for world size 1), where the lab's throughput is a ratio to one."""
    references = references or {}
    verdicts: list[Verdict] = []
    ok = {ws: [s for s in samples if s.status == "ok"] for ws, samples in cells.items()}
    base_runs = [s for s in (single_device if single_device is not None else cells.get(1, [])) if s.status == "ok"]

    def mean_of(ws: int, name: str, runs: list[Sample] | None = None) -> float | None:
        values = [sample_metric(s, name) for s in (runs if runs is not None else ok.get(ws, []))]
        return None if not values or None in values else mean_ci(values).mean  # type: ignore[arg-type]

    for ws in sorted(cells):
        if ws == 1:
            continue
        if exp.accuracy_delta is not None:
            base, here = mean_of(1, exp.accuracy_metric, base_runs), mean_of(ws, exp.accuracy_metric)
            if base is None or here is None:
                verdicts.append(Verdict(exp.lab, ws, "accuracy_vs_ws1", "-", f"within {exp.accuracy_delta:g}",
                                        None, "needs successful runs with final accuracy at world sizes 1 and "
                                              f"{ws}"))
            else:
                compared = f"{exp.accuracy_metric} {here:.3f} at {ws} vs {base:.3f} at 1" + (
                    f" ({exp.single_device})" if exp.single_device else "")
                verdicts.append(as_lesson(exp, Verdict(exp.lab, ws, "accuracy_vs_ws1", f"{here - base:+.3f}",
                                                       f"within ±{exp.accuracy_delta:g}",
                                                       abs(here - base) <= exp.accuracy_delta, compared,
                                                       margin=within(abs(here - base), exp.accuracy_delta))))
        if ws in exp.efficiency_min:
            base, here = mean_of(1, exp.throughput_metric, base_runs), mean_of(ws, exp.throughput_metric)
            if not base or here is None:
                verdicts.append(Verdict(exp.lab, ws, "efficiency", "-", f">= {exp.efficiency_min[ws]:g}", None,
                                        f"needs {exp.throughput_metric} at world sizes 1 and {ws}"))
            else:
                efficiency = scaling_efficiency(here, ws, base)
                how = f"T({ws}) / ({ws} T(1)) with T = {exp.throughput_metric}" + (
                    f" (T(1): the {exp.single_device}'s)" if exp.single_device else "")
                if exp.reference and references.get(1) and references.get(ws):
                    loop = scaling_efficiency(references[ws], ws, references[1])  # type: ignore[arg-type]
                    how = f"{how} = {efficiency:.3f}, over its reference's own {loop:.3f} in this grade"
                    efficiency /= loop
                verdict = Verdict(exp.lab, ws, "efficiency", f"{efficiency:.3f}", f">= {exp.efficiency_min[ws]:g}",
                                  efficiency >= exp.efficiency_min[ws], how,
                                  margin=above(efficiency, exp.efficiency_min[ws]))
                crowded = speed_not_judged(ok.get(ws, [])) or speed_not_judged(base_runs)
                verdicts.append(not_judged(verdict, crowded) if crowded else as_lesson(exp, verdict))
    return verdicts


def grade_verdicts(profile: Profile, labs: list[str], done: dict[tuple[str, int], list[Sample]],
             references: dict[tuple[str, int], float | None] | None = None) -> list[Verdict]:
    """Every verdict of a grade: each cell's, then each lab's across world sizes. `references`: each
    cell's reference rate (grade.reference_rates), for the labs whose throughput is a ratio."""
    verdicts = []
    references = references or {}
    for lab in labs:
        exp = profile.labs[lab]
        cells = {ws: samples for (name, ws), samples in done.items() if name == lab}
        for ws in sorted(cells):
            verdicts += evaluate_cell(exp, ws, cells[ws], references.get((lab, ws)))
        base, rates = row_baseline(exp, done, references)
        verdicts += evaluate_across(exp, cells, base, rates)
    return verdicts


def row_baseline(exp: LabExpectation, done: dict[tuple[str, int], list[Sample]],
                 references: dict[tuple[str, int], float | None]
                 ) -> tuple[list[Sample] | None, dict[int, float | None]]:
    """What a row is compared with across world sizes: the runs standing for its world size 1 when
    they are another row's (its single_device; None: its own), and its reference rate per world size,
    at 1 that of those runs."""
    rates = {ws: rate for (name, ws), rate in references.items() if name == exp.lab}
    if not exp.single_device:
        return None, rates
    rates[1] = references.get((exp.single_device, 1))
    return done.get((exp.single_device, 1), []), rates
