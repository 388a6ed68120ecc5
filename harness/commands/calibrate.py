"""`distlab calibrate`: measure this host and write a profile of expected results.

For course staff on their reference hardware. The labs run exactly as `distlab grade` runs them
(same arguments, taken from a template profile), K times each, and each band is derived from
what was measured, beside the code that judges it (one home per band kind, its floors with it):

- throughput: with a `reference` (every CPU profile) at_least_ratio per world size, a fraction of
  the median ratio of the lab to its reference loop measured in the same run; without one
  (calibrated GPU profiles) expected and at_least_fraction from the mean and spread of the runs;
  scaling efficiency floors; the time budget, a guard against hangs. The speed rows:
  harness/verdict/speed.py (ratio_band, fraction_band, efficiency_floors, time_budget).
- accuracy: a min below the lowest run, none for runs that stayed at chance; accuracy_delta across
  world sizes, the course's rule whatever this host measured (a larger gap is reported as a
  warning: a lesson to fix, never a band to widen). harness/verdict/accuracy.py (accuracy_bands).
- required checks: every check the labs' records carried (harness/verdict/evaluate.py,
  required_checks).
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import tempfile
from pathlib import Path
from typing import Any

import tomli_w

from harness.catalog import LABS
from harness.commands import grade_options
from harness.console import console
from harness.grading.execute import execute
from harness.usage import UsageError
from harness.verdict import profiles, speed
from harness.verdict.accuracy import accuracy_bands
from harness.verdict.evaluate import required_checks, row_baseline
from harness.verdict.expectations import Profile
from harness.verdict.pairing import reference_rates
from harness.verdict.verdicts import Sample, sample_metric
from labs.common.host import fingerprint
from labs.common.provenance import versions as library_versions

EXAMPLES = """examples:
  distlab calibrate --profile my-host --repeats 3  # writes ./profiles/my-host.toml
  distlab grade --profile profiles/my-host.toml"""

ACCURACY = "final_accuracy"


def derive_lab(template: dict[str, Any], exp_metric: str, cells: dict[int, list[Sample]],
               references: dict[int, float | None] | None = None, observed: bool = False,
               single_device: list[Sample] | None = None) -> dict[str, Any]:
    """The profile table of one lab from its measured runs, each band as its module derives it (see
    the module docstring). `references`: the reference rate of each world size, for a lab whose
    template names one (at 1, that of the runs standing for world size 1). `observed`: a
    data-parallel training lab, whose checks the harness computes itself from its observations.
    `single_device`: the world-size-1 runs when they are another row's (the template's
    single_device), as the grade compares them (harness/verdict/evaluate.py)."""
    table = dict(template)
    table.pop("metrics", None)
    table.pop("efficiency_min", None)
    table.pop("accuracy_delta", None)
    runs = [s for samples in cells.values() for s in samples]
    table["time_budget_s"] = speed.time_budget(runs)
    table["required_checks"] = required_checks(runs, observed)
    metrics: dict[str, Any] = {}

    def measured(samples: list[Sample], name: str) -> list[float]:
        return [v for s in samples if (v := sample_metric(s, name)) is not None]

    throughput = {ws: measured(samples, exp_metric) for ws, samples in cells.items()}
    if any(throughput.values()) and not template.get("lesson"):  # a lesson row shows an effect: no speed band
        means = speed.throughput_means(throughput)
        over_reference = bool(template.get("reference"))
        band = (speed.ratio_band(throughput, means, references or {}) if over_reference
                else speed.fraction_band(throughput, means))
        if band is not None:
            metrics[exp_metric] = band
        floors = speed.efficiency_floors(means, None if single_device is None else measured(single_device, exp_metric),
                                         references or {}, over_reference)
        if floors is not None:
            table["efficiency_min"] = floors
    accuracy = accuracy_bands({ws: measured(samples, ACCURACY) for ws, samples in cells.items()},
                              None if single_device is None else measured(single_device, ACCURACY),
                              bool(template.get("lesson")))
    if accuracy.at_chance is not None:
        console.print(f"note: {template.get('args')} stays at chance accuracy ({accuracy.at_chance:.3f}): not graded",
                      markup=False)
    if accuracy.delta is not None:
        table["accuracy_delta"] = accuracy.delta
    if accuracy.band is not None:
        metrics[ACCURACY] = accuracy.band
    if accuracy.gap is not None:
        console.print(f"warning: {template.get('args')} loses {accuracy.gap:.3f} accuracy across world sizes, more "
                      f"than {accuracy.delta}: this profile fails its own lab", markup=False)
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
