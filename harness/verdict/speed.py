"""The speed rule: how every speed row of a grade is judged.

Every speed row follows one rule (speed_rule): a ratio over the runs (each run over the reference
measured beside it, or over a number of the profile) with its 95% interval; passed when the
interval lies above the floor, failed when it lies below, and otherwise "not comparable", with the
interval, the interference measured during the runs, and what to do. A grade that can run more pairs
does so first (grading/execute.py, within the profile's speed_budget_s).

The speed rows of a grade are judged here (ratio_verdict, fraction_verdict, time_verdict,
efficiency_verdicts), and beside them is how `distlab calibrate` makes the bands they judge from the
runs measured on the reference host (ratio_band, fraction_band, efficiency_floors, time_budget): a
floor is set here once, for the band that is written and the row that judges it.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any

from harness.console import fmt
from harness.run.cpu_time import OTHERS_TOLERANCE, contended
from harness.verdict.expectations import Band, LabExpectation
from harness.verdict.stats import Interval, mean_ci, ratio_interval, ratio_of_intervals, spread
from harness.verdict.stats import efficiency as scaling_efficiency
from harness.verdict.verdicts import Sample, Verdict, above, as_lesson, below, failures, sample_metric


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


NOT_COMPARABLE = "not comparable"


def not_comparable(verdict: Verdict, why: str) -> Verdict:
    """A speed row whose conditions cannot support a verdict: neither passed nor failed, and why."""
    return dataclasses.replace(verdict, measured=NOT_COMPARABLE, passed=None, margin=None,
                               detail=f"{NOT_COMPARABLE}: {why}; measured {verdict.measured} ({verdict.detail})")


def unjudged(verdicts: list[Verdict]) -> dict[str, list[str]]:
    """The speed rows not comparable, by reason: what a grade says at its end."""
    reasons: dict[str, list[str]] = {}
    for v in verdicts:
        if v.measured == NOT_COMPARABLE:
            why = v.detail.removeprefix(f"{NOT_COMPARABLE}: ").split("; measured ", 1)[0]
            reasons.setdefault(why, []).append(f"{v.lab} ws={v.world_size} {v.check}")
    return reasons


@dataclass(frozen=True)
class Interference:
    """What other work did on the cores during a cell's runs, the most any run saw (run/cpu_time.py):
    the cores other processes kept busy, the cores a hypervisor stole, the host's run queue."""

    others_cores: float | None = None
    steal_cores: float | None = None
    run_queue: float | None = None
    cores: int | None = None
    # Whether, in some run, the other processes and the run's own ranks x threads wanted more than
    # our CPUs by over OTHERS_TOLERANCE (a quota's share of a big host beside busy tenants on other
    # CPUs does not count), or a hypervisor stole that much.
    contended: bool = False

    def busy(self) -> bool:
        return self.contended

    def __str__(self) -> str:
        if self.others_cores is None and self.run_queue is None:
            return "not measured"
        parts = [] if self.others_cores is None else [
            f"others kept {self.others_cores:.2f} of {self.cores or '?'} core(s) busy"]
        if self.steal_cores:
            parts.append(f"steal {self.steal_cores:.2f} core(s)")
        if self.run_queue is not None:
            parts.append(f"run queue {self.run_queue:.1f}")
        return ", ".join(parts)


def _count(value: Any) -> Any:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def interference(samples: list[Sample]) -> Interference:
    def most(key: str) -> float | None:
        values = [v for s in samples if isinstance(s.cpu, dict) if (v := _count(s.cpu.get(key))) is not None]
        return max(values) if values else None

    crowded = any(contended(sample.cpu) for sample in samples if isinstance(sample.cpu, dict))
    cores = most("cores")
    return Interference(most("others_cores"), most("steal_cores"), most("run_queue"),
                        None if cores is None else int(cores), crowded)


PASS, FAIL, UNDECIDED, BIASED = "pass", "fail", "undecided", "biased"
REACHES = "reaches the floor"  # what an UNDECIDED row says: more pairs may decide it (speed_undecided)


def speed_rule(ratios: list[float], floor: float, seen: Interference, alike: bool) -> tuple[str, Interval]:
    """The one rule of every speed row: PASS when the 95% interval of the ratios lies above the
    floor, FAIL when it lies below, UNDECIDED while it reaches the floor (more pairs may tell), and
    BIASED where it lies below but the runs were not compared `alike` (a lab against a plain loop
    or a number of the profile) and other work was busy beside them: coupled ranks wait for the
    rank the scheduler left out, an independent loop does not (issue 48: the course's ddp lab at
    0.319 of its loop against a floor of 0.35 with 1.5 to 1.9 of 2 cores busy). A student's program
    against the course lab is the same work interleaved (`alike`): the interval alone decides."""
    interval = ratio_interval(ratios)
    if interval.low >= floor:
        return PASS, interval
    if interval.high < floor:
        return (BIASED if not alike and seen.busy() else FAIL), interval
    return UNDECIDED, interval


def span(interval: Interval) -> str:
    high = "inf" if interval.high == float("inf") else f"{interval.high:.3f}"
    return f"[{interval.low:.3f}, {high}]"


def speed_verdict(lab: str, world_size: int, check: str, expected: str, ratios: list[float], floor: float,
                  samples: list[Sample], alike: bool, how: str, scale: float = 1.0) -> Verdict:
    """A speed row by speed_rule: `ratios` over `floor`, shown (times `scale`) with the interval and
    the interference of the `samples` measured."""
    seen = interference(samples)
    state, interval = speed_rule(ratios, floor, seen, alike)
    measured = f"{interval.mean * scale:.3f}"
    shown = Interval(interval.mean * scale, interval.low * scale, interval.high * scale, interval.n)
    detail = f"{how}; 95% interval {span(shown)} over {interval.n}; interference: {seen}"
    if state == PASS:
        return Verdict(lab, world_size, check, measured, expected, True, detail,
                       margin=above(interval.low, floor), interference=str(seen))
    verdict = Verdict(lab, world_size, check, measured, expected, False, detail,
                      margin=above(interval.high, floor), interference=str(seen))
    if state == FAIL:
        return verdict
    if state == BIASED:
        return not_comparable(verdict, f"below the floor, but other work ran beside the runs ({seen}) and slows "
                                       "the lab and its reference unlike each other: run again on a quieter machine")
    return not_comparable(verdict, f"the interval {span(shown)} of {interval.n} run(s) {REACHES} "
                                   f"{floor * scale:g}: run again with more repeats (--repeats) or on a quieter "
                                   f"machine ({seen})")



def ratio_verdict(lab: str, world_size: int, band: Band, samples: list[Sample], values: list[float],
                  expected: str, reference: float | None, alike: bool) -> Verdict:
    """An at_least_ratio band over the `values` of the `samples`, a speed row (speed_rule): the
    interval of the ratios against the floor. A ratio is over the paired reference where the runs
    carry their own (each run over the reference measured beside it in time: a busy moment slows
    both), else over the cell's reference rate (`reference`). `alike`: the reference is the same work
    (the course's lab beside a student's program)."""
    if world_size not in band.at_least_ratio:
        return Verdict(lab, world_size, f"{band.metric}_ratio", "-", expected, None,
                       f"the profile has no expectation for world size {world_size}")
    check, floor = f"{band.metric}_ratio", band.at_least_ratio[world_size]
    paired = [(v, s.reference) for v, s in zip(values, samples, strict=True) if s.reference]
    if paired:
        ratios = [v / r for v, r in paired]
        how = (f"geometric mean of {len(ratios)} paired ratio(s) ({', '.join(f'{r:.3f}' for r in ratios)}), "
               f"each run's {band.metric} over the reference measured around it in this grade "
               f"(median {statistics.median(values):.4g} against "
               f"{statistics.median(r for _, r in paired):.4g})")
    elif reference:
        ratios = [v / reference for v in values]
        how = (f"geometric mean of {len(ratios)} run(s): {statistics.median(values):.4g} {band.metric} "
               f"against the reference's {reference:.4g}, measured in this grade on this machine")
    else:
        return Verdict(lab, world_size, check, "-", expected, False,
                       "the reference loop did not run successfully, so throughput could not be judged")
    if any(r <= 0 for r in ratios):
        return Verdict(lab, world_size, check, "0", expected, False, f"a run measured no {band.metric}")
    return speed_verdict(lab, world_size, check, expected, ratios, floor, samples, alike, how)


def fraction_verdict(lab: str, world_size: int, band: Band, fraction: float, samples: list[Sample],
                     values: list[float], expected: str) -> Verdict:
    """An expected + at_least_fraction band (`fraction`) over the `values` of the `samples`, a speed
    row (speed_rule): each run over `fraction` x the profile's expected rate, against 1."""
    if world_size not in band.expected:
        return Verdict(lab, world_size, band.metric, fmt(mean_ci(values).mean), expected, None,
                       f"the profile has no expectation for world size {world_size}")
    threshold = fraction * band.expected[world_size]
    if any(v <= 0 for v in values):
        return Verdict(lab, world_size, band.metric, "0", expected, False, f"a run measured no {band.metric}")
    # The profile's number, against runs of this grade: a busy machine may explain a slow one.
    return speed_verdict(lab, world_size, band.metric, expected, [v / threshold for v in values],
                         1.0, samples, False, f"threshold {threshold:.4g}; {len(values)} run(s)", threshold)


def time_verdict(exp: LabExpectation, world_size: int, samples: list[Sample]) -> Verdict:
    """The time budget, a speed row by the same rule with a one-sided interval: other work only ever
    slows a run, so the slowest run within the budget passes whatever ran beside it; over it, it
    fails where the cores were the run's own, and is not comparable where they were crowded (the
    run's own ranks x threads past its cores, or other work busy beside it). A run that timed out
    still fails its "run" row."""
    lab, budget = exp.lab, exp.time_budget_s
    ok_samples = [s for s in samples if s.status == "ok"]
    failed = [s for s in samples if s.status != "ok"]
    slowest = max(s.wall_seconds for s in samples)
    seen = interference(samples)
    if not ok_samples and slowest <= budget:  # a crash's wall time says nothing of the program's speed
        return Verdict(lab, world_size, "time", f"{slowest:.1f} s", f"<= {budget:g} s", None,
                       f"not judged: no run finished well ({failures(failed)})")
    why = next((s.start_up for s in samples if s.wall_seconds == slowest and s.start_up), "")
    verdict = Verdict(lab, world_size, "time", f"{slowest:.1f} s", f"<= {budget:g} s", slowest <= budget,
                      "slowest run's wall time" + ("" if ok_samples else f"; no run finished well "
                                                   f"({failures(failed)})") + (
                          f"; of it, {why}" if why and slowest > budget else "") + f"; interference: {seen}",
                      margin=below(slowest, budget), interference=str(seen))
    if verdict.passed:
        return verdict
    crowded = speed_not_judged(samples) or (f"other work ran beside the runs ({seen}): run again on a quieter "
                                            "machine" if seen.busy() else None)
    return not_comparable(verdict, crowded) if crowded else verdict


def efficiency_verdicts(exp: LabExpectation, ws: int, runs: list[Sample], base_runs: list[Sample],
                        references: dict[int, float | None]) -> list[Verdict]:
    """Scaling efficiency T(n) / (n T(1)) by speed_rule, its interval over the runs at both ends.
    Where the throughput is a ratio to a reference, over the reference's own: each run's rate over
    its paired reference (else the cell's reference rate), so (T(n)/R(n)) / (T(1)/R(1))."""
    floor = exp.efficiency_min[ws]
    name = exp.throughput_metric

    def rates(samples: list[Sample], at: int) -> list[float] | None:
        values = [sample_metric(s, name) for s in samples]
        if not values or any(v is None or v <= 0 for v in values):
            return None
        if not (exp.reference and references.get(1) and references.get(ws)):
            return values  # type: ignore[return-value]
        return [v / (s.reference or references[at]) for v, s in zip(values, samples, strict=True)]  # type: ignore[operator]

    top, bottom = rates(runs, ws), rates(base_runs, 1)
    if top is None or bottom is None:
        return [Verdict(exp.lab, ws, "efficiency", "-", f">= {floor:g}", None,
                        f"needs {name} at world sizes 1 and {ws}")]
    over_loop = bool(exp.reference and references.get(1) and references.get(ws))
    interval = ratio_of_intervals(top, bottom)
    scale = 1.0 if over_loop else 1.0 / ws
    how = f"T({ws}) / ({ws} T(1)) with T = {name}" \
        + (f" (T(1): the {exp.single_device}'s)" if exp.single_device else "") \
        + (", each run over its reference's rate: over the reference's own scaling" if over_loop else "")
    seen = interference([*runs, *base_runs])
    shown = Interval(interval.mean * scale, interval.low * scale, interval.high * scale, interval.n)
    state = PASS if shown.low >= floor else UNDECIDED if shown.high >= floor else \
        BIASED if not exp.reference_alike and seen.busy() else FAIL
    detail = f"{how}; 95% interval {span(shown)} over {len(top)} and {len(bottom)} run(s); interference: {seen}"
    verdict = Verdict(exp.lab, ws, "efficiency", f"{shown.mean:.3f}", f">= {floor:g}", state == PASS, detail,
                      margin=above(shown.low if state == PASS else shown.high, floor), interference=str(seen))
    crowded = speed_not_judged(runs) or speed_not_judged(base_runs) or (
        f"below the floor, but other work ran beside the runs ({seen}): run again on a quieter machine"
        if state == BIASED else f"the interval {span(shown)} {REACHES} {floor:g}: run again with more "
        f"repeats (--repeats) or on a quieter machine ({seen})" if state == UNDECIDED else None)
    return [not_comparable(verdict, crowded) if crowded else as_lesson(exp, verdict)]


# How calibrate derives the speed bands above from the runs it measured on the reference host.
RATIO_FLOOR = 0.6  # of the ratio to the reference measured there: another CPU's input pipeline may weigh more
# An absolute rate's floor, as a fraction of the mean measured: this many sd below it, within these bounds.
FRACTION_SPREADS = 3
FRACTION_LOW, FRACTION_HIGH = 0.3, 0.7
EFFICIENCY_FLOOR = 0.5  # of the efficiency measured there: a faster CPU makes communication weigh more
# Machines of one kind differ up to 8x in CPU speed; the budget is a hang guard, not a speed band.
TIME_BUDGET_FACTOR = 8
TIME_BUDGET_GRACE_S = 60


def throughput_means(throughput: dict[int, list[float]]) -> dict[int, float]:
    """The mean rate of each world size that measured one, by world size."""
    return {ws: mean_ci(values).mean for ws, values in sorted(throughput.items()) if values}


def ratio_band(throughput: dict[int, list[float]], means: dict[int, float],
               references: dict[int, float | None]) -> dict[str, Any]:
    """The at_least_ratio band of a lab with a reference loop: per world size, RATIO_FLOOR x the
    median ratio of the lab to the reference measured in the same run. A ratio carries from one CPU to
    another where img/s does not (they differ up to 8x); RATIO_FLOOR leaves room for a CPU whose input
    pipeline weighs more, and still fails a program at half speed."""
    ratios = {ws: statistics.median(throughput[ws]) / rate for ws in means if (rate := references.get(ws))}
    # A lab is never truly faster than the bare loop of its own work: a ratio above 1 is the
    # noise of two short runs (all-reduce: 1.52 and 1.40 once here), and no floor is built on it.
    return {"at_least_ratio": {str(ws): round(RATIO_FLOOR * min(r, 1.0), 3) for ws, r in ratios.items()}}


def fraction_band(throughput: dict[int, list[float]], means: dict[int, float]) -> dict[str, Any] | None:
    """The expected + at_least_fraction band of a lab without a reference (calibrated GPU profiles):
    expected = the mean of the runs; at_least_fraction = (mean - 3 sd) / mean, within [0.3, 0.7];
    0.3 where a world size ran once (no spread measured is not no spread: one run's band failed the
    next honest run at 0.60 x the first, the CPU proxy of the GPU acceptance on a shared machine).
    None where no world size measured a rate above 0."""
    # A rate of 0 is no speed to keep: bus bandwidth at world size 1 is 0 by its definition
    # (2(n-1)/n of the algorithm bandwidth), and "0 >= 0.3 x 0" judged nothing.
    judged = {ws: m for ws, m in means.items() if m > 0}
    if not judged:
        return None
    fractions = [(m - FRACTION_SPREADS * spread(throughput[ws])) / m if len(throughput[ws]) > 1 else FRACTION_LOW
                 for ws, m in judged.items()]
    return {"expected": {str(ws): round(m, 4) for ws, m in judged.items()},
            "at_least_fraction": round(min(FRACTION_HIGH, max(FRACTION_LOW, min(fractions))), 3)}


def efficiency_floors(means: dict[int, float], single_device: list[float] | None,
                      references: dict[int, float | None], over_reference: bool) -> dict[str, float] | None:
    """The efficiency_min band: EFFICIENCY_FLOOR x the scaling efficiency measured, per world size
    above 1; with a reference loop, the efficiency over the loop's own, where it ran at both sizes, as
    the grade judges it (efficiency_verdicts). `single_device`: the rates of the runs standing
    for world size 1 when they are another row's. None without a rate at world size 1."""
    means = dict(means)
    if single_device is not None:
        means[1] = mean_ci(single_device).mean if single_device else 0.0
    if not (1 in means and means[1]):
        return None
    efficiency = {ws: scaling_efficiency(means[ws], ws, means[1]) for ws in means if ws != 1}
    if over_reference:
        efficiency = {ws: e / scaling_efficiency(loop, ws, alone) for ws, e in efficiency.items()
                      if (loop := references.get(ws)) and (alone := references.get(1))}
    return {str(ws): round(EFFICIENCY_FLOOR * e, 3) for ws, e in efficiency.items()}


def time_budget(samples: list[Sample]) -> int:
    """The time_budget_s band (judged by time_verdict): TIME_BUDGET_FACTOR x the slowest run
    + TIME_BUDGET_GRACE_S, a guard against hangs on the slowest CPU of a kind."""
    return round(TIME_BUDGET_FACTOR * max(s.wall_seconds for s in samples) + TIME_BUDGET_GRACE_S)
