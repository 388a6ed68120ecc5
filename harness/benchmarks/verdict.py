"""Whether load can tip a speed verdict (`distlab bench verdict`): a load sweep.

Every speed row is judged on an interval over paired runs (harness/verdict/speed.py, speed_rule):
passed above its floor, failed below, "not comparable" while the interval reaches it or where the
machine's own load explains a lab's slowness. This benchmark judges, --grades times each, at every
load of --loads (CPU-bound processes beside the grade), each through `distlab grade` with one row of
cpu-smoke at one world size, as a course would run it:

    lab        the course's ddp lab, its own row (against the plain training loop, the profile's floor)
    mutant     the same lab twice slower (busy before each optimizer step for as long as the step took
               until then), graded as a student's program against the course lab (PROGRAM_RATIO_FLOOR)
    allreduce  allreduce_bench's own row (against the library's plain all-reduce loop)

and prints, per load, how often each passed, failed or was not comparable, and the seconds per
verdict (the grade's wall time: its extra pairs included). Exit 0 when the lab and the bench never
failed, and the mutant never passed and failed every time at loads 0 and 2 (issue 48's done-when).
Nothing is timed here but by the grades themselves.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from harness.benchmarks.load import busy_processes
from harness.catalog import REPO
from harness.console import console
from harness.files import write_json
from harness.usage import UsageError
from harness.verdict.profiles import PROFILE_DIR, tomllib
from harness.verdict.references import PROGRAM_RATIO_FLOOR
from labs.common.host import cpu_model, usable_cores

LAB = REPO / "labs/ddp/train.py"
# The twice-slower mutant: the lab busy, before each optimizer step, for as long as the step took
# until then (loading its batch included). Busy, not asleep: the scheduler hands a process that
# wakes from sleep its core first, so under load a sleeping program loses less than half (0.67 of
# the lab's rate measured so beside another busy process, 0.51 idle). Before the optimizer step,
# where the harness's clock sees it: a wait after the last step of a pass falls outside its timed
# steps. (old, new) edits of labs/ddp/train.py, each found exactly once; tests use the same.
TWICE_SLOWER = [
    ("    for images, labels, indices in loader:\n",
     "    step_ended = time.perf_counter()\n    for images, labels, indices in loader:\n"),
    ("        precision.scaler.step(optimizer)\n",
     "        busy_until = 2 * time.perf_counter() - step_ended\n"
     "        while time.perf_counter() < busy_until:\n"
     "            pass\n"
     "        precision.scaler.step(optimizer)\n"),
    ("        clock.step(len(labels))\n",
     "        clock.step(len(labels))\n        step_ended = time.perf_counter()\n"),
]


def mutate(source: str, changes: list[tuple[str, str]]) -> str:
    """`source` with each (old, new) edit made; an edit whose old text is not found once is an error."""
    for old, new in changes:
        if source.count(old) != 1:
            raise ValueError(f"the lab changed: {old!r} is not found once")
        source = source.replace(old, new)
    return source


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grades", type=int, default=5, help="judgements of each subject per load (default 5)")
    parser.add_argument("--loads", default="0,2,4,8,16",
                        help="comma-separated CPU-bound processes beside the grades (default 0,2,4,8,16)")
    parser.add_argument("--subjects", default=",".join(SUBJECTS),
                        help=f"comma-separated, of {', '.join(SUBJECTS)} (default all)")
    parser.add_argument("--world-size", type=int, choices=[1, 2], default=2, help="ranks of each run (default 2)")
    parser.add_argument("--results", type=Path, help="keep the grades here (default: a temporary folder)")


# subject: (the profile row, the speed check read, graded as a student's program)
SUBJECTS = {"lab": ("ddp", "img_per_sec_ratio", False), "mutant": ("ddp", "img_per_sec_ratio", True),
            "allreduce": ("allreduce_bench", "avg_busbw_gbps_ratio", False)}


def profile_with_one_row(directory: Path, row: str, world_size: int) -> Path:
    """cpu-smoke's row alone, at one world size, standing alone (no single-device row, no efficiency)."""
    import tomli_w

    data = tomllib.loads((PROFILE_DIR / "cpu-smoke.toml").read_text())
    table = {key: value for key, value in data["labs"][row].items() if key not in ("single_device", "efficiency_min")}
    data.update(name=f"bench-verdict-{row}".replace("_", "-"), auto_select=False,
                labs={row: {**table, "world_sizes": [world_size]}})
    path = directory / f"bench-verdict-{row}.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def grade_once(profile: Path, program: Path | None, results: Path, row: str, check: str) -> dict[str, Any]:
    """One `distlab grade` of the row (with --program where given); its speed verdict and wall time."""
    results.mkdir(parents=True)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "harness.commands.cli", "grade", "--profile", str(profile),
                           "--results", str(results), *(["--program", f"{row}={program}"] if program else [])],
                          cwd=REPO, capture_output=True, text=True, timeout=3600)
    found = sorted(results.glob("grade/*/verdicts.json"))
    verdicts = json.loads(found[-1].read_text()) if found else []
    speed = next((v for v in verdicts if v["check"] == check), None)
    return {"verdict": speed, "returncode": done.returncode, "seconds": time.monotonic() - started,
            "tail": done.stdout.strip().splitlines()[-1:]}


def outcome_of(verdict: dict[str, Any] | None) -> str:
    if verdict is None:
        return "missing"
    return {True: "pass", False: "fail", None: "not comparable"}[verdict.get("passed")]


def run(args: argparse.Namespace) -> int:
    try:
        loads = [int(n) for n in args.loads.split(",")]
        subjects = [name for name in args.subjects.split(",") if name]
        if args.grades < 1 or any(n < 0 for n in loads) or not subjects or not set(subjects) <= set(SUBJECTS):
            raise ValueError
    except ValueError:
        raise UsageError(f"--grades must be at least 1, --loads whole numbers from 0 (got {args.loads!r}) and "
                         f"--subjects some of {', '.join(SUBJECTS)} (got {args.subjects!r})") from None
    with tempfile.TemporaryDirectory(prefix="distlab-bench-verdict-") as scratch:
        root = args.results or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        mutant = root / "ddp_twice_slower.py"
        mutant.write_text(mutate(LAB.read_text(), TWICE_SLOWER))
        profiles = {row: profile_with_one_row(root, row, args.world_size) for row, _, _ in SUBJECTS.values()}
        console.print(f"distlab bench verdict: {args.grades} judgement(s) of {', '.join(subjects)} at world size "
                      f"{args.world_size}, at loads {args.loads}; {usable_cores().count} core(s), "
                      f"{cpu_model()}; the mutant's floor {PROGRAM_RATIO_FLOOR:g} of the lab", markup=False)
        outcomes: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for load in loads:
            with busy_processes(load):
                for n in range(args.grades):  # the subjects take turns: a change of load touches each
                    for name in subjects:
                        row, check, as_program = SUBJECTS[name]
                        outcome = grade_once(profiles[row], mutant if as_program else None,
                                             root / f"load{load}-{name}-{n}", row, check)
                        outcomes.setdefault((load, name), []).append(outcome)
                        verdict = outcome["verdict"] or {}
                        console.print(f"  load {load} {name} {n + 1}: {outcome_of(outcome['verdict'])} "
                                      f"{verdict.get('measured', '-')} in {outcome['seconds']:.0f} s "
                                      f"({(verdict.get('detail') or '')[-160:]})", markup=False)
                        write_json(root / "sweep.json", {f"{k[0]}:{k[1]}": v for k, v in outcomes.items()})
    table = Table(title=f"speed verdicts under load (world size {args.world_size})")
    for column in ("busy", *(f"{name} pass/fail/n.c." for name in subjects), "s per verdict"):
        table.add_column(column)
    ok = True
    for load in loads:
        cells, seconds = [], []
        for name in subjects:
            results = outcomes.get((load, name), [])
            counts = [sum(outcome_of(r["verdict"]) == state for r in results)
                      for state in ("pass", "fail", "not comparable")]
            cells.append("/".join(map(str, counts)) + (f" ({len(results) - sum(counts)} missing)"
                                                      if len(results) > sum(counts) else ""))
            seconds += [r["seconds"] for r in results]
            if name == "mutant":
                ok &= counts[0] == 0 and (load > 2 or counts[1] == len(results))
            else:
                ok &= counts[1] == 0 and sum(counts) == len(results)
        table.add_row(str(load), *cells, f"{sum(seconds) / len(seconds):.0f}" if seconds else "-")
    console.print(table)
    return 0 if ok else 1
