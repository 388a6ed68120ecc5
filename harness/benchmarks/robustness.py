"""The grader's robustness figure (`distlab bench robustness`): one profile graded under many conditions.

A verdict must hold on any machine of the kind: another CPU's numerics, other seeds, other threads,
a busy machine. This grades one profile (cpu-smoke by default) under a covering set of conditions
and reports, for every numeric check, the smallest margin seen (Verdict.margin: how far it came
from failing, as a fraction of its threshold). Every grade must pass; a margin under 10% is a band
that is wrong or a real fragility, and is flagged.

The conditions are an orthogonal array L9 over four factors: torch's CPU kernels
(ATEN_CPU_CAPABILITY: the CPU's best, avx2, default), the seed (0, 1, 2, added to every row's
arguments), threads per rank (1, 2) and load (idle, two CPU-bound processes beside the grade). Nine
grades, not the 36 of every combination: every pair of levels of any two factors meets in at
least one grade, which is where interactions (the slow kernels under load, say) show.

    distlab bench robustness --profile cpu-smoke                # the nine grades
    distlab bench robustness --profile cpu-grade --conditions 1,5,9
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from harness.benchmarks.load import busy_processes
from harness.catalog import REPO
from harness.console import console
from harness.files import write_json
from harness.usage import UsageError
from harness.verdict import profiles
from harness.verdict.profiles import tomllib

FRAGILE = 0.10  # a margin under this: the band is wrong or the lab is fragile; find which


@dataclass(frozen=True)
class Condition:
    capability: str  # ATEN_CPU_CAPABILITY; "" for what torch picks (the CPU's best)
    seed: int
    threads: int  # per rank
    load: int  # CPU-bound processes beside the grade

    def describe(self) -> str:
        return (f"kernels {self.capability or 'native'}, seed {self.seed}, {self.threads} thread(s)/rank, "
                + (f"{self.load} busy process(es)" if self.load else "idle"))


def conditions() -> list[Condition]:
    """The L9 array (3 levels of 4 factors), the two-level factors taking their level 0 for level 2."""
    best = "avx512" if _cpu_has("avx512f") else ""
    capability, seeds, threads, load = [best, "avx2", "default"], [0, 1, 2], [1, 2, 1], [0, 2, 0]
    l9 = [(0, 0, 0, 0), (0, 1, 1, 1), (0, 2, 2, 2), (1, 0, 1, 2), (1, 1, 2, 0), (1, 2, 0, 1),
          (2, 0, 2, 1), (2, 1, 0, 2), (2, 2, 1, 0)]
    return [Condition(capability[a], seeds[b], threads[c], load[d]) for a, b, c, d in l9]


def _cpu_has(flag: str) -> bool:
    try:
        return any(flag in line.split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("flags"))
    except OSError:
        return False


def derived_profile(source: Path, condition: Condition, directory: Path) -> Path:
    """The profile with the condition's seed added to every row's arguments and its threads per rank."""
    import tomli_w

    data = tomllib.loads(source.read_text())
    data["threads_per_rank"] = condition.threads
    data["auto_select"] = False
    for row in data["labs"].values():
        row["args"] = [*row.get("args", []), "--seed", str(condition.seed)]
    path = directory / f"{data['name']}.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def grade(profile: Path, condition: Condition, results: Path, labs: str | None) -> dict[str, Any]:
    """One `distlab grade` under the condition: its verdicts, exit code and time."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": condition.capability} if condition.capability else \
        {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    started = time.monotonic()
    with busy_processes(condition.load):
        done = subprocess.run([sys.executable, "-m", "harness.commands.cli", "grade", "--profile", str(profile),
                               "--results", str(results), *(["--labs", labs] if labs else [])],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=4 * 3600)
    found = sorted(results.glob("grade/*/verdicts.json"))
    return {"condition": condition.describe(), "returncode": done.returncode,
            "seconds": time.monotonic() - started, "verdicts": json.loads(found[-1].read_text()) if found else [],
            "tail": done.stdout.strip().splitlines()[-3:]}


def smallest_margins(grades: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (row, world size, check): the smallest margin over the grades, and where it was seen."""
    smallest: dict[tuple[str, Any, str], dict[str, Any]] = {}
    for outcome in grades:
        for v in outcome["verdicts"]:
            if v.get("margin") is None:
                continue
            key = (v["lab"], v["world_size"], v["check"])
            if key not in smallest or v["margin"] < smallest[key]["margin"]:
                smallest[key] = {"lab": v["lab"], "world_size": v["world_size"], "check": v["check"],
                                 "margin": v["margin"], "measured": v["measured"], "expected": v["expected"],
                                 "condition": outcome["condition"]}
    return sorted(smallest.values(), key=lambda row: row["margin"])


def report(grades: list[dict[str, Any]], margins: list[dict[str, Any]], directory: Path) -> Path:
    lines = ["# Robustness sweep", "", "| grade | condition | result | time |", "|---|---|---|---|"]
    for n, outcome in enumerate(grades, 1):
        failed = [f"{v['lab']} ws={v['world_size']} {v['check']}" for v in outcome["verdicts"] if v["passed"] is False]
        result = "passed" if outcome["returncode"] == 0 else "FAILED: " + ", ".join(failed or outcome["tail"])
        lines.append(f"| {n} | {outcome['condition']} | {result} | {outcome['seconds']:.0f} s |")
    lines += ["", "Smallest margin per check over the sweep (fraction of its threshold; under "
              f"{FRAGILE:.0%} is flagged):", "", "| row | ws | check | margin | measured | expected | where |",
              "|---|---|---|---|---|---|---|"]
    for m in margins:
        flag = " **fragile**" if m["margin"] < FRAGILE else ""
        lines.append(f"| {m['lab']} | {m['world_size'] or '-'} | {m['check']} | {m['margin']:.3f}{flag} | "
                     f"{m['measured']} | {m['expected']} | {m['condition']} |")
    path = directory / "report.md"
    path.write_text("\n".join(lines) + "\n")
    write_json(directory / "sweep.json", {"grades": grades, "margins": margins})
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="cpu-smoke", help="a shipped profile's name or a path (default cpu-smoke)")
    parser.add_argument("--labs", help="comma-separated rows to grade (default: all of the profile's)")
    parser.add_argument("--conditions", help="comma-separated numbers 1-9 of the L9 conditions (default: all)")
    parser.add_argument("--results", type=Path, default=Path("results"), help="results root (default ./results)")


def run(args: argparse.Namespace) -> int:
    every = conditions()
    try:
        chosen = [every[int(n) - 1] for n in args.conditions.split(",")] if args.conditions else every
        if args.conditions and not all(1 <= int(n) <= len(every) for n in args.conditions.split(",")):
            raise ValueError
    except (ValueError, IndexError):
        raise UsageError(f"--conditions takes numbers from 1 to {len(every)}, comma-separated "
                         f"(got {args.conditions!r})") from None
    try:
        source = profiles.resolve(args.profile, {}).path
    except profiles.ProfileError as error:
        raise UsageError(str(error)) from None
    directory = args.results / "robustness" / time.strftime("%Y%m%d-%H%M%S")
    directory.mkdir(parents=True, exist_ok=False)
    grades = []
    for n, condition in enumerate(chosen, 1):
        console.print(f"robustness {n}/{len(chosen)}: {condition.describe()}", markup=False)
        where = directory / f"grade-{n}"
        where.mkdir()
        outcome = grade(derived_profile(source, condition, where), condition, where, args.labs)
        grades.append(outcome)
        console.print(f"  {'passed' if outcome['returncode'] == 0 else 'FAILED'} in {outcome['seconds']:.0f} s",
                      markup=False)
    margins = smallest_margins(grades)
    path = report(grades, margins, directory)
    table = Table(title="smallest margins over the sweep")
    for column in ("row", "ws", "check", "margin", "where"):
        table.add_column(column)
    for m in margins[:10]:
        table.add_row(m["lab"], str(m["world_size"] or "-"), m["check"], f"{m['margin']:.3f}", m["condition"])
    console.print(table)
    console.print(f"report: {path}", markup=False)
    return 0 if all(outcome["returncode"] == 0 for outcome in grades) else 1

