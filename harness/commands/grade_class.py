"""`distlab grade-class SUBMISSIONS/`: a class's programs, each in a sandbox, side by side, into a
gradebook, class page and feedback (harness/classgrade/; docs/grading-class.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.classgrade import bundle, class_plan, lessons
from harness.classgrade.classroom import DEFAULT_LAB, ClassRequest, open_class
from harness.classgrade.grading_loop import grade_class
from harness.console import print_json
from harness.usage import absolute_path, positive_int, world_size_list

DESCRIPTION = ("Each submission graded as `grade --program` grades one, in bubblewrap, side by side; gradebook, "
               "class page, feedback (docs/grading-class.md).")
EXAMPLES = """examples:
  distlab grade-class submissions/ --lab ddp --profile cpu-smoke --lessons https://github.com/course/ddp-lab/blob/main/
  distlab grade-class submissions/ --lessons local                    # links that open only on this machine
  distlab grade-class submissions/ --rubric week4.toml --jobs 2
  distlab grade-class submissions/ --dry-run                          # the plan: submissions, runs, time, disk
  distlab grade-class submissions/ --json > class.json                # the summary on stdout, progress on stderr
  distlab grade-class submissions/ --rerun alice                      # grade one student again
  distlab grade-class submissions/ --regrade --rubric week4-v2.toml   # new rubric, no training
  distlab grade-class submissions/ --regrade --profile cpu-grade      # judged under another profile, no training
  distlab grade-class submissions/ --autograder gradescope.zip        # a Gradescope autograder bundle
  distlab grade-class submissions/ --slurm --jobs 8 --sbatch-arg=--partition=cpu   # each a Slurm array task

A class is graded with the settings stored with it (results/class/NAME/settings.json: lab, profile,
world sizes, rubric, lessons) wherever the command gives none: run again (resuming) or with --regrade, it keeps
the profile it was graded with, on any host. A setting given replaces the stored one: on --regrade the
stored runs are judged under it; on a resume the stored grades made under another lab, profile or
world sizes are stale, and graded (run) again."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("submissions", type=Path, help="folder with one folder (or .py file) per student")
    parser.add_argument("--lab", help=f"the lab every submission is graded as (default: the class's, else "
                                      f"{DEFAULT_LAB})")
    parser.add_argument("--profile", help="profile name or .toml (default: the class's, else the one that fits this "
                                          "host)")
    parser.add_argument("--rubric", type=Path, help="rubric .toml (default: the class's, else "
                                                    "harness/classgrade/rubrics/LAB.toml)")
    parser.add_argument("--jobs", type=positive_int, help="submissions graded at once (default: cores / ranks per "
                                                          "job on CPUs, GPUs / GPUs per job on GPU hosts)")
    parser.add_argument("--world-sizes", type=world_size_list, help="e.g. 2 (default: the class's, else the "
                                                                   "profile's)")
    parser.add_argument("--results", type=absolute_path, default="results", help="results root (default ./results)")
    parser.add_argument("--rerun", action="append", metavar="ID", default=[], help="grade this student again")
    parser.add_argument("--regrade", action="store_true",
                        help="recompute verdicts and scores from the stored observations, with the class's "
                             "settings or those given; run nothing")
    parser.add_argument("--sandbox", choices=["bwrap", "uid"], default="bwrap",
                        help="bwrap: namespaces (loopback only, the grader's files not there); uid: where a "
                             "container refuses namespaces, a uid of its own, its limits and the grader's files made "
                             "private (docs/threat-model.md says what each holds)")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run submissions with the grader's rights (every page says so)")
    parser.add_argument("--lessons", type=lessons.lessons_argument, metavar="URL",
                        help="the web address of the folder holding labs/, where feedback links the lessons "
                             "(default: the class's, else the course repository's https origin at this commit); "
                             "'local': this checkout's files (file://), which open only on this machine")
    parser.add_argument("--keep", action="store_true",
                        help="keep every file the runs wrote, weights and checkpoints too (default: removed once "
                             "the submission's runs are judged, each listed with its sha256 in the job's "
                             "weights.json; docs/grading-class.md gives the disk per submission)")
    parser.add_argument("--slurm", action="store_true",
                        help="grade each submission as a task of one Slurm job array, sandboxed on its node; the "
                             "results folder must be shared with the nodes (run again to grade what failed)")
    parser.add_argument("--sbatch-arg", action="append", metavar="ARG",
                        help="--slurm: an sbatch option for the array, e.g. --sbatch-arg=--partition=cpu (repeatable)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (the submissions found, the runs of each, estimated time and disk) and "
                             "run nothing, write nothing")
    parser.add_argument("--json", action="store_true",
                        help="print the class's summary (each student's status, score, reason) as JSON on stdout; "
                             "progress goes to stderr (with --dry-run: the plan as JSON)")
    parser.add_argument("--autograder", type=Path, metavar="ZIP",
                        help="write a Gradescope autograder bundle (setup.sh, run_autograder) and exit")


def run(args: argparse.Namespace, lab_args: list[str]) -> int:
    if args.autograder:
        args.lab = args.lab or DEFAULT_LAB  # a bundle is no class: it has no stored settings
        return bundle.write(args)
    request = ClassRequest(
        args.submissions, lab=args.lab, profile=args.profile, rubric=args.rubric, jobs=args.jobs,
        world_sizes=args.world_sizes, results=args.results, rerun=tuple(args.rerun), regrade=args.regrade,
        sandbox="none" if args.no_sandbox else args.sandbox, lessons=args.lessons, slurm=args.slurm,
        sbatch_args=list(args.sbatch_arg or []), keep=args.keep, dry_run=args.dry_run)
    if args.dry_run:
        plan = class_plan.plan_of(open_class(request))
        if args.json:
            print_json(plan)
        else:
            sys.stdout.write(class_plan.plan_text(plan))
        return 0
    return grade_class(request, as_json=args.json)
