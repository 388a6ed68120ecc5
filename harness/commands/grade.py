"""`distlab grade`: run each lab at each world size, then compare what was measured with a profile.

    the command line  ->  grading.plan_grade (profile, cells, every request checked)
    ->  grading.run_grade (runner.run_lab per cell and repeat, then the verdicts)
    ->  report (terminal table, Markdown, HTML, JUnit, step summary)

Runs go through the same path as `distlab run` (request.build_request, then runner.run_lab: real
launchers, one run directory each). `--slurm` runs the cells as a Slurm job array instead
(harness/grading/slurm.py) and judges them here the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console

from harness.commands import grade_options
from harness.console import console, duration, print_json
from harness.files import write_json
from harness.grading import disk, slurm, timings
from harness.grading.execute import execute
from harness.grading.judge import Grade, run_grade
from harness.grading.plan import GradePlan
from harness.report import pages
from harness.report.timings import timings_table
from harness.run import slurm_array
from harness.run.launch import dry_run
from harness.run.run_dir import new_run_dir
from harness.verdict.speed import unjudged

EXAMPLES = """examples:
  distlab grade                                    # the profile that fits this host
  distlab grade --profile cpu-smoke --world-sizes 1,2 --labs check,ddp
  distlab grade --program ddp=student_ddp.py --json > grade.json"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    grade_options.add_plan_arguments(parser)
    parser.add_argument("--profile", help="profile name or path to a .toml (default: the one that fits this host)")
    parser.add_argument("--json", action="store_true", help="print the grade's summary as JSON on stdout")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (profile, cells, each launcher command) and start nothing")
    parser.add_argument("--slurm", action="store_true",
                        help="run the cells as a Slurm job array, one task per cell (with --dry-run: print it)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the weights and checkpoints the runs wrote (default: removed once judged, each "
                             "listed with its sha256 in the report folder's weights.json)")
    parser.add_argument("--sbatch-arg", action="append", metavar="ARG",
                        help="--slurm: an sbatch option for the array, e.g. --sbatch-arg=--partition=cpu (repeatable)")
    parser.add_argument("--timings", action="store_true",
                        help="after the grade, where its time went: each run's phases (start, rendezvous, data, "
                             "training, ...), the grade's own steps and what none accounts for (always in --json)")


def show_plan(grade_plan: GradePlan) -> None:
    """--dry-run: the profile chosen, and every run the grade would start, in order; nothing starts."""
    profile = grade_plan.profile
    lines = [f"profile {profile.name} ({profile.path}){' PROVISIONAL' if profile.provisional else ''}: "
             f"{profile.description}", f"{len(grade_plan.cells())} cell(s) x {grade_plan.repeats} repeat(s)"]
    for lab, ws in grade_plan.cells():
        reference = grade_plan.reference(lab, ws)
        reference_request = grade_plan.reference_request(lab, ws)
        if reference and reference_request:
            when = "before each run and after the last" if grade_plan.bracketed(lab) else "before each run"
            command = dry_run(reference_request)
            lines.append(f"{reference.name} for {lab} ws={ws}, {when}: {command}")
        lines.append(f"{lab} ws={ws} x {grade_plan.runs(lab)}: {dry_run(grade_plan.request(lab, ws))}")
    sys.stdout.write("\n".join(lines) + "\n")


def report(grade: Grade, as_json: bool = False, keep: bool = False, show_timings: bool = False,
           began: float | None = None) -> int:
    """The grade's report folder, its table on the terminal; exit 0 when every check passed. The runs'
    weights and checkpoints, judged, are removed (grading/disk.py) unless `keep`. `show_timings`: where
    the grade's time went, as a table after it (grading/timings.py; in the JSON summary either way),
    its wall time counted from `began` (time.monotonic() at the command's start)."""
    writing = time.monotonic()
    grade_plan, profile = grade.plan, grade.plan.profile
    report_dir = new_run_dir(grade_plan.results_root, "grade", max(ws for _, ws in grade_plan.cells()), profile.name)
    summary = {"profile": profile.name, "provisional": profile.provisional, "profile_measured": profile.measured,
               "labs": grade_plan.labs, "repeats": grade_plan.repeats, "runs": grade.runs,
               "reference_runs": sum(len(samples) for samples in grade.references.values()),
               "wall_seconds": grade.wall_seconds, "harness_overhead": grade.overhead,
               "failed": grade.failed, "interrupted": grade.interrupted is not None}
    paths = pages.write_report(report_dir, summary, grade.verdicts, grade.done,
                               {row: exp.single_device for row, exp in profile.labs.items() if exp.single_device})
    console.print(pages.verdict_table(grade.verdicts, f"distlab grade: {profile.name}"))
    for why, rows in unjudged(grade.verdicts).items():  # a speed neither passed nor failed: say why
        console.print(f"speed not comparable ({', '.join(rows)}): {why}", markup=False)
    pages.append_step_summary(paths["markdown"])
    if not keep:
        released = disk.release_weights([Path(s.run_dir) for samples in (*grade.done.values(),
                                                                        *grade.references.values()) for s in samples],
                                        report_dir)
        if released["removed"]:
            console.print(f"removed {len(released['removed'])} weights file(s) of the judged runs, "
                          f"{released['bytes'] / 1e6:.0f} MB (--keep keeps them): {report_dir / disk.MANIFEST}",
                          markup=False)
    grade.steps["write"] = time.monotonic() - writing
    wall = time.monotonic() - began if began is not None else grade.wall_seconds + sum(grade.steps.values())
    steps = {step: grade.steps[step] for step in timings.GRADE_STEPS if step in grade.steps}
    spent = timings.grade_timings(timings.run_rows(grade.done, grade.references), steps, wall)
    # In the report folder's summary.json too, for a grade read later (written once the writing is timed).
    stored = report_dir / "summary.json"  # the harness's own file: no bound needed
    write_json(stored, {**json.loads(stored.read_text()), "timings": spent})
    if show_timings:
        table = timings_table(spent, f"distlab grade: {profile.name}, where the time went")
        # Not on a terminal (a log, CI), rich assumes 80 columns and would cut every phase to "…": the
        # table gets the width it needs there (print's width= can only narrow a console).
        wide = console.measure(table, options=console.options.update_width(1000)).maximum
        (console if console.is_terminal else Console(file=console.file, width=wide, highlight=False)).print(table)
    console.print(f"{'[red]FAILED[/red]' if grade.failed else '[green]passed[/green]'}: {grade.failed} failed "
                  f"check(s); {grade.runs} run(s) in {grade.wall_seconds:.0f} s, harness overhead {grade.overhead:.3f}")
    console.print(f"report: {paths['html']}  junit: {paths['junit']}", markup=False)
    if as_json:
        print_json({**summary, "timings": spent, "report": {kind: str(path) for kind, path in paths.items()},
                    "failures": [v.to_dict() for v in grade.verdicts if v.passed is False]})
    if grade.interrupted is not None:
        raise grade.interrupted  # the CLI says so and exits 130 (Ctrl-C) or 128 + the signal
    return 1 if grade.failed else 0


def run(args: argparse.Namespace, lab_args: list[str]) -> int:
    """`distlab grade`: plan, execute, judge, report."""
    began = time.monotonic()
    slurm_array.check_submit_host(args.slurm, args.sbatch_arg or [])
    grade_plan = grade_options.plan_from(args, args.profile)
    planned = time.monotonic() - began
    if args.slurm:
        array = slurm.prepare(grade_plan, list(args.sbatch_arg or []))
        if args.dry_run:
            sys.stdout.write(array.script)
            sys.stdout.write(f"# not submitted (--dry-run); written to {array.script_path}\n")
            return 0
    elif args.dry_run:
        show_plan(grade_plan)
        return 0
    profile = grade_plan.profile
    console.print(f"distlab grade: profile {profile.name}"
                  f"{' (PROVISIONAL: numbers not measured on this hardware)' if profile.provisional else ''}; "
                  f"{len(grade_plan.cells())} cell(s) x {grade_plan.repeats} repeat(s), "
                  f"{grade_plan.planned_runs()} run(s) planned, about {duration(grade_plan.budget_s())} by the "
                  "profile's time budgets", markup=False)
    grade = run_grade(grade_plan, array.execute if args.slurm else execute)
    grade.steps["plan"] = planned
    return report(grade, args.json, args.keep, args.timings, began)
