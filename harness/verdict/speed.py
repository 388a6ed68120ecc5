"""The speed rule: how every speed row of a grade is judged.

Every speed row follows one rule (speed_rule): a ratio over the runs (each run over the reference
measured beside it, or over a number of the profile) with its 95% interval; passed when the
interval lies above the floor, failed when it lies below, and otherwise "not comparable", with the
interval, the interference measured during the runs, and what to do. A grade that can run more pairs
does so first (grading/execute.py, within the profile's speed_budget_s).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from harness.run.cpu_time import OTHERS_TOLERANCE, contended
from harness.verdict.stats import Interval, ratio_interval
from harness.verdict.verdicts import Sample, Verdict, above


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
