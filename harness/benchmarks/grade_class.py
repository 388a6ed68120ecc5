"""A class graded side by side, measured: `distlab bench class [--jobs N] [--keep DIR]` (not a test).

The class: the course's DDP lab twice, the DDP program written from scratch
(tests/programs/ddp_program.py), each mutant of tests/test_grade_mutations.py (one mistake each)
and the unused-parameters mutant, the hostile submissions of tests/submissions/, and the cheats of
tests/test_cheats.py (the scratch program hiding a mistake from the grader). Graded on
cpu-smoke's ddp row at world size 2 (without the throughput band: each submission would otherwise
bring three paired runs of the course lab). Prints every submission's outcome against what it must
be, the class's total time, the time per submission against one graded alone, and the sandbox's
cost: one correct submission graded alone with and without the sandbox, as a ratio. It takes its
programs, profile and rubric from the checkout's tests/ (one definition of each): a checkout only.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.catalog import REPO
from harness.usage import UsageError, positive_int

DISTLAB = str(Path(sys.executable).parent / "distlab")
OUTPUT_GIB = 1.0  # the course lab saves a checkpoint (ResNet-18 and its momentum: ~90 MB) in each run


def _load_test_module(name: str):  # the test suite's own profile, rubric and mutants: one definition
    if not (REPO / "tests" / f"{name}.py").is_file():
        raise UsageError(f"distlab bench class builds its class from the checkout's tests/, not found in {REPO}; "
                         "run it from a git checkout")
    sys.path.insert(0, str(REPO / "tests"))
    spec = importlib.util.spec_from_file_location(name, REPO / "tests" / f"{name}.py")
    if spec is None or spec.loader is None:
        raise UsageError(f"distlab bench class cannot load tests/{name}.py from {REPO}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_class(folder: Path) -> dict[str, str]:
    """The submissions, and the words each one's gradebook row must hold ("" for a whole grade)."""
    mutations = _load_test_module("test_grade_mutations")
    graded = _load_test_module("test_grade_class")
    subs = folder / "class"
    subs.mkdir()
    expected = {}
    for name in ("course-1", "course-2"):
        shutil.copy(REPO / "labs/ddp/train.py", subs / f"{name}.py")
        expected[name] = ""
    shutil.copy(REPO / "tests/programs/ddp_program.py", subs / "scratch.py")
    expected["scratch"] = ""
    for name, (changes, failing) in mutations.MUTANTS.items():
        mutations.mutant(subs, name, changes).rename(subs / f"{name}.py")
        expected[name] = next(check for check in failing if check.startswith("observed:"))
    for path in (REPO / "tests/submissions").glob("*.py"):
        name = path.stem.replace("_", "-")
        if name not in graded.EXPECTED:
            continue  # graded in a class of its own by its test (reads_keyring, nan_clock): no row words here
        shutil.copy(path, subs / f"{name}.py")
        expected[name] = graded.EXPECTED[name].replace("64 MiB", f"{OUTPUT_GIB:g} GiB")  # the benchmark's limit
    graded.unused_parameters_mutant(subs / "unused-parameters.py")
    expected["unused-parameters"] = "unused_parameters"
    cheats = _load_test_module("test_cheats")  # issue 44's: the scratch program with one cheat each
    for name, (changes, failing) in cheats.CHEATS.items():
        cheats.cheat(subs, changes).rename(subs / f"{name}.py")
        expected[name] = f"observed:{next(iter(failing))}"
    return expected


def grade(folder: Path, subs: Path, results: str, *extra: str) -> float:
    graded = _load_test_module("test_grade_class")
    started = time.monotonic()
    done = subprocess.run([DISTLAB, "grade-class", str(subs), "--lab", "ddp", "--profile",
                           str(graded.class_profile(folder)), "--rubric",
                           str(graded.class_rubric(folder, wall_s=120, output_gib=OUTPUT_GIB)),
                           "--results", str(folder / results), "--lessons", "local", *extra], capture_output=True,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"grade-class failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return time.monotonic() - started


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=positive_int,
                        help="submissions at once (default: grade-class's own for this host)")
    parser.add_argument("--keep", type=Path, help="grade in this folder and keep it (default: a temporary one)")


def run(args: argparse.Namespace) -> int:
    folder = args.keep or Path(tempfile.mkdtemp(prefix="distlab-class-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    expected = build_class(folder)
    alone = folder / "alone"
    alone.mkdir()
    shutil.copy(REPO / "labs/ddp/train.py", alone / "course-1.py")
    sandboxed = grade(folder, alone, "alone-sandboxed")
    unsandboxed = grade(folder, alone, "alone-unsandboxed", "--no-sandbox")
    jobs = ["--jobs", str(args.jobs)] if args.jobs else []
    total = grade(folder, folder / "class", "results", *jobs)
    class_dir = folder / "results/class/class"
    summary = json.loads((class_dir / "summary.json").read_text())
    book = {row["id"]: row for row in csv.DictReader((class_dir / "gradebook.csv").open())}
    wrong = 0
    print(f"{'submission':24} {'status':11} {'score':>6}  as expected  reason / failed")
    for student, words in sorted(expected.items()):
        row = book[student]
        failed = [name for name, score in summary["students"][student]["items"].items() if name != "speed"
                  and score < _points(class_dir, name)]
        if not words:
            ok = row["status"] == "graded" and not failed
        elif words.startswith("observed:") and _lost(class_dir, student, words):
            ok = True  # an item paying for the check lost points: hidden ones too (speed), unseen in feedback
        elif words.startswith("observed:") or words == "unused_parameters":
            report = (class_dir / "feedback" / f"{student}.md").read_text()
            ok = words in report
        else:
            ok = row["status"] == "ungradable" and words in row["reason"]
        wrong += not ok
        print(f"{student:24} {row['status']:11} {row['score'] or '-':>6}  {'yes' if ok else 'NO':11}  "
              f"{(row['reason'] or ', '.join(failed))[:90]}")
    n = len(expected)
    print(f"\n{n} submissions, {summary['jobs']} at once: {total:.0f} s in all, {total / n:.1f} s per submission; "
          f"one graded alone: {sandboxed:.1f} s in the sandbox, {unsandboxed:.1f} s without "
          f"(sandbox cost {sandboxed / unsandboxed:.3f}x); per submission in the class / alone: "
          f"{total / n / sandboxed:.2f}")
    print(f"{wrong} submission(s) not graded as expected; kept in {folder}" if args.keep or wrong else
          f"{wrong} submission(s) not graded as expected")
    return 1 if wrong else 0


def _lost(class_dir: Path, student: str, check: str) -> bool:
    """Whether an item of the rubric that pays for `check` scored below its points for `student`."""
    import fnmatch

    from harness.classgrade import rubric

    summary = json.loads((class_dir / "summary.json").read_text())
    scores = summary["students"][student]["items"]
    return any(item.points and scores.get(item.name, item.points) < item.points
               and any(fnmatch.fnmatch(check, pattern) for pattern in item.checks)
               for item in rubric.load(Path(summary["rubric"])).items)


def _points(class_dir: Path, item: str) -> float:
    from harness.classgrade import rubric

    summary = json.loads((class_dir / "summary.json").read_text())
    return next(i.points for i in rubric.load(Path(summary["rubric"])).items if i.name == item)

