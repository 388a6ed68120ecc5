"""`distlab calibrate`: measure this host and write a profile of expected results.

For course staff on their reference hardware. The labs run exactly as `distlab grade` runs them
(same arguments, taken from a template profile), K times each, and each band is derived from
what was measured:

- throughput of a lab whose template names a `reference` (every CPU profile): at_least_ratio per
  world size = 0.6 x the median ratio of the lab to its reference loop measured in the same run
  (a ratio above 1 counts as 1: the lab does the loop's work and more).
  A ratio carries from one CPU to another where img/s does not (they differ up to 8x); the 0.6
  leaves room for a CPU whose input pipeline weighs more, and still fails a program at half speed.
- throughput without a reference (calibrated GPU profiles): expected = mean of the K runs;
  at_least_fraction = (mean - 3 sd) / mean, clamped to [0.3, 0.7]; 0.3 where a world size ran once
  (no spread measured is not no spread: one run's band failed the next honest run at 0.60 x the first,
  the CPU proxy of the GPU acceptance on a shared machine).
- accuracy (the harness's own measurement of rank 0's final weights, where it made one): min =
  lowest run - max(3 sd, 0.1); max = 1.0; none when no run got 0.1 above chance (a smoke run too
  short to learn: such a band could not fail). accuracy_delta across world sizes is
  0.05, the course's rule for the same global batch, whatever this host measured (a larger gap
  is reported as a warning: a lesson to fix, never a band to widen).
- scaling efficiency: at least 0.5 x the measured efficiency (a faster CPU makes communication
  weigh more); with a reference loop, the efficiency over the loop's own, as the grade judges it
  (harness/verdict/evaluate.py).
- time budget: 8 x the slowest run + 60 s, a guard against hangs on the slowest CPU of a kind.
- required checks: every check the labs' records carried.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import tempfile
from pathlib import Path
from typing import Any

import tomli_w

from harness.catalog import LABS
from harness.commands import grade_options
from harness.console import console
from harness.grading.execute import execute
from harness.usage import UsageError
from harness.verdict import profiles
from harness.verdict.evaluate import row_baseline
from harness.verdict.expectations import Profile
from harness.verdict.pairing import reference_rates
from harness.verdict.stats import efficiency as scaling_efficiency
from harness.verdict.stats import mean_ci
from harness.verdict.verdicts import Sample, sample_metric
from labs.common.host import fingerprint
from labs.common.provenance import versions as library_versions

EXAMPLES = """examples:
  distlab calibrate --profile my-host --repeats 3  # writes ./profiles/my-host.toml
  distlab grade --profile profiles/my-host.toml"""

ACCURACY = "final_accuracy"
ACCURACY_DELTA = 0.05  # at the same global batch, every world size within this of world size 1
CHANCE = 0.1  # the training labs' 10 classes
ACCURACY_MARGIN = 0.1  # below the lowest accuracy measured here: another CPU's float rounding trains a little apart
RATIO_FLOOR = 0.6  # of the ratio to the reference measured here: another CPU's input pipeline may weigh more
EFFICIENCY_FLOOR = 0.5  # of the efficiency measured here: a faster CPU makes communication weigh more
TIME_BUDGET_FACTOR = 8  # machines of one kind differ up to 8x in CPU speed; the budget is a hang guard


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def derive_lab(template: dict[str, Any], exp_metric: str, cells: dict[int, list[Sample]],
               references: dict[int, float | None] | None = None, observed: bool = False,
               single_device: list[Sample] | None = None) -> dict[str, Any]:
    """The profile table of one lab from its measured runs (see the module docstring).
    `references`: the reference rate of each world size, for a lab whose template names one (at 1,
    that of the runs standing for world size 1). `observed`: a data-parallel training lab, whose
    checks the harness computes itself from its observations: the record's own checks are then
    claims to compare, not requirements. `single_device`: the world-size-1 runs when they are another
    row's (the template's single_device), as the grade compares them (harness/verdict/evaluate.py)."""
    table = dict(template)
    table.pop("metrics", None)
    table.pop("efficiency_min", None)
    table.pop("accuracy_delta", None)
    slowest = max(s.wall_seconds for samples in cells.values() for s in samples)
    table["time_budget_s"] = round(TIME_BUDGET_FACTOR * slowest + 60)
    checks = sorted({name for samples in cells.values() for s in samples
                     for name in (s.record or {}).get("checks", {})})
    table["required_checks"] = [] if observed else checks
    metrics: dict[str, Any] = {}
    throughput = {ws: [v for s in samples if (v := sample_metric(s, exp_metric)) is not None]
                  for ws, samples in cells.items()}
    if any(throughput.values()) and not template.get("lesson"):  # a lesson row shows an effect: no speed band
        means = {ws: mean_ci(values).mean for ws, values in sorted(throughput.items()) if values}
        if template.get("reference"):
            ratios = {ws: statistics.median(throughput[ws]) / rate for ws in means
                      if (rate := (references or {}).get(ws))}
            # A lab is never truly faster than the bare loop of its own work: a ratio above 1 is the
            # noise of two short runs (all-reduce: 1.52 and 1.40 once here), and no floor is built on it.
            metrics[exp_metric] = {"at_least_ratio": {str(ws): round(RATIO_FLOOR * min(r, 1.0), 3)
                                                      for ws, r in ratios.items()}}
        elif judged := {ws: m for ws, m in means.items() if m > 0}:
            # A rate of 0 is no speed to keep: bus bandwidth at world size 1 is 0 by its definition
            # (2(n-1)/n of the algorithm bandwidth), and "0 >= 0.3 x 0" judged nothing.
            fractions = [(m - 3 * _sd(throughput[ws])) / m if len(throughput[ws]) > 1 else 0.3
                         for ws, m in judged.items()]
            metrics[exp_metric] = {"expected": {str(ws): round(m, 4) for ws, m in judged.items()},
                                   "at_least_fraction": round(min(0.7, max(0.3, min(fractions))), 3)}
        loops = references or {}
        if single_device is not None:
            values = [v for s in single_device if (v := sample_metric(s, exp_metric)) is not None]
            means[1] = mean_ci(values).mean if values else 0.0
        if 1 in means and means[1]:
            efficiency = {ws: scaling_efficiency(means[ws], ws, means[1]) for ws in means if ws != 1}
            if template.get("reference"):  # over the loop's own scaling, where it ran at both sizes
                efficiency = {ws: e / scaling_efficiency(loop, ws, alone) for ws, e in efficiency.items()
                              if (loop := loops.get(ws)) and (alone := loops.get(1))}
            table["efficiency_min"] = {str(ws): round(EFFICIENCY_FLOOR * e, 3) for ws, e in efficiency.items()}
    accuracy = {ws: [v for s in samples if (v := sample_metric(s, ACCURACY)) is not None]
                for ws, samples in cells.items()}
    learned = [v for values in accuracy.values() for v in values]
    if learned and max(learned) < CHANCE + ACCURACY_MARGIN:
        # Runs too short to learn (smoke): an accuracy band here could not fail a program that
        # does not learn either, so there is none; the grade profiles make the labs learn.
        console.print(f"note: {template.get('args')} stays at chance accuracy ({max(learned):.3f}): not graded",
                      markup=False)
    elif template.get("lesson"):
        table["accuracy_delta"] = ACCURACY_DELTA  # the gap is shown beside the lesson, never graded
    elif learned:
        lowest = min(min(v) for v in accuracy.values() if v)
        spread = max(_sd(v) for v in accuracy.values() if v)
        metrics[ACCURACY] = {"min": round(max(0.0, lowest - max(3 * spread, ACCURACY_MARGIN)), 3), "max": 1.0}
        base = accuracy.get(1) if single_device is None else [
            v for s in single_device if (v := sample_metric(s, ACCURACY)) is not None]
        if base and (single_device is not None or len(accuracy) > 1):
            # The course's rule, not the measured gap: the same global batch must reach the same
            # accuracy. A larger gap on the reference host is a lesson to fix, never a band to widen.
            table["accuracy_delta"] = ACCURACY_DELTA
            gap = max(abs(statistics.fmean(v) - statistics.fmean(base)) for v in accuracy.values() if v)
            if gap > ACCURACY_DELTA:
                console.print(f"warning: {template.get('args')} loses {gap:.3f} accuracy across world sizes, more "
                              f"than {ACCURACY_DELTA}: this profile fails its own lab", markup=False)
    if metrics:
        table["metrics"] = metrics
    return table


def build_profile(name: str, template: Profile, template_data: dict[str, Any],
                  done: dict[tuple[str, int], list[Sample]], repeats: int, host: dict[str, Any],
                  versions: dict[str, Any], references: dict[tuple[str, int], float | None] | None = None
                  ) -> dict[str, Any]:
    labs = {}
    for lab in [row for row in template.labs if any(lab == row for lab, _ in done)]:  # the order they run
        cells = {ws: samples for (name_, ws), samples in done.items() if name_ == lab}
        base, rates = row_baseline(template.labs[lab], done, references or {})  # as the grade compares
        labs[lab] = derive_lab(template_data["labs"][lab], template.labs[lab].throughput_metric, cells, rates,
                               observed=LABS[template.labs[lab].catalog_lab].data_parallel, single_device=base)
        labs[lab]["world_sizes"] = sorted(cells)
    return {
        "name": name,
        "description": f"measured by distlab calibrate on {host['cpu_model']}"
                       + (f" with {host['gpus']} x {host['gpu_models'][0]}" if host["gpus"] else ""),
        "provisional": repeats < 2,  # one run per cell: bands without a spread measured, to be measured again
        "auto_select": True,
        # The runs were measured at these threads; graded at any other, the ratios would not hold.
        **({"threads_per_rank": template.threads_per_rank} if template.threads_per_rank else {}),
        "measured": {
            "where": f"{platform.node()}: {host['cpu_model']}, {host['cores']} cores, "
                     + (f"{host['gpus']} x {host['gpu_models'][0]}" if host["gpus"] else "no GPU"),
            "how": f"distlab calibrate --profile {name} --repeats {repeats} (template {template.name}); "
                   "bands derived as described in harness/commands/calibrate.py",
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    grade_options.add_plan_arguments(parser)
    parser.add_argument("--profile", required=True, help="name of the new profile (written to OUTPUT/NAME.toml)")
    parser.add_argument("--template", default="cpu-grade",
                        help="profile whose labs, arguments and world sizes are measured")
    parser.add_argument("--output", type=Path, default=Path("profiles"),
                        help="folder the new profile goes to (yours: the package folder may belong to root)")
    parser.add_argument("--keep-going", action="store_true",
                        help="write the profile from the cells whose runs all passed, naming the others, "
                             "also when stopped (Ctrl-C, SIGTERM)")


def run(args: argparse.Namespace, lab_args: list[str]) -> int:
    """`distlab calibrate`: the template profile's grade plan, run; a new profile from what it measured."""
    if not args.profile.replace("-", "").replace("_", "").isalnum():
        raise UsageError(f"profile name {args.profile!r} may hold only letters, digits, - and _")
    shipped = profiles.PROFILE_DIR / f"{args.profile}.toml"
    if shipped.exists():  # `--profile NAME` would then mean two files
        raise UsageError(f"profile name {args.profile!r} is taken by {shipped}; choose another --profile name")
    target = args.output / f"{args.profile}.toml"
    if target.exists():
        raise UsageError(f"profile {target} exists and is never overwritten; choose another --profile name")
    # Checked before the first run: an unwritable folder found after an hour of measuring helps nobody.
    try:
        args.output.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=args.output, prefix=".distlab-write-test-"):
            pass
    except OSError as error:
        raise UsageError(f"cannot write the profile to {args.output} ({error.strerror}); "
                         "choose a folder you own with --output") from None
    # The plan measures the template's labs, arguments and sizes.
    grade_plan = grade_options.plan_from(args, args.template)
    done: dict[tuple[str, int], list[Sample]] = {}
    references: dict[tuple[str, int], list[Sample]] = {}
    interrupted = None
    try:
        execute(grade_plan, done, references)  # Ctrl-C here writes no profile, unless --keep-going
    except KeyboardInterrupt as stop:
        if not args.keep_going:
            raise
        interrupted = stop
    rates = reference_rates(grade_plan.reference, references)
    failed = [s for samples in done.values() for s in samples if s.status != "ok"]
    if failed and not args.keep_going:
        console.print(f"calibration needs successful runs: {failed[0].run_dir}: {failed[0].reason}", markup=False)
        return 1
    # --keep-going: a cell with a failed run, or not run at all, is left out of the profile, by name.
    left_out = [cell for cell in grade_plan.cells() if cell not in done
                or any(s.status != "ok" for s in done[cell])]
    for lab, ws in left_out:
        reason = next((f"{s.run_dir}: {s.reason}" for s in done.get((lab, ws), []) if s.status != "ok"), "not run")
        console.print(f"left out of the profile: {lab} ws={ws} ({reason})", markup=False)
    done = {cell: samples for cell, samples in done.items() if cell not in left_out}
    if not done:
        console.print("no cell passed: no profile written", markup=False)
        if interrupted is not None:
            raise interrupted
        return 1
    template_data = profiles.tomllib.loads(grade_plan.profile.path.read_text())
    data = build_profile(args.profile, grade_plan.profile, template_data, done, grade_plan.repeats,
                         fingerprint(), library_versions(), rates)
    write_profile(target, data)
    profiles.load_profile(target)  # what we wrote must load
    console.print(f"wrote {target}; grade against it with `distlab grade --profile {target}`, or review it and "
                  "commit it to harness/profiles/", markup=False)
    if interrupted is not None:
        raise interrupted  # the CLI says so and exits 130 (Ctrl-C) or 128 + the signal
    return 1 if left_out else 0
