"""One submission's grade, in a box of given CPUs and memory, beside an earlier distlab: `distlab bench submission`.

What a course pays for is one submission's grade: its wall time and the memory its container must
be given (Gradescope's default box is half a CPU and 768 MB). This grades the course's DDP lab, as a
student's program, as a class of one (`distlab grade-class`, the class profile by default), alternately
with this checkout and with an earlier commit's (--against REV, checked out beside it and run with the
same Python and packages), --repeats times each, and prints per version the seconds per submission
(median and range), the grade's status and score, and the peak memory of everything the grade ran.

Each grade runs in a cgroup of its own (root; the class sandbox's kind, with a CPU quota), limited by
--cpus and --memory where given, so that the peak is the grade's alone, page cache included, as a
container's limit counts it, and a kill by the memory limit is seen (its OOM kills). The grade runs
--no-sandbox: a job's sandbox makes cgroups of its own at the hierarchy's root, outside this one (in a
container they nest inside it); `distlab bench class` gives the sandbox's cost. Without root, the
grades are timed and the memory is "not measured". Nothing is timed but by this run, side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.table import Table

from harness.catalog import REPO
from harness.classgrade.sandbox.cgroups import CGROUP_ROOT, Cgroup
from harness.classgrade.sandbox.limits import Limits
from harness.console import console
from harness.usage import UsageError, positive_int
from labs.common.host import cpu_model

PROCESSES = 4096  # threads count: a grade's launcher, ranks and evaluator start torch's threads each
UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def memory_bytes(text: str) -> int:
    """768M, 1.5G, 3g, or bytes."""
    unit = UNITS.get(text[-1:].lower(), 1)
    try:
        value = float(text[:-1] if unit > 1 else text) * unit
    except ValueError:
        raise UsageError(f"--memory takes a size such as 768M or 1.5G (got {text!r})") from None
    if value < 64 << 20:
        raise UsageError(f"--memory {text} is less than 64 MB: give a size such as 768M or 1.5G")
    return int(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--against", metavar="REV",
                        help="an earlier commit of this checkout to grade beside this one (e.g. a release tag)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="grades per version (default 3)")
    parser.add_argument("--profile", default="cpu-class", help="the grade's profile (default cpu-class)")
    parser.add_argument("--world-sizes", help="e.g. 2 (default: the profile's)")
    parser.add_argument("--cpus", type=float, help="the box's CPU quota, e.g. 0.5 (default: no quota)")
    parser.add_argument("--memory", type=memory_bytes, help="the box's memory limit, e.g. 768M (default: none)")
    parser.add_argument("--keep", type=Path, help="grade in this folder and keep it (default: a temporary one)")


class Box:
    """A cgroup of its own for one grade (classgrade/sandbox/cgroups.py's, with a CPU quota where asked):
    memory, processes, CPUs; None where this is not root."""

    def __init__(self, group: Cgroup) -> None:
        self.group = group

    @classmethod
    def made(cls, cpus: float | None, memory: int | None) -> Box | None:
        if os.geteuid() != 0:
            if cpus is not None or memory is not None:
                raise UsageError("--cpus and --memory make a cgroup: run as root, or leave them out")
            return None
        # No --memory: a limit of the machine's whole memory, which binds nothing (and keeps the evaluator warm).
        limits = Limits(memory_bytes=memory or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                        processes=PROCESSES)
        group = Cgroup.create(f"bench-submission-{uuid.uuid4().hex[:8]}", limits, cpus)
        if group is None:
            raise UsageError(f"no cgroup could be made under {CGROUP_ROOT} (memory, pids and cpu): run where "
                             "cgroups are writable, or leave --cpus and --memory out")
        return cls(group)

    def enter(self) -> None:  # in the child, before exec: everything the grade starts stays inside
        for procs in self.group.procs_files():
            Path(procs).write_text(str(os.getpid()))

    def account(self) -> dict[str, Any]:
        return {"peak_memory_bytes": self.group.peak_memory(), "oom_kills": self.group.oom_kills()}

    def remove(self) -> None:
        self.group.remove()


def checkout(rev: str, folder: Path) -> Path:
    """`rev` of this checkout's history, as files (git archive: no worktree left registered)."""
    if not (REPO / ".git").exists():
        raise UsageError(f"--against needs a git checkout of distlab, and {REPO} is none (an installed wheel)")
    found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise UsageError(f"--against {rev}: no such commit in {REPO}; give a commit, branch or tag of its history")
    target = folder / f"distlab-{found.stdout.strip()[:9]}"
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", found.stdout.strip()], capture_output=True,
                             check=True)
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def grade_once(code: Path, subs: Path, results: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One class of one graded by the distlab in `code`, in a box of its own; seconds, outcome, memory."""
    box = Box.made(args.cpus, args.memory)
    argv = [sys.executable, "-m", "harness.commands.cli", "grade-class", str(subs), "--lab", "ddp",
            "--profile", args.profile, "--jobs", "1", "--no-sandbox", "--lessons", "local",
            "--results", str(results), *(["--world-sizes", args.world_sizes] if args.world_sizes else [])]
    env = {**os.environ, "PYTHONPATH": str(code)}  # that version's harness and labs, this Python's packages
    started = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=code, env=env, capture_output=True, text=True,
                              preexec_fn=box.enter if box else None)
        seconds = time.monotonic() - started
        account = box.account() if box else {"peak_memory_bytes": None, "oom_kills": None}
    finally:
        if box:
            box.remove()
    summaries = sorted(results.glob("class/*/summary.json"))
    students = json.loads(summaries[-1].read_text())["students"] if summaries else {}
    student: dict[str, Any] = next(iter(students.values()), {})
    return {"seconds": seconds, "returncode": done.returncode, "status": student.get("status", "none"),
            "score": student.get("score"), **account, "tail": done.stdout.strip().splitlines()[-1:]}


def run(args: argparse.Namespace) -> int:
    if args.cpus is not None and args.cpus <= 0:
        raise UsageError(f"--cpus must be more than 0, e.g. 0.5 (got {args.cpus:g})")
    if args.keep and args.keep.exists() and any(args.keep.iterdir()):
        raise UsageError(f"{args.keep} is not empty; give a new folder to --keep (earlier grades are never "
                         "overwritten)")
    folder = args.keep or Path(tempfile.mkdtemp(prefix="distlab-bench-submission-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return compare(args, folder)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


def compare(args: argparse.Namespace, folder: Path) -> int:
    """The grades, alternating, and their table."""
    versions = {"this checkout": REPO}
    if args.against:
        versions[f"--against {args.against}"] = checkout(args.against, folder)
    subs = folder / "subs"
    subs.mkdir(exist_ok=True)
    shutil.copy(REPO / "labs/ddp/train.py", subs / "course-lab.py")
    box = ", ".join(filter(None, [f"{args.cpus:g} CPU" if args.cpus else "",
                                  f"{args.memory / (1 << 30):.3g} GiB" if args.memory else ""])) or "no limits"
    console.print(f"distlab bench submission: the course's DDP lab as a class of one, profile {args.profile}, "
                  f"{args.repeats} grade(s) per version, alternating; box: {box}; {os.cpu_count()} core(s), "
                  f"{cpu_model()}", markup=False)
    grades: dict[str, list[dict[str, Any]]] = {name: [] for name in versions}
    for n in range(args.repeats):
        for name, code in versions.items():  # alternating: a change of load touches each version
            outcome = grade_once(code, subs, folder / f"{len(grades[name])}-{code.name}", args)
            grades[name].append(outcome)
            peak = outcome["peak_memory_bytes"]
            memory = f", peak {peak / (1 << 20):.0f} MiB, {outcome['oom_kills']} OOM kill(s)" if peak else ""
            console.print(f"  {name} {n + 1}: {outcome['status']} {outcome['score']} in {outcome['seconds']:.1f} s"
                          f"{memory}", markup=False)
    table = Table(title="one submission's grade")
    for column in ("version", "s per submission (median, range)", "status, score", "peak memory", "OOM kills"):
        table.add_column(column)
    medians = {}
    for name, outcomes in grades.items():
        seconds = [o["seconds"] for o in outcomes]
        medians[name] = statistics.median(seconds)
        peaks = [o["peak_memory_bytes"] for o in outcomes if o["peak_memory_bytes"]]
        table.add_row(name, f"{medians[name]:.1f} ({min(seconds):.1f}-{max(seconds):.1f})",
                      ", ".join(sorted({f"{o['status']} {o['score']}" for o in outcomes})),
                      f"{max(peaks) / (1 << 20):.0f} MiB" if peaks else "not measured (not root)",
                      str(sum(o["oom_kills"] or 0 for o in outcomes)) if peaks else "-")
    console.print(table)
    if args.against:
        ours, theirs = medians["this checkout"], medians[f"--against {args.against}"]
        console.print(f"this checkout / {args.against}: {ours / theirs:.2f} x the seconds per submission", markup=False)
    console.print(f"grades kept in {folder}" if args.keep else "", markup=False)
    return 0 if all(o["status"] == "graded" for outcomes in grades.values() for o in outcomes) else 1
