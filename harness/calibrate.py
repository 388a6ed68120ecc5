"""`distlab calibrate`: measure this host and write a profile of expected results.

For course staff on their reference hardware. The labs run exactly as `distlab grade`
runs them (same arguments, taken from a template profile), K times each, and each band
is derived from the spread that was measured:

- throughput (img_per_sec or the lab's metric): expected = mean of the K runs;
  at_least_fraction = (mean - 3 sd) / mean, clamped to [0.3, 0.7]: a healthy rerun on
  the same host stays above it, a run at a third of the speed does not. The cap: two or
  three repeats underestimate the spread of a shared machine (a rerun here at 0.88 of the
  calibrated mean was seen to fail a 0.881 band).
- accuracy: min = lowest run - max(3 sd, 0.05); max = 1.0. accuracy_delta across world
  sizes = max(0.05, 3 x the largest sd, 1.25 x the largest gap to world size 1 measured):
  short runs with a larger global batch take fewer optimizer steps and lag behind, so the
  reference host's own gap is the floor; a run that loses more than that fails.
- scaling efficiency: at least 0.7 x the measured efficiency.
- time budget: 3 x the slowest run + 30 s.
- required checks: every check the labs' records carried.
"""

from __future__ import annotations

import datetime as dt
import platform
import statistics
from pathlib import Path
from typing import Any

import tomli_w

from harness.grade import Sample, _metric
from harness.profiles import Profile
from harness.stats import mean_ci

ACCURACY = "final_accuracy"


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def derive_lab(template: dict[str, Any], exp_metric: str, cells: dict[int, list[Sample]]) -> dict[str, Any]:
    """The profile table of one lab from its measured runs (see the module docstring)."""
    table = dict(template)
    table.pop("metrics", None)
    table.pop("efficiency_min", None)
    table.pop("accuracy_delta", None)
    slowest = max(s.wall_seconds for samples in cells.values() for s in samples)
    table["time_budget_s"] = round(3 * slowest + 30)
    checks = sorted({name for samples in cells.values() for s in samples
                     for name in (s.record or {}).get("checks", {})})
    table["required_checks"] = checks
    metrics: dict[str, Any] = {}
    throughput = {ws: [v for s in samples if (v := _metric(s.record, exp_metric)) is not None]
                  for ws, samples in cells.items()}
    if any(throughput.values()):
        expected, fractions = {}, []
        for ws, values in sorted(throughput.items()):
            if values:
                mean = mean_ci(values).mean
                expected[str(ws)] = round(mean, 4)
                fractions.append((mean - 3 * _sd(values)) / mean if mean else 0.3)
        metrics[exp_metric] = {"expected": expected,
                               "at_least_fraction": round(min(0.7, max(0.3, min(fractions))), 3)}
        if "1" in expected:
            table["efficiency_min"] = {ws: round(0.7 * expected[ws] / (int(ws) * expected["1"]), 3)
                                       for ws in expected if ws != "1"}
    accuracy = {ws: [v for s in samples if (v := _metric(s.record, ACCURACY)) is not None]
                for ws, samples in cells.items()}
    if any(accuracy.values()):
        lowest = min(min(v) for v in accuracy.values() if v)
        spread = max(_sd(v) for v in accuracy.values() if v)
        metrics[ACCURACY] = {"min": round(max(0.0, lowest - max(3 * spread, 0.05)), 3), "max": 1.0}
        base = accuracy.get(1)
        if base and len(accuracy) > 1:
            gap = max(abs(statistics.fmean(v) - statistics.fmean(base)) for v in accuracy.values() if v)
            table["accuracy_delta"] = round(max(0.05, 3 * spread, 1.25 * gap), 3)
    if metrics:
        table["metrics"] = metrics
    return table


def build_profile(name: str, template: Profile, template_data: dict[str, Any],
                  done: dict[tuple[str, int], list[Sample]], repeats: int, host: dict[str, Any],
                  versions: dict[str, Any]) -> dict[str, Any]:
    labs = {}
    for lab in sorted({lab for lab, _ in done}):
        cells = {ws: samples for (name_, ws), samples in done.items() if name_ == lab}
        labs[lab] = derive_lab(template_data["labs"][lab], template.labs[lab].throughput_metric, cells)
        labs[lab]["world_sizes"] = sorted(cells)
    return {
        "name": name,
        "description": f"measured by distlab calibrate on {host['cpu_model']}"
                       + (f" with {host['gpus']} x {host['gpu_models'][0]}" if host["gpus"] else ""),
        "provisional": False,
        "auto_select": True,
        "measured": {
            "where": f"{platform.node()}: {host['cpu_model']}, {host['cores']} cores, "
                     + (f"{host['gpus']} x {host['gpu_models'][0]}" if host["gpus"] else "no GPU"),
            "how": f"distlab calibrate --profile {name} --repeats {repeats} (template {template.name}); "
                   "bands derived as described in harness/calibrate.py",
            "date": dt.date.today().isoformat(),
            "repeats": repeats,
            "versions": {k: v for k, v in versions.items() if v is not None},
        },
        "match": {"gpus": host["gpus"], **({"gpu_model": host["gpu_models"][0]} if host["gpus"] else {}),
                  "min_cores": host["cores"]},
        "labs": labs,
    }


def write_profile(path: Path, data: dict[str, Any]) -> None:
    """A new file only: an existing profile is never overwritten."""
    with path.open("xb") as handle:
        handle.write(b"# Written by `distlab calibrate`; review, then commit.\n")
        handle.write(tomli_w.dumps(data).encode())
