"""Whether load can tip a speed verdict (`distlab bench verdict`).

A student's program is timed against the course's lab, run beside it in time: lab, program, lab,
program, lab, program, lab, each run of the program over the mean of the lab's runs around it, the
verdict on the median of those ratios (harness/verdict/pairing.py, pair_references). This benchmark grades,
--grades times each, two programs against cpu-smoke's ddp row at one world size, with --load
CPU-bound processes running beside every grade:

    a copy of labs/ddp/train.py       identical to the course's lab: must pass the speed check every time
    the twice-slower mutant           the same lab, busy before each optimizer step for as long as the
                                      step took until then: half the rate, must fail every time

and prints how often each passed `img_per_sec_ratio` and every grade's median ratio. Exit 0 only
when the copy passed and the mutant failed in every grade. Each grade goes through `distlab grade
--program ddp=PATH` as a course would run it; nothing is timed here but by the grade itself.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.table import Table

from harness.benchmarks.load import busy_processes
from harness.catalog import REPO
from harness.console import console
from harness.usage import UsageError
from harness.verdict.profiles import PROFILE_DIR, tomllib
from harness.verdict.references import PROGRAM_RATIO_FLOOR

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
    parser.add_argument("--grades", type=int, default=10, help="grades of each program (default 10)")
    parser.add_argument("--load", type=int, default=2, help="CPU-bound processes beside every grade (default 2)")
    parser.add_argument("--world-size", type=int, choices=[1, 2], default=1, help="ranks of each run (default 1)")
    parser.add_argument("--results", type=Path, help="keep the grades here (default: a temporary folder)")


def profile_with_one_row(directory: Path, world_size: int) -> Path:
    """cpu-smoke's ddp row alone, at one world size, standing alone (no single-device row)."""
    import tomli_w

    data = tomllib.loads((PROFILE_DIR / "cpu-smoke.toml").read_text())
    row = {key: value for key, value in data["labs"]["ddp"].items() if key not in ("single_device", "efficiency_min")}
    data.update(name="bench-verdict", auto_select=False, labs={"ddp": {**row, "world_sizes": [world_size]}})
    path = directory / "bench-verdict.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def grade_once(profile: Path, program: Path, results: Path) -> dict[str, Any]:
    """One `distlab grade --program ddp=PROGRAM`; its img_per_sec_ratio verdict (None if it has none)."""
    results.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "harness.commands.cli", "grade", "--profile", str(profile),
                           "--program", f"ddp={program}", "--results", str(results)],
                          cwd=REPO, capture_output=True, text=True, timeout=3600)
    found = sorted(results.glob("grade/*/verdicts.json"))
    verdicts = json.loads(found[-1].read_text()) if found else []
    ratio = next((v for v in verdicts if v["check"] == "img_per_sec_ratio"), None)
    return {"verdict": ratio, "returncode": done.returncode, "tail": done.stdout.strip().splitlines()[-1:]}


def run(args: argparse.Namespace) -> int:
    if args.grades < 1 or args.load < 0:
        raise UsageError("--grades must be at least 1 and --load at least 0")
    with tempfile.TemporaryDirectory(prefix="distlab-bench-verdict-") as scratch:
        root = args.results or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        programs = {"copy of the lab": root / "ddp_copy.py", "twice slower": root / "ddp_twice_slower.py"}
        programs["copy of the lab"].write_text(LAB.read_text())
        programs["twice slower"].write_text(mutate(LAB.read_text(), TWICE_SLOWER))
        profile = profile_with_one_row(root, args.world_size)
        console.print(f"distlab bench verdict: {args.grades} grade(s) of each program at world size "
                      f"{args.world_size}, {args.load} CPU-bound process(es) beside; floor {PROGRAM_RATIO_FLOOR:g}",
                      markup=False)
        outcomes: dict[str, list[dict[str, Any]]] = {name: [] for name in programs}
        with busy_processes(args.load):
            for n in range(args.grades):  # the two programs take turns: a change of load touches both
                for name, program in programs.items():
                    outcome = grade_once(profile, program, root / f"{name.split()[0]}-{n}")
                    outcomes[name].append(outcome)
                    verdict = outcome["verdict"] or {}
                    console.print(f"  {name} grade {n + 1}: {verdict.get('measured', '-')} "
                                  f"({'passed' if verdict.get('passed') else 'failed'})", markup=False)
    table = Table(title="speed verdicts under load")
    for column in ("program", "passed the speed check", "expected", "median ratio per grade"):
        table.add_column(column)
    ok = True
    for name, results in outcomes.items():
        passed = sum(bool((r["verdict"] or {}).get("passed")) for r in results)
        want = len(results) if name == "copy of the lab" else 0
        ok &= passed == want
        table.add_row(name, f"{passed} of {len(results)}", f"{want} of {len(results)}",
                      " ".join((r["verdict"] or {}).get("measured", "-") for r in results))
    console.print(table)
    return 0 if ok else 1

