"""The verdicts of a grade: each cell's runs, then each lab's across world sizes.

Pure functions of the samples and the profile: measured, expected, pass/fail and why. Per run: the
record's own correctness checks, the checks the profile requires, metric bands and the time budget.
Across world sizes: accuracy within a delta of world size 1 (the LR scaling rule should keep it),
and scaling efficiency T(n) / (n T(1)). Where the lab's throughput is a ratio to a reference loop
measured beside it, efficiency is taken over the loop's own: (T(n) / R(n)) / (T(1) / R(1)), the
share of the lab's scaling lost to its communication and synchronisation, with what the machine
does to any n processes (too few cores, another program's load) divided out. Each band kind is
judged beside its derivation (what `distlab calibrate` writes): the speed rows (throughput, the time
budget, scaling efficiency) by the speed rule in speed.py, accuracy across world sizes in accuracy.py,
the required checks here.
"""

from __future__ import annotations

from typing import Any

from harness.console import fmt
from harness.verdict.accuracy import accuracy_vs_ws1
from harness.verdict.expectations import Band, LabExpectation, Profile
from harness.verdict.speed import (
    NOT_COMPARABLE,
    REACHES,
    efficiency_verdicts,
    fraction_verdict,
    not_comparable,
    ratio_verdict,
    speed_not_judged,
    time_verdict,
)
from harness.verdict.stats import mean_ci
from harness.verdict.verdicts import (
    LESSON,
    NOT_RUN,
    Sample,
    Verdict,
    above,
    as_lesson,
    below,
    failures,
    metric,
    sample_metric,
    within,
)


def band_verdict(lab: str, world_size: int, band: Band, samples: list[Sample],
                 reference: float | None = None, alike: bool = False) -> Verdict:
    """One metric of one cell against its band. `reference`: the cell's reference rate, measured in
    the same grade (None when the band needs none, or when the reference failed).

    Throughput (absolute or as a ratio) is a speed row, judged beside its derivation in speed.py
    (ratio_verdict, fraction_verdict). `alike`: the reference is the same work (the course's lab
    beside a student's program).
    """
    measured = [sample_metric(s, band.metric) for s in samples]
    expected = band.describe(world_size)
    if any(v is None for v in measured):
        unmeasured = [s.measure_errors[band.metric] for s in samples if band.metric in s.measure_errors]
        return Verdict(lab, world_size, band.metric, "missing", expected, False,
                       f"the harness could not measure it: {unmeasured[0]}" if unmeasured else
                       f"the record lacks metrics.{band.metric} (a number); see labs/README.md")
    values = [v for v in measured if v is not None]  # every one, as checked above
    if band.at_least_ratio:
        return ratio_verdict(lab, world_size, band, samples, values, expected, reference, alike)
    if band.expected and band.at_least_fraction is not None:  # profiles.py reads them together
        return fraction_verdict(lab, world_size, band, band.at_least_fraction, samples, values, expected)
    mean = mean_ci(values).mean
    if band.value is not None and band.tolerance is not None:  # profiles.py reads them together
        passed = abs(mean - band.value) <= band.tolerance
        margin = within(abs(mean - band.value), band.tolerance)
    else:
        passed = (band.min is None or mean >= band.min) and (band.max is None or mean <= band.max)
        sides = [m for m in (above(mean, band.min), below(mean, band.max)) if m is not None]
        margin = min(sides) if sides else None
    notes = [f"mean of {len(values)} run(s)"] if len(values) > 1 else []
    if any(band.metric in s.measured for s in samples):
        claimed = [metric(s.record, band.metric) for s in samples]
        notes.append("measured by the harness from rank 0's final weights; the program reported "
                   + ", ".join("-" if c is None else f"{c:.4g}" for c in claimed))
    return Verdict(lab, world_size, band.metric, fmt(mean), expected, passed, "; ".join(notes), margin=margin)


def said(fields: dict[str, Any]) -> str:
    """What a record's check says, in words a student reads: "epochs compared 2; ranks repeating an
    order 0, 1", never a Python dict's repr."""
    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "(" + said(v) + ")"
        if isinstance(v, (list, tuple)):
            return ", ".join(value(x) for x in v) or "none"
        return fmt(v) if isinstance(v, float) else str(v)
    return "; ".join(f"{str(k).replace('_', ' ')} {value(v)}" for k, v in fields.items())


def required_checks(samples: list[Sample], observed: bool) -> list[str]:
    """The required_checks calibrate writes (judged in evaluate_cell): every check the runs' records
    carried, by name. None (an empty list) for a data-parallel training lab (`observed`), whose checks the harness
    computes itself from its observations: the record's own checks are then claims to compare, not
    requirements."""
    return [] if observed else sorted({name for s in samples for name in (s.record or {}).get("checks", {})})


NO_RUN_ENDED = "no run of this cell ended"  # a run verdict's detail where the grade stopped before one did


def evaluate_cell(exp: LabExpectation, world_size: int, samples: list[Sample],
                  reference: float | None = None) -> list[Verdict]:
    """Everything checked on the runs of one lab at one world size (`reference`: see band_verdict)."""
    lab = exp.lab
    if not samples:  # a grade stopped (Ctrl-C) before any run of this cell ended: nothing to judge
        return [Verdict(lab, world_size, "run", NOT_RUN, "all ok", None, NO_RUN_ENDED)]
    if all(s.status == NOT_RUN for s in samples):  # nothing ran: one row says why, judged n/a
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
            checks = (samples[0].record or {})["checks"]  # every sample has the check: none is missing
            detail = {k: v for k, v in checks[name].items() if k != "passed"} if bad else {}
            verdicts.append(Verdict(lab, world_size, f"check:{name}", "passed" if not bad else "FAILED", "passed",
                                    not bad, f"the record's own check failed: {said(detail)}" if detail else ""))
    verdicts += observed_verdicts(lab, world_size, samples)
    ok_samples = [s for s in samples if s.status == "ok"]
    verdicts.append(time_verdict(exp, world_size, samples))
    crowded = speed_not_judged(ok_samples)
    for band in exp.bands:
        if not ok_samples:
            verdicts.append(Verdict(lab, world_size, f"{band.metric}_ratio" if band.at_least_ratio else band.metric,
                                    "not measured", band.describe(world_size), False,
                                    f"no run finished well to measure {band.metric} in ({failures(failed)})"))
        elif crowded and band.metric == exp.throughput_metric:
            verdicts.append(not_comparable(band_verdict(lab, world_size, band, ok_samples, reference,
                                                        exp.reference_alike), crowded))
        else:
            verdicts.append(as_lesson(exp, band_verdict(lab, world_size, band, ok_samples, reference,
                                                        exp.reference_alike)))
    if not any(band.metric == exp.accuracy_metric for band in exp.bands):
        verdicts += shown_accuracy(exp, world_size, ok_samples)
    return verdicts


def speed_undecided(exp: LabExpectation, world_size: int, samples: list[Sample],
                    reference: float | None = None) -> bool:
    """Whether more pairs could decide a speed row of this cell: a ratio band whose interval still
    reaches its floor (speed_rule's UNDECIDED), on cores that could support a verdict at all."""
    ok_samples = [s for s in samples if s.status == "ok"]
    if not ok_samples or speed_not_judged(ok_samples) or exp.lesson:
        return False
    for band in exp.bands:
        if band.at_least_ratio and world_size in band.at_least_ratio:
            verdict = band_verdict(exp.lab, world_size, band, ok_samples, reference, exp.reference_alike)
            if verdict.measured == NOT_COMPARABLE and REACHES in verdict.detail.split("; measured ", 1)[0]:
                return True
    return False


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
        if failing and not costing:  # a lesson in every run that failed it (observe/check.Check.lesson)
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
            verdicts.append(as_lesson(exp, accuracy_vs_ws1(exp, ws, exp.accuracy_delta, mean_of(
                1, exp.accuracy_metric, base_runs), mean_of(ws, exp.accuracy_metric))))
        if ws in exp.efficiency_min:
            verdicts += efficiency_verdicts(exp, ws, ok.get(ws, []), base_runs, references)
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
