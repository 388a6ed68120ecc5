"""`distlab grade`: run each lab at each world size, then compare the records with a profile.

Runs go through the same path as `distlab run` (real launchers, one run directory each).
Every comparison becomes one verdict row: measured, expected, pass/fail. Per run: the
record's own correctness checks, the checks the profile requires, metric bands and the
time budget. Across world sizes: accuracy within a delta of world size 1 (the LR scaling
rule should keep it), and scaling efficiency T(n) / (n T(1)).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.profiles import Band, LabExpectation, Profile
from harness.stats import efficiency as scaling_efficiency
from harness.stats import mean_ci


@dataclass(frozen=True)
class Verdict:
    lab: str
    world_size: int | None  # None: a check across world sizes
    check: str
    measured: str
    expected: str
    passed: bool | None  # None: not applicable here (said why in detail)
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Sample:
    """One run as the grader sees it: the harness's run.json and the lab's record."""

    run_dir: str
    status: str
    reason: str | None
    wall_seconds: float
    record: dict[str, Any] | None


def _metric(record: dict[str, Any] | None, name: str) -> float | None:
    value = (record or {}).get("metrics", {}).get(name)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def band_verdict(lab: str, world_size: int, band: Band, samples: list[Sample]) -> Verdict:
    values = [_metric(s.record, band.metric) for s in samples]
    expected = band.describe(world_size)
    if any(v is None for v in values):
        return Verdict(lab, world_size, band.metric, "missing", expected, False,
                       f"the record lacks metrics.{band.metric} (a number); see labs/README.md")
    if band.expected:
        if world_size not in band.expected:
            return Verdict(lab, world_size, band.metric, _fmt(mean_ci(values).mean), expected, None,
                           f"the profile has no expectation for world size {world_size}")
        # Throughput is noisy: pass unless the whole 95% interval lies below the threshold.
        interval = mean_ci(values)
        threshold = band.at_least_fraction * band.expected[world_size]
        return Verdict(lab, world_size, band.metric, str(interval), expected, interval.high >= threshold,
                       f"threshold {threshold:.4g}; {interval.n} sample(s), 95% CI [{interval.low:.4g}, "
                       f"{interval.high:.4g}]")
    mean = mean_ci(values).mean
    if band.value is not None:
        passed = abs(mean - band.value) <= band.tolerance
    else:
        passed = (band.min is None or mean >= band.min) and (band.max is None or mean <= band.max)
    return Verdict(lab, world_size, band.metric, _fmt(mean), expected, passed,
                   f"mean of {len(values)} run(s)" if len(values) > 1 else "")


def evaluate_cell(exp: LabExpectation, world_size: int, samples: list[Sample]) -> list[Verdict]:
    """Everything checked on the runs of one lab at one world size."""
    lab = exp.lab
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
    slowest = max(s.wall_seconds for s in samples)
    verdicts.append(Verdict(lab, world_size, "time", f"{slowest:.1f} s", f"<= {exp.time_budget_s:g} s",
                            slowest <= exp.time_budget_s, "slowest run's wall time"))
    ok_samples = [s for s in samples if s.status == "ok"]
    for band in exp.bands:
        if not ok_samples:
            verdicts.append(Verdict(lab, world_size, band.metric, "-", band.describe(world_size), False,
                                    "no successful run to measure"))
        else:
            verdicts.append(band_verdict(lab, world_size, band, ok_samples))
    return verdicts


def evaluate_across(exp: LabExpectation, cells: dict[int, list[Sample]]) -> list[Verdict]:
    """Accuracy invariance and throughput scaling, both against world size 1."""
    verdicts: list[Verdict] = []
    ok = {ws: [s for s in samples if s.status == "ok"] for ws, samples in cells.items()}

    def mean_of(ws: int, metric: str) -> float | None:
        values = [_metric(s.record, metric) for s in ok.get(ws, [])]
        return None if not values or None in values else mean_ci(values).mean  # type: ignore[arg-type]

    for ws in sorted(cells):
        if ws == 1:
            continue
        if exp.accuracy_delta is not None:
            base, here = mean_of(1, exp.accuracy_metric), mean_of(ws, exp.accuracy_metric)
            if base is None or here is None:
                verdicts.append(Verdict(exp.lab, ws, "accuracy_vs_ws1", "-", f"within {exp.accuracy_delta:g}",
                                        None, "needs successful runs with final accuracy at world sizes 1 and "
                                              f"{ws}"))
            else:
                verdicts.append(Verdict(exp.lab, ws, "accuracy_vs_ws1", f"{here - base:+.3f}",
                                        f"within ±{exp.accuracy_delta:g}", abs(here - base) <= exp.accuracy_delta,
                                        f"{exp.accuracy_metric} {here:.3f} at {ws} vs {base:.3f} at 1"))
        if ws in exp.efficiency_min:
            base, here = mean_of(1, exp.throughput_metric), mean_of(ws, exp.throughput_metric)
            if not base or here is None:
                verdicts.append(Verdict(exp.lab, ws, "efficiency", "-", f">= {exp.efficiency_min[ws]:g}", None,
                                        f"needs {exp.throughput_metric} at world sizes 1 and {ws}"))
            else:
                efficiency = scaling_efficiency(here, ws, base)
                verdicts.append(Verdict(exp.lab, ws, "efficiency", f"{efficiency:.3f}",
                                        f">= {exp.efficiency_min[ws]:g}", efficiency >= exp.efficiency_min[ws],
                                        f"T({ws}) / ({ws} T(1)) with T = {exp.throughput_metric}"))
    return verdicts


@dataclass
class GradePlan:
    profile: Profile
    labs: list[str]
    world_sizes: list[int] | None  # None: each lab's own list from the profile
    repeats: int
    programs: dict[str, Path]
    results_root: Path
    timeout_s: float | None

    def cells(self) -> list[tuple[str, int]]:
        planned = []
        from harness.labs import LABS

        for lab in self.labs:
            exp = self.profile.labs[lab]
            # Expectations exist only where the profile has them: --world-sizes selects among those.
            sizes = [ws for ws in exp.world_sizes if not self.world_sizes or ws in self.world_sizes]
            limit = LABS[lab].max_world_size
            planned += [(lab, ws) for ws in sizes if limit is None or ws <= limit]
        return planned


def sample_of(result: Any) -> Sample:
    return Sample(str(result.run_dir), result.status, result.reason, result.wall_seconds, result.record)


def execute(plan: GradePlan, build_request: Any, run_lab: Any, progress: Any = None,
            done: dict[tuple[str, int], list[Sample]] | None = None) -> dict[tuple[str, int], list[Sample]]:
    """Run every planned cell `repeats` times; build_request/run_lab are the CLI's own.

    Samples go into `done` as each run ends, so a caller that is interrupted keeps them.
    """
    done = {} if done is None else done
    cells = plan.cells()
    for index, (lab, ws) in enumerate(cells, 1):
        exp = plan.profile.labs[lab]
        for repeat in range(1, plan.repeats + 1):
            request = build_request(lab, ws, exp.args_at(ws), launcher=exp.launcher if ws > 1 else None,
                                    backend=exp.backend, timeout_s=plan.timeout_s or exp.time_budget_s * 2,
                                    results_root=plan.results_root, program=plan.programs.get(lab))
            label = f"[{index}/{len(cells)}] {lab} ws={ws} run {repeat}/{plan.repeats}"
            started = time.monotonic()

            def on_line(line: str, label: str = label, started: float = started) -> None:
                if progress is not None:
                    progress(f"{label} {time.monotonic() - started:4.0f}s  {line.strip()[:70]}")

            if progress is not None:
                progress(label)
            done.setdefault((lab, ws), []).append(sample_of(run_lab(request, echo=False, on_line=on_line)))
    return done


def evaluate(plan: GradePlan, done: dict[tuple[str, int], list[Sample]]) -> list[Verdict]:
    verdicts = []
    for lab in plan.labs:
        exp = plan.profile.labs[lab]
        cells = {ws: samples for (name, ws), samples in done.items() if name == lab}
        for ws in sorted(cells):
            verdicts += evaluate_cell(exp, ws, cells[ws])
        verdicts += evaluate_across(exp, cells)
    return verdicts


def harness_overhead(wall_seconds: float, done: dict[tuple[str, int], list[Sample]]) -> float:
    """Total wall time over the sum of the lab runs' wall times (1.0: no overhead)."""
    runs = sum(s.wall_seconds for samples in done.values() for s in samples)
    return wall_seconds / runs if runs else float("nan")


def in_github_actions() -> Path | None:
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    return Path(summary) if summary else None
