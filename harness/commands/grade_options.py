"""The options a grade plan is made of, as `distlab grade` and `distlab calibrate` take them, and the
plan they stand for (grading.plan_grade takes typed arguments; this is where the command line ends)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.catalog import LABS
from harness.grading.plan import GradePlan, plan_grade
from harness.usage import UsageError, absolute_path, positive_float, positive_int, world_size_list
from harness.verdict import profiles
from harness.verdict.expectations import Profile
from labs.common.host import fingerprint


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """What a grade plan is made of, as grade and calibrate take it."""
    parser.add_argument("--labs", help="comma-separated labs (default: all labs of the profile)")
    parser.add_argument("--world-sizes", type=world_size_list, help="e.g. 1,2,4 (default: the profile's)")
    parser.add_argument("--repeats", type=positive_int, default=1, help="runs per lab and world size")
    parser.add_argument("--program", action="append", metavar="LAB=PATH",
                        help="grade this program for LAB instead of the lab's own (repeatable)")
    parser.add_argument("--results", type=absolute_path, default="results", help="results root (default ./results)")
    parser.add_argument("--timeout", type=positive_float, help="seconds per run (default: 2 x the time budget)")


def programs_of(items: list[str] | None, profile: Profile) -> dict[str, Path]:
    """--program LAB=PATH (every row of a lab) or ROW=PATH (one row), as a mapping."""
    programs = {}
    for item in items or []:
        lab, sep, path = item.partition("=")
        if not sep or (lab not in LABS and lab not in profile.labs):
            raise UsageError(f"--program takes LAB=PATH with LAB one of {', '.join(LABS)} (got {item!r})")
        programs[lab] = Path(path)
    return programs


def plan_from(args: argparse.Namespace, profile_name: str | None) -> GradePlan:
    """The grade the command line asks for, with the profile it names (or the one fitting this host)."""
    host = fingerprint()
    try:
        profile = profiles.resolve(profile_name, host)
    except profiles.ProfileError as error:
        raise UsageError(str(error)) from None
    labs = [lab for lab in (args.labs or "").split(",") if lab]
    return plan_grade(profile, labs=labs, world_sizes=args.world_sizes, repeats=args.repeats,
                      programs=programs_of(args.program, profile), results_root=args.results,
                      timeout_s=args.timeout, gpus=host["gpus"])
