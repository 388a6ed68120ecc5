"""`distlab grade-class` says what it will do and what it is doing (issue 49, point 5): `--dry-run`
prints the plan (submissions, runs of each, time and disk, each estimate saying what it was made of)
and writes nothing; a grade shows each submission and each of its runs, run k of n, with an estimate,
as a plain line per run where output is no terminal; `--json` puts the class's summary alone on
stdout, the same as the gradebook, and the progress on stderr.

The class graded here is the smallest that shows runs counted: one correct program (and a wrong
layout, which runs nothing) under cpu-smoke's ddp row at world sizes 1 and 2, no course lab beside
it (the throughput band dropped): two runs. Without the sandbox: what is shown is the same in it
(the progress comes from the job process, which runs outside the sandbox either way), and
test_grade_class.py grades in it.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
import tomli_w
from conftest import run_distlab

from harness.classgrade import account, outputs
from harness.verdict.profiles import tomllib

REPO = Path(__file__).resolve().parent.parent
CORRECT = REPO / "tests/programs/ddp_program.py"


def two_run_profile(folder: Path) -> Path:
    """cpu-smoke's ddp row at world sizes 1 and 2, without its throughput band: one run of each."""
    data = tomllib.loads((REPO / "harness/profiles/cpu-smoke.toml").read_text())
    ddp = {key: value for key, value in data["labs"]["ddp"].items() if key not in ("single_device", "reference")}
    ddp["metrics"] = {name: band for name, band in ddp.get("metrics", {}).items() if name != "img_per_sec"}
    data.update(name="two-runs", auto_select=False, labs={"ddp": {**ddp, "world_sizes": [1, 2]}})
    path = folder / "two-runs.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def a_class(folder: Path) -> Path:
    submissions = folder / "week4"
    submissions.mkdir()
    shutil.copy(CORRECT, submissions / "alice.py")
    (submissions / "carol").mkdir()  # a wrong layout: ungradable before anything runs
    for name in ("a.py", "b.py"):
        (submissions / "carol" / name).write_text("print('hello')\n")
    return submissions


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every entry under a folder, with its size and modification time: what "wrote nothing" compares."""
    return {str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")}


def test_dry_run_prints_the_plan_and_runs_and_writes_nothing(tmp_path):
    submissions = a_class(tmp_path)
    results = tmp_path / "results"
    argv = ["grade-class", str(submissions), "--lab", "ddp", "--profile", "cpu-smoke", "--results", str(results),
            "--lessons", "local", "--dry-run"]
    done = run_distlab(argv, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "2 submission(s): 1 to grade, 0 graded already, 1 ungradable" in out, out
    assert "  alice: to grade\n" in out and "  carol: ungradable (wrong layout:" in out, out
    # cpu-smoke grades a program at world sizes 1 and 2, each run between two of the course lab's.
    assert "14 run(s) per submission" in out, out
    assert "ddp ws=2: 3 run(s) of the program and 4 of course-ddp beside them" in out, out
    assert re.search(r"^time: about .+ per submission, .+ for 1 \(by the profile's time budgets", out, re.M), out
    assert "disk: not known until a submission is graded this way" in out, out
    assert not results.exists()  # not even the results root: nothing ran, nothing was written
    plan = json.loads(run_distlab([*argv, "--json"], cwd=tmp_path).stdout)
    assert plan["runs_per_submission"] == 14 and plan["to_grade"] == 1 and plan["disk"]["per_submission_bytes"] is None
    assert {s["id"]: s["status"] for s in plan["submissions"]} == {"alice": "to grade", "carol": "ungradable"}
    assert not results.exists()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("progress")
    submissions = a_class(folder)
    argv = ["grade-class", str(submissions), "--lab", "ddp", "--profile", str(two_run_profile(folder)),
            "--results", str(folder / "results"), "--no-sandbox",
            "--lessons", "local"]
    done = run_distlab([*argv, "--json"], timeout=1200, cwd=folder)  # stdout and stderr are pipes: no terminal
    return {"done": done, "argv": argv, "folder": folder, "class_dir": folder / "results/class/week4"}


@pytest.mark.integration
@pytest.mark.long
@pytest.mark.timeout(1500)
def test_json_is_the_summary_alone_and_agrees_with_the_gradebook(graded):
    done = graded["done"]
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)  # stdout holds the document alone: progress went to stderr
    assert summary == {**json.loads((graded["class_dir"] / "summary.json").read_text()),
                       "max_score": summary["max_score"], "gradebook": str(graded["class_dir"] / "gradebook.csv"),
                       "class_page": str(graded["class_dir"] / "class.html"),
                       "summary": str(graded["class_dir"] / "summary.json")}
    maxima, *book = csv.DictReader((graded["class_dir"] / "gradebook.csv").open(newline=""))
    assert maxima["id"] == outputs.MAXIMA and maxima["max"] == f"{summary['max_score']:g}"
    assert [row["id"] for row in book] == [s["id"] for s in summary["students"].values()]
    for row, student in zip(book, summary["students"].values(), strict=True):
        assert row["status"] == student["status"]
        assert row["score"] == ("" if student["score"] is None else account.points(student["score"]))
        assert row["max"] == f"{summary['max_score']:g}"
        if student["reason"]:  # the gradebook's reason is the summary's where it has one
            assert row["reason"] == " ".join(student["reason"].split())
    assert summary["students"]["alice"]["status"] == "graded"
    assert summary["students"]["carol"]["status"] == "ungradable" and "wrong layout" in book[1]["reason"]


@pytest.mark.integration
@pytest.mark.long
@pytest.mark.timeout(1500)
def test_a_log_shows_each_submission_and_each_run_k_of_n_with_an_estimate(graded):
    done = graded["done"]
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    started = lines.index("started alice (submission 1 of 1, slot 0): 2 run(s) planned")
    first = next(i for i, line in enumerate(lines) if line.startswith("alice: run 1 of 2 "))
    second = next(i for i, line in enumerate(lines) if line.startswith("alice: run 2 of 2 "))
    finished = next(i for i, line in enumerate(lines) if line.startswith("finished alice: graded"))
    assert started < first < second < finished, done.stderr
    # Each run's line: which run, how it ended, the class's count, and the time left from the runs measured.
    assert re.fullmatch(r"alice: run 1 of 2 \(ddp ws=1 run 1/1\): ok in \d+ s; 0 of 1 submission\(s\) done, "
                        r"about .+ left \(1 run\(s\) at \d+ s, the mean of the 1 done\)", lines[first]), lines[first]
    assert re.fullmatch(r"alice: run 2 of 2 \(ddp ws=2 run 1/1\): ok in \d+ s; 0 of 1 submission\(s\) done",
                        lines[second]), lines[second]
    assert lines[finished].endswith("; 1 of 1 submission(s) done"), lines[finished]


@pytest.mark.integration
@pytest.mark.long
@pytest.mark.timeout(1500)
def test_a_dry_run_after_a_grade_estimates_from_the_jobs_it_measured(graded):
    assert graded["done"].returncode == 0, graded["done"].stdout + graded["done"].stderr
    before = snapshot(graded["folder"] / "results")
    again = run_distlab([*graded["argv"], "--dry-run", "--rerun", "alice"], cwd=graded["folder"])
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 run(s) per submission" in again.stdout, again.stdout
    measured = "measured: the mean job of the 1 submission(s) of this class graded already"
    assert re.search(rf"^time: about .+ per submission, .+ for 1 \({re.escape(measured)}", again.stdout, re.M)
    assert re.search(r"^disk: about [\d.]+ [KMG]iB per submission, .+ for 1 \(measured: the mean job folder",
                     again.stdout, re.M), again.stdout
    assert snapshot(graded["folder"] / "results") == before  # nothing written, nothing set aside
