"""`distlab grade-class`: a class graded in the sandbox, hostile submissions beside a correct one.

One class is graded once per module (cpu-smoke's ddp row at world size 2, without its throughput
band: no course-lab run beside each submission, which the speed tests of test_grade_mutations.py
cover): a correct program (tests/programs/ddp_program.py, the one test_grade_mutations.py shows
passing every check alone) and the hostile submissions of tests/submissions/ but the sleeper (graded
in the resume test, under a shorter watchdog: its wait would double this class's time). Each hostile
one must be contained, named in its own feedback, and leave the correct one's grade whole.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import tomli_w
from conftest import DISTLAB, run_distlab

from harness import files
from harness.classgrade import lessons, rubric, submissions
from harness.classgrade.outputs import csv_cell
from harness.classgrade.sandbox import bubblewrap, cgroups
from harness.classgrade.sandbox.bubblewrap import available, bwrap_argv
from harness.classgrade.sandbox.cgroups import Cgroup
from harness.classgrade.sandbox.limits import GIB, Limits
from harness.classgrade.sandbox.monitor import folder_usage
from harness.classgrade.sandbox.spec import Spec
from harness.classgrade.sandbox.uid import (
    FIRST_UID,
    _lock,
    claim_uid,
    closed_folder,
    end_processes_if_unclaimed,
    processes_left,
    uid_refusal,
)
from harness.grading import disk
from harness.usage import UsageError
from harness.verdict.profiles import tomllib
from harness.verdict.verdicts import Verdict

REPO = Path(__file__).resolve().parent.parent
HOSTILE = REPO / "tests/submissions"
CORRECT = REPO / "tests/programs/ddp_program.py"
COURSE = "https://course.example.org/ddp-lab/blob/week4/"  # where a test's class links its lessons
# What a graded submission keeps once judged (docs/grading-class.md, "Disk"): its logs, records and
# observations, no weights. The class profile's one run left 0.14 MB here; cpu-smoke's fourteen, 1.5 MB.
KEPT_BYTES = 8 << 20
WALL_S = 150  # the watchdog for every run: the correct program's graded run took 25 s here, 2 jobs at once
NOISY = {"speed"}  # wall time judged under the suite's other workers: not asserted for the correct program


def sandbox_missing() -> str | None:
    problem = available()
    if problem:
        return problem
    if os.geteuid() != 0:
        return "the sandbox needs root (a uid and a cgroup per job)"
    if Cgroup.create("probe", Limits()) is None:
        return "no writable memory and pids cgroup: the process and memory limits cannot be enforced"
    return None


needs_sandbox = pytest.mark.skipif(sandbox_missing() is not None, reason=str(sandbox_missing()))
# The tests of the one class graded per module: one xdist worker sets it up (--dist loadgroup). Its
# submissions (two at once) take minutes on an idle 2-core machine; the limit is for a busy one.
CLASS_TIMEOUT_S = 3600


def the_class(test):
    return pytest.mark.long(pytest.mark.timeout(CLASS_TIMEOUT_S)(pytest.mark.xdist_group("grade_class")(test)))


def class_profile(folder: Path) -> Path:
    data = tomllib.loads((REPO / "harness/profiles/cpu-smoke.toml").read_text())
    ddp = {key: value for key, value in data["labs"]["ddp"].items() if key not in ("single_device", "reference")}
    ddp["metrics"] = {name: band for name, band in ddp.get("metrics", {}).items() if name != "img_per_sec"}
    data.update(name="class-smoke", auto_select=False, labs={"ddp": {**ddp, "world_sizes": [2]}})
    path = folder / "profile.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def class_rubric(folder: Path, wall_s: float = WALL_S, output_gib: float = 1 / 16, **changes: float) -> Path:
    """The shipped ddp rubric with a test's limits: `output_gib` of output (64 MiB by default: the
    test's class fits; copies of the course lab, each saving ResNet-18's checkpoint, need more),
    `wall_s` per run; `changes`: points by item."""
    data = tomllib.loads(rubric.DEFAULT.read_text())
    data["limits"].update(output_gib=output_gib, wall_s=wall_s)
    for item in data["items"]:
        item["points"] = changes.get(item["name"], item["points"])
    path = folder / f"rubric-{len(list(folder.glob('rubric-*')))}.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def job_uids(class_dir: Path) -> set[int]:
    """The uids the class's jobs ran as (each claimed its own: other graders on the host have others)."""
    return {json.loads(spec.read_text())["uid"] for spec in class_dir.glob("jobs/*/sandbox.json")}


def processes_of(uids: set[int]) -> list[int]:
    """What is left running as the class's uids, of those no job holds now: the uids are the host's,
    and a test grading beside this one may have claimed one of them since this class let it go."""
    return [pid for uid in uids for pid in processes_left(uid) or []]


def grade_class(submissions: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """The class graded with links into this checkout (the tests read the feedback here), unless a test
    names other lessons."""
    lessons = [] if "--lessons" in args else ["--lessons", "local"]
    return run_distlab(["grade-class", str(submissions), "--lab", "ddp", *lessons, *args], timeout=timeout)


# The lecture's third pitfall as a mutant of the course lab: a branch of the model no step uses. DDP
# stops at the second step ("Expected to have finished reduction in the prior iteration ..."), and the
# feedback names the lesson from that message.
MODEL = "        model = models.build_model(args.stem).to(device)\n"
UNUSED = [(MODEL, MODEL + "        model.aux_head = torch.nn.Linear(10, 10).to(device)  # a branch no step uses\n")]


def unused_parameters_mutant(path: Path) -> Path:
    source = (REPO / "labs/ddp/train.py").read_text()
    assert source.count(UNUSED[0][0]) == 1, "the lab changed: its model line is not found once"
    path.write_text(source.replace(*UNUSED[0]))
    return path


# id -> words its gradebook reason must hold (what the grader saw, by name)
EXPECTED = {
    "reads-other": "tried to reach",
    "writes-grader": "tried to change",
    "network": "tried to reach the network beyond loopback",
    "fork-bomb": "started more than 512 processes",
    "fills-disk": "wrote more than 64 MiB into its folder",
    "sleeps-forever": "stopped: ran past its wall time of",
    "forges-observations": "names pid 4242, which no process running the program had",
    "kills-observer": "no rank left observations",
    # What a run leaves is read as hostile too (issue 36): each is named, and none reaches the grader.
    "plants-link": "observe/observer-errors.0.txt is a symbolic link (never followed or opened)",
    "plants-fifo": "observe/observer-errors.0.txt is a FIFO (never followed or opened)",
    "plants-zero": "observe/final_weights.pt is a symbolic link (never followed or opened)",
    "deep-path": "wrote more than 64 MiB into its folder",
    "many-files": "made more than 10000 files and folders in its folder",
    "reads-repository": "of the grader's checkout only the harness and the labs are in its sandbox",
    "makes-namespace": "tried something only root may do",
    "reads-environment": "it did not run to a record of its own",
    "forges-feedback": "it did not run to a record of its own",
    # The second round (issue 45): each contained, the class finished, the grader blamed for nothing.
    "deep-observation": "is not the observer's (unreadable)",  # nested 100,000 deep: no RecursionError
    "links-observe": "observe is a symbolic link (never followed or opened)",
    "odd-rank-folder": "attempt_9 is a symbolic link (never followed or opened)",  # and no rank "x" taken
    "sparse-logs": "it did not run to a record of its own",  # not "wrote more than": the copies are bounded
    "leaves-scratch": "it did not run to a record of its own",  # /tmp, /dev/shm its own; /var/tmp not there
    "reads-classmate": "it did not run to a record of its own",  # no other job's folder in its sandbox
    "fork-loop": "it did not run to a record of its own",
}
# Those that only fail to run: their feedback names no sandbox finding (so no link to the threat model).
CRASH_ONLY = {"reads-environment", "forges-feedback", "sparse-logs", "leaves-scratch", "reads-classmate", "fork-loop"}
# Entries of the submissions folder that must not stop the class: id in the gradebook -> its reason.
ODD_NAMES = {
    b"caf\xe9": "not a plain student id",  # latin-1, as a zip made on Windows names it
    b"n" * 240: "not a plain student id",
    b'=HYPERLINK("http:example.com","grades")': "not a plain student id",
    b"@SUM(A1)": "not a plain student id",
}
SECRET = "distlab-grader-secret-" + hashlib.sha256(str(os.getpid()).encode()).hexdigest()[:12]  # in the grader's env


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class")
    submissions = folder / "week4"
    submissions.mkdir()
    shutil.copy(CORRECT, submissions / "alice.py")
    for path in HOSTILE.glob("*.py"):
        if path.stem != "sleeps_forever":
            shutil.copy(path, submissions / f"{path.stem.replace('_', '-')}.py")
    with (submissions / "nan-clock.py").open("a") as nan_clock:  # then trains as alice does (its docstring)
        nan_clock.write("\n" + CORRECT.read_text())
    unused_parameters_mutant(submissions / "dave.py")
    (submissions / "carol").mkdir()  # a wrong layout: two programs, neither train.py
    for name in ("a.py", "b.py"):
        (submissions / "carol" / name).write_text("print('hello')\n")
    # A folder the grader must read without following or blocking: graded like alice.
    (submissions / "erin").mkdir()
    shutil.copy(CORRECT, submissions / "erin" / "train.py")
    (submissions / "erin" / "kmsg").symlink_to("/proc/kmsg")  # blocks a reader that follows it
    with open(os.fsencode(submissions / "erin") + b"/notes-caf\xe9.txt", "wb") as latin1:
        latin1.write(b"latin-1 name\n")
    (submissions / "fifo-folder").mkdir()  # a FIFO in a folder: refused before anything runs
    shutil.copy(CORRECT, submissions / "fifo-folder" / "train.py")
    os.mkfifo(submissions / "fifo-folder" / "pipe")
    for name in ODD_NAMES:
        os.mkdir(os.fsencode(submissions) + b"/" + name)
    harness_before = hashlib.sha256((REPO / "harness/verdict/verdicts.py").read_bytes()).hexdigest()
    profile, the_rubric = class_profile(folder), class_rubric(folder)
    done = subprocess.run([DISTLAB, "grade-class", str(submissions), "--lab", "ddp", "--profile", str(profile),
                           "--rubric", str(the_rubric), "--jobs", "2", "--results", str(folder / "results"),
                           "--lessons", "local"],
                          capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL,
                          env={**os.environ, "DISTLAB_GRADER_SECRET": SECRET})
    class_dir = folder / "results/class/week4"
    return {"done": done, "folder": folder, "submissions": submissions, "class_dir": class_dir,
            "profile": profile, "rubric": the_rubric, "harness_before": harness_before,
            "gradebook": {row["id"]: row for row in csv.DictReader((class_dir / "gradebook.csv").open(newline=""))},
            "summary": json.loads((class_dir / "summary.json").read_text())}


@needs_sandbox
@pytest.mark.integration
@the_class
def test_each_hostile_submission_is_contained_and_named_in_its_own_feedback(graded):
    assert graded["done"].returncode == 0, graded["done"].stdout + graded["done"].stderr
    book = graded["gradebook"]
    for student, words in EXPECTED.items():
        if student == "sleeps-forever":
            continue  # graded in the resume test
        row = book[student]
        assert row["status"] == "ungradable" and row["score"] == "", row  # never a silent 0
        assert words in row["reason"], (student, row["reason"])
        feedback = (graded["class_dir"] / "feedback" / f"{student}.md").read_text()
        assert words in feedback, (student, feedback)
        if student not in CRASH_ONLY:
            assert "docs/threat-model.md#what-a-submission-gets" in feedback
    assert "wrong layout: 2 .py files and none is train.py" in book["carol"]["reason"]
    assert "wrote more than" not in book["sparse-logs"]["reason"]  # the grader's copies of its logs are bounded
    # nan_clock.py: since #44 the observer's clock is its own, taken before the program's first line: the
    # NaN it sets never reaches the step times, and the correct program it runs earns what alice does, item
    # for item (a file with NaN in it is refused by the one JSON reader: test_untrusted.py).
    assert book["nan-clock"]["status"] == "graded", book["nan-clock"]
    assert "unreadable" not in book["nan-clock"]["reason"] and "clock" not in book["nan-clock"]["reason"]
    items = [name for name in book["alice"] if name not in ("id", "score", "status", "reason", "speed")]
    assert all(book["nan-clock"][item] == book["alice"][item] for item in items), (book["nan-clock"], book["alice"])


@needs_sandbox
@pytest.mark.integration
@the_class
def test_what_a_program_leaves_in_its_logs_is_copied_with_a_bound_and_never_through_a_link(graded):
    """sparse_logs.py: 30 MiB sparse files beside its output become at most 8 MiB each in a rank log;
    odd_rank_folder.py: a rank folder "x" passed over, a link in place of an attempt's folder not followed."""
    jobs = graded["class_dir"] / "jobs"
    for log in jobs.glob("sparse-logs/runs/*/*/rank.*.log"):
        assert log.stat().st_size < 2 * (8 << 20) + (64 << 10), (log, log.stat().st_size)
    logs = list(jobs.glob("odd-rank-folder/runs/*/*/rank.*.log"))
    assert logs and all("PLANTED-THROUGH-A-LINK" not in log.read_text() for log in logs)
    assert sorted(log.name for log in logs) == ["rank.0.log", "rank.1.log"]


@needs_sandbox
@pytest.mark.integration
@the_class
def test_a_process_forking_anew_is_gone_before_its_run_is_accounted(graded):
    """fork_loop.py: the marks its forks leave all predate the run's account (run.json)."""
    for run in graded["class_dir"].glob("jobs/fork-loop/runs/*/*/"):
        marks = [p.stat().st_mtime for p in run.glob("alive.*")]
        assert marks and max(marks) <= (run / "run.json").stat().st_mtime, run


@needs_sandbox
@pytest.mark.integration
@the_class
def test_nothing_a_run_leaves_or_its_environment_reaches_a_students_feedback(graded):
    """A link to a classmate's program, FIFOs and /dev/zero named like the observer's files: each named,
    none opened (the class finished: a FIFO would have blocked it, /dev/zero filled its memory), and no
    line of the files they point at shows. The grader's environment never reached a rank."""
    class_dir = graded["class_dir"]
    classmate = CORRECT.read_text().splitlines()[0]
    for student in ("plants-link", "plants-fifo", "plants-zero", "reads-environment"):
        pages = [(class_dir / "feedback" / f"{student}.{kind}").read_text() for kind in ("md", "html")]
        pages.append((class_dir / "gradescope" / student / "results.json").read_text())
        for text in pages:
            assert classmate not in text and "root:" not in text and SECRET not in text, (student, text)
    for log in class_dir.glob("jobs/reads-environment/runs/*/*/rank.*.log"):
        text = log.read_text()
        assert "environment:" in text and SECRET not in text and "DISTLAB_GRADER" not in text, text
    assert len(list(class_dir.glob("jobs/reads-environment/runs/*/*/rank.*.log"))) == 2  # every rank
    assert graded["summary"]["students"]["plants-link"]["status"] == "ungradable"


@needs_sandbox
@pytest.mark.integration
@the_class
def test_a_programs_text_is_quoted_in_its_feedback_never_obeyed(graded):
    class_dir = graded["class_dir"]
    markdown = (class_dir / "feedback/forges-feedback.md").read_text()
    assert "\nScore:" not in markdown and "\n# Score" not in markdown  # no forged score line
    quoted = next(line for line in markdown.splitlines() if "<script>" in line)
    assert quoted.startswith("**Ungradable**: `") and quoted.endswith("`"), quoted  # a code span: shown, inert
    assert "](javascript:" in quoted  # still there to read, inside the span: no link is made of it
    results = json.loads((class_dir / "gradescope/forges-feedback/results.json").read_text())
    assert results["output_format"] == "md" and "\n**Ungradable**: `" in results["output"]  # the same feedback
    assert "\nScore:" not in results["output"] and "\n# Score" not in results["output"]
    gradable = results["tests"][0]
    assert gradable["name"] == "gradable" and gradable["output"].startswith("Ungradable: `"), gradable
    assert "<script>" not in (class_dir / "feedback/forges-feedback.html").read_text()  # escaped there


@needs_sandbox
@pytest.mark.integration
@the_class
def test_odd_entries_of_the_submissions_folder_never_stop_the_class(graded):
    """Names of latin-1 bytes, of 240 characters, spreadsheet formulas; a folder with a link to
    /proc/kmsg and a latin-1 file name (graded, whole); a folder holding a FIFO (refused)."""
    book, class_dir = graded["gradebook"], graded["class_dir"]
    for name, reason in ODD_NAMES.items():
        shown = csv_cell(submissions.shown(os.fsdecode(name)))
        assert reason in book[shown]["reason"], (shown, book[shown])
    assert book[csv_cell(submissions.shown("=HYPERLINK(\"http:example.com\",\"grades\")"))]["id"].startswith("'=")
    assert all(not row["id"].startswith(("=", "+", "-", "@")) for row in book.values())
    assert book["caf\ufffd"]["status"] == "ungradable"
    feedback = sorted(p.name for p in (class_dir / "feedback").glob("submission-*.md"))
    assert len(feedback) == len(ODD_NAMES)  # each under a name of its own, none of theirs
    assert "is a FIFO; a submission holds files and folders only" in book["fifo-folder"]["reason"]
    the_rubric = rubric.load(graded["rubric"])
    assert book["erin"]["status"] == "graded", book["erin"]
    for item in the_rubric.items:
        if item.name not in NOISY:
            assert (float(book["erin"][item.name]) == item.points if item.points else  # a lesson: taught or not
                    book["erin"][item.name] in ("ok", "lesson")), (item.name, book["erin"])


@needs_sandbox
@pytest.mark.integration
@the_class
def test_the_correct_submission_keeps_its_whole_grade_beside_them(graded):
    row = graded["gradebook"]["alice"]
    the_rubric = rubric.load(graded["rubric"])
    assert row["status"] == "graded", row
    for item in the_rubric.items:
        if item.name not in NOISY:
            assert (float(row[item.name]) == item.points if item.points else  # a lesson: taught or not
                    row[item.name] in ("ok", "lesson")), (item.name, row)
    verdicts = graded["summary"]["students"]["alice"]
    assert verdicts["sandbox"] == [], verdicts  # nothing of the sandbox's account: it asked for nothing it may not have


@needs_sandbox
@pytest.mark.integration
@the_class
def test_unused_parameters_are_named_from_ddps_own_error_with_their_lesson(graded):
    feedback = (graded["class_dir"] / "feedback/dave.md").read_text()
    assert "### unused_parameters" in feedback and "Expected to have finished reduction" in feedback, feedback
    assert "find_unused_parameters=True" in feedback and "labs/TRAINING.md#unused-parameters" in feedback


@needs_sandbox
@pytest.mark.integration
@the_class
def test_the_graders_files_and_the_machine_are_left_as_they_were(graded):
    assert hashlib.sha256((REPO / "harness/verdict/verdicts.py").read_bytes()).hexdigest() == graded["harness_before"]
    assert "every verdict passes" not in (graded["class_dir"] / "gradebook.csv").read_text()
    # Every process of the sandboxes ended (the fork bomb's too); the cgroups are gone.
    uids = job_uids(graded["class_dir"])
    assert len(uids) >= 2  # each job its own uid (several jobs, two at once)
    assert processes_of(uids) == []
    assert not list(Path("/sys/fs/cgroup/pids/distlab").glob("*-fork-bomb"))
    # The disk filler was stopped near its limit: 64 MiB, and what two ranks write in one look of the monitor.
    filled = folder_usage(graded["class_dir"] / "jobs/fills-disk", Limits())[0].bytes
    assert filled < 1 << 30, filled


@needs_sandbox
@pytest.mark.integration
@the_class
def test_feedback_teaches_and_hidden_items_stay_hidden(graded):
    class_dir = graded["class_dir"]
    results = json.loads((class_dir / "gradescope/alice/results.json").read_text())
    assert {t["name"]: t["visibility"] for t in results["tests"]}["speed"] == "hidden"
    assert results["score"] == float(graded["gradebook"]["alice"]["score"])
    assert all({"name", "score", "max_score", "status", "output", "visibility"} <= set(t) for t in results["tests"])
    feedback = (class_dir / "feedback/alice.md").read_text()
    assert "speed" not in feedback and "1 item(s) not shown yet" in feedback
    page = (class_dir / "class.html").read_text()
    assert "data:image/png;base64," in page and "sandbox: stopped" in page  # the distribution; the pitfalls


@needs_sandbox
@pytest.mark.integration
@the_class
def test_a_regrade_after_the_rubric_changed_recomputes_without_training(graded):
    runs_before = sorted(graded["class_dir"].glob("jobs/*/runs/*/*"))
    changes = {"runs to the end": 4, "an honest record": 5}
    doubled = class_rubric(graded["folder"], **changes)
    done = grade_class(graded["submissions"], "--profile", str(graded["profile"]), "--rubric", str(doubled),
                       "--results", str(graded["folder"] / "results"), "--regrade")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 to grade" in done.stdout
    assert sorted(graded["class_dir"].glob("jobs/*/runs/*/*")) == runs_before  # nothing ran
    row = next(r for r in csv.DictReader((graded["class_dir"] / "gradebook.csv").open()) if r["id"] == "alice")
    shipped = {item["name"]: item["points"] for item in tomllib.loads(rubric.DEFAULT.read_text())["items"]}
    raised = rubric.load(doubled).max_score
    assert raised == rubric.load(class_rubric(graded["folder"])).max_score + sum(
        points - shipped[name] for name, points in changes.items())
    assert (row["runs to the end"], row["an honest record"], float(row["max"])) == ("4", "5", raised)


@needs_sandbox
@pytest.mark.integration
@the_class
def test_a_results_folder_moved_elsewhere_regrades_to_the_same_grades(graded, tmp_path):
    # Moved (renamed: a copy cannot take the deep-path submission's folders, past PATH_MAX), then back.
    moved = tmp_path / "archive"
    os.rename(graded["folder"] / "results", moved)
    try:
        done = grade_class(graded["submissions"], "--profile", str(graded["profile"]), "--rubric",
                           str(graded["rubric"]), "--results", str(moved), "--regrade")
        assert done.returncode == 0 and "0 to grade" in done.stdout, done.stdout + done.stderr
        book = {row["id"]: row for row in csv.DictReader((moved / "class/week4/gradebook.csv").open(newline=""))}
        assert book == graded["gradebook"]  # not "pending": the stored jobs are found where they lie now
        feedback = (moved / "class/week4/feedback/dave.md").read_text()
        assert "### unused_parameters" in feedback  # the crash lesson, read from the moved runs' logs
    finally:
        os.rename(moved, graded["folder"] / "results")


@needs_sandbox
@pytest.mark.integration
def test_a_class_stopped_by_sigterm_resumes_where_it_stopped(tmp_path):
    submissions = tmp_path / "late"
    submissions.mkdir()
    shutil.copy(HOSTILE / "sleeps_forever.py", submissions / "a-sleeper.py")
    shutil.copy(HOSTILE / "network.py", submissions / "b-network.py")
    args = [DISTLAB, "grade-class", str(submissions), "--profile", str(class_profile(tmp_path)), "--rubric",
            str(class_rubric(tmp_path, wall_s=20)), "--jobs", "1", "--results", str(tmp_path / "results"),
            "--lessons", "local"]
    grader = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    class_dir = tmp_path / "results/class/late"
    deadline = time.monotonic() + 120
    while not list(class_dir.glob("jobs/a-sleeper/runs/*/*/launcher.log")):  # the sleeper's run has started
        assert grader.poll() is None and time.monotonic() < deadline, grader.communicate()[0]
        time.sleep(0.2)
    grader.send_signal(signal.SIGTERM)
    output = grader.communicate(timeout=120)[0]
    assert grader.returncode in (130, 143), output
    assert not (class_dir / "jobs/a-sleeper/observations.json").exists()
    assert not (class_dir / "jobs/b-network").exists()
    assert processes_of(job_uids(class_dir)) == []
    again = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 to grade" in again.stdout
    book = {row["id"]: row for row in csv.DictReader((class_dir / "gradebook.csv").open())}
    assert "timed out after 20 s" in book["a-sleeper"]["reason"] and book["b-network"]["status"] == "ungradable"
    assert f"{EXPECTED['sleeps-forever']} 20 s" in (class_dir / "feedback/a-sleeper.md").read_text()
    once_more = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert "0 to grade" in once_more.stdout, once_more.stdout  # finished jobs are kept, not graded again


@needs_sandbox
@pytest.mark.integration
def test_a_class_keeps_the_profile_it_was_graded_with_unless_another_is_given(tmp_path):
    """Graded under a profile file of the course's own; a resume and a regrade that name none keep it
    (on this host, whose own default is another), every output naming it; a regrade under another
    profile judges the stored runs under that one, named everywhere; a resume under a profile the
    stored runs were not made under grades them again."""
    subs = tmp_path / "week4"
    subs.mkdir()
    shutil.copy(CORRECT, subs / "alice.py")
    own = class_profile(tmp_path).resolve()  # stored resolved: a profile file is found by it on any host
    results = tmp_path / "results"
    class_dir = results / "class/week4"
    the_rubric = class_rubric(tmp_path).resolve()
    base = ["--rubric", str(the_rubric), "--results", str(results)]

    def stored() -> tuple[dict, str, dict, list[Path]]:
        book = {row["id"]: row for row in csv.DictReader((class_dir / "gradebook.csv").open(newline=""))}
        return (json.loads((class_dir / "summary.json").read_text()), (class_dir / "class.html").read_text(), book,
                sorted(class_dir.glob("jobs/*/runs/*/*")))

    done = grade_class(subs, "--profile", str(own), *base)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((class_dir / "settings.json").read_text()) == {
        "lab": "ddp", "profile": "class-smoke", "profile_file": str(own), "world_sizes": None,
        "rubric": str(the_rubric), "lessons": "local"}
    summary, page, book, runs = stored()
    assert (summary["profile"], summary["profile_file"]) == ("class-smoke", str(own))
    assert f"profile <b>class-smoke</b> ({own})" in page and book["alice"]["status"] == "graded"

    for again in (["--regrade"], []):  # a regrade, a resume: nothing given, nothing run, the same outputs
        kept = grade_class(subs, *again, *base)
        assert kept.returncode == 0 and "0 to grade" in kept.stdout, kept.stdout + kept.stderr
        assert f"settings kept from the class's last grade ({class_dir / 'settings.json'}): lab ddp, " \
               f"profile class-smoke ({own})" in kept.stdout
        summary, page, now_book, now_runs = stored()
        assert (summary["profile"], summary["profile_file"]) == ("class-smoke", str(own))
        assert f"profile <b>class-smoke</b> ({own})" in page and (now_book, now_runs) == (book, runs)

    other = grade_class(subs, "--regrade", "--profile", "cpu-smoke", *base)
    assert other.returncode == 0 and "0 to grade" in other.stdout, other.stdout + other.stderr
    assert f"the class's last grade had lab ddp, profile class-smoke ({own})" in other.stdout
    summary, page, book, after = stored()
    assert (summary["profile"], summary["profile_file"], after) == ("cpu-smoke", None, runs)  # nothing ran
    assert "profile <b>cpu-smoke</b>," in page and "class-smoke" not in page
    assert json.loads((class_dir / "settings.json").read_text())["profile"] == "cpu-smoke"

    # The stored runs were made under class-smoke: a resume under a copy of it elsewhere makes them stale.
    (tmp_path / "copy").mkdir()
    copy = class_profile(tmp_path / "copy").resolve()
    resumed = grade_class(subs, "--profile", str(copy), *base)
    assert resumed.returncode == 0 and "1 to grade" in resumed.stdout, resumed.stdout + resumed.stderr
    assert "stale and graded again" in resumed.stdout
    assert json.loads((class_dir / "jobs/alice/job.json").read_text())["profile"] == str(copy)
    assert (class_dir / "jobs/alice.before-1/observations.json").is_file()  # the earlier grade, set aside
    summary, page, book, _ = stored()
    assert summary["profile_file"] == str(copy) and f"({copy})" in page and book["alice"]["status"] == "graded"


@needs_sandbox
@pytest.mark.integration
def test_a_graded_submission_keeps_no_weights_and_regrades_unless_told_to_keep_them(tmp_path):
    """Once its runs are judged, a submission's folder holds no weights or checkpoints (each named in
    weights.json by size and sha256) and stays under the stated bound; --regrade judges it the same
    (it reads observations.json and logs, never weights), with the lessons the class was graded with;
    --keep keeps every file."""
    subs = tmp_path / "week4"
    subs.mkdir()
    shutil.copy(CORRECT, subs / "alice.py")
    results = tmp_path / "results"
    class_dir, job = results / "class/week4", results / "class/week4/jobs/alice"
    base = ["grade-class", str(subs), "--lab", "ddp", "--profile", str(class_profile(tmp_path)), "--rubric",
            str(class_rubric(tmp_path)), "--results", str(results)]

    def weights(folder: Path) -> list[str]:
        return sorted(name for name, info, _, entry in files.walk(folder) if entry.endswith(disk.WEIGHTS))

    def gradebook() -> dict[str, dict[str, str]]:
        return {row["id"]: row for row in csv.DictReader((class_dir / "gradebook.csv").open(newline=""))}

    done = run_distlab([*base, "--lessons", COURSE], timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert weights(job) == [] and files.tree_usage(job).bytes <= KEPT_BYTES, files.tree_usage(job)
    removed = json.loads((job / disk.MANIFEST).read_text())
    assert {Path(entry["path"]).name for entry in removed["removed"]} >= {"final_weights.pt", "checkpoint.pt"}
    assert all(len(entry["sha256"]) == 64 and entry["bytes"] > 0 for entry in removed["removed"])
    book = gradebook()
    assert book["alice"]["status"] == "graded", book
    assert json.loads((class_dir / "settings.json").read_text())["lessons"] == COURSE
    for page in ("feedback/alice.md", "feedback/alice.html", "gradescope/alice/results.json",
                 "prairielearn/alice/results.json"):
        assert "file:" not in (class_dir / page).read_text()

    again = run_distlab([*base, "--regrade"])  # no --lessons: the class's own
    assert again.returncode == 0 and "0 to grade" in again.stdout, again.stdout + again.stderr
    assert f"lessons {COURSE}" in again.stdout and gradebook() == book

    kept = run_distlab([*base, "--rerun", "alice", "--keep"], timeout=900)
    assert kept.returncode == 0 and "1 to grade" in kept.stdout, kept.stdout + kept.stderr
    assert {Path(name).name for name in weights(job)} >= {"final_weights.pt", "checkpoint.pt"}
    assert not (job / disk.MANIFEST).exists() and (class_dir / "jobs/alice.before-1" / disk.MANIFEST).is_file()
    assert gradebook()["alice"]["status"] == "graded"


def test_lesson_links_go_to_the_address_given_and_to_this_machine_only_by_name():
    assert lessons.lessons_argument("https://course.example.org/ddp") == "https://course.example.org/ddp/"
    assert lessons.lesson_root("https://course.example.org/ddp/") == "https://course.example.org/ddp/"
    assert lessons.lessons_argument("local") == "local" and lessons.lesson_root("local") == REPO.as_uri() + "/"
    for not_an_address in ("labs/", "course.example.org/ddp", "https:///ddp", "ftp://course.example.org/"):
        with pytest.raises(argparse.ArgumentTypeError, match="local"):
            lessons.lessons_argument(not_an_address)


def test_a_class_grade_that_would_link_the_graders_files_is_refused_in_one_line(tmp_path):
    """Feedback is read mailed or on a platform: links into this machine's files are refused unless
    asked for (--lessons local); an address is taken, and a bad one refused naming the fix."""
    if lessons.course_lesson_root() is not None:
        pytest.skip("this checkout has an https origin: its lessons are linked there")
    subs, a_file = tmp_path / "week4", tmp_path / "a-file"
    subs.mkdir()
    (subs / "alice.py").write_text("")
    a_file.write_text("")
    argv = ["grade-class", str(subs), "--no-sandbox", "--profile", "cpu-smoke"]
    done = run_distlab(argv, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "give --lessons URL" in done.stderr and "--lessons local" in done.stderr
    bad = run_distlab([*argv, "--lessons", "labs/"], cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no address a browser opens" in bad.stderr
    # An address (or `local`) passes: the next refusal is the last one, the results folder's.
    for given in (COURSE, "local"):
        past = run_distlab([*argv, "--lessons", given, "--results", f"{a_file}/results"], cwd=tmp_path)
        assert past.returncode == 2 and "is not writable" in past.stderr, past.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "week4"]


@needs_sandbox
@pytest.mark.integration
def test_a_job_leaves_nothing_in_the_kernel_for_the_next_job_of_its_uid(tmp_path):
    """Two jobs one after the other (--jobs 1: the same sandbox uid): the first may neither make a user
    namespace nor keep a key in the uid's keyring; the second finds none."""
    subs = tmp_path / "kernel"
    subs.mkdir()
    shutil.copy(HOSTILE / "makes_namespace.py", subs / "a-makes-namespace.py")
    shutil.copy(HOSTILE / "reads_keyring.py", subs / "b-reads-keyring.py")
    # The channel needs both jobs to run as one uid. Each job claims the lowest uid free on the host, so
    # another grader (a suite's other workers) may take the first job's uid before the second claims
    # it: then the pair is graded again, at most three times, and the last pair must share its uid.
    for attempt in range(3):
        results = tmp_path / f"results-{attempt}"
        done = grade_class(subs, "--profile", str(class_profile(tmp_path)), "--rubric", str(class_rubric(tmp_path)),
                           "--jobs", "1", "--results", str(results))
        assert done.returncode == 0, done.stdout + done.stderr
        class_dir = results / "class/kernel"
        made = "".join(p.read_text() for p in class_dir.glob("jobs/a-makes-namespace/runs/*/*/rank.*.log"))
        assert "unshare(CLONE_NEWUSER): Operation not permitted" in made and "add_key: Operation not permitted" in made
        read = "".join(p.read_text() for p in class_dir.glob("jobs/b-reads-keyring/runs/*/*/rank.*.log"))
        assert "no key from an earlier job" in read and "read an earlier job's key" not in read, read
        if len(job_uids(class_dir)) == 1:
            break
    assert len(job_uids(class_dir)) == 1, "each time another grader took the uid between the two jobs"


# What the uid sandbox (no namespaces: a container that refuses them, such as Gradescope's) holds and
# what it cannot: each submission's gradebook words under it.
UID_MODE_EXPECTED = {
    "reads-other": "it did not run to a record of its own",  # its folder is a copy of its own: no classmate there
    "writes-grader": "tried to change",  # the harness is root's, read-only to every other uid
    "fork-bomb": "started more than 512 processes",
    "reads-environment": "it did not run to a record of its own",
    # The second round (issue 45): what a uid job leaves outside its folder, or reaches of an earlier
    # job's of the same uid, and a folder past PATH_MAX left for the next grade of the class.
    "leaves-scratch": "left outside its folder: /var/tmp/distlab-left-",
    "reads-classmate": "it did not run to a record of its own",
    "fork-loop": "it did not run to a record of its own",
    "deep-path": "wrote more than 64 MiB into its folder",
}


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="the uid sandbox needs root and setpriv")
@pytest.mark.integration
@pytest.mark.long
@pytest.mark.timeout(CLASS_TIMEOUT_S)
def test_without_namespaces_the_uid_sandbox_keeps_each_job_to_its_own(tmp_path, python_others_may_run):
    results = Path(tempfile.mkdtemp(prefix="distlab-uid-", dir="/var/tmp"))  # below folders others may pass
    try:
        uid_mode_class(tmp_path, results)
    finally:
        shutil.rmtree(results, ignore_errors=True)


def uid_mode_class(tmp_path: Path, results: Path) -> None:
    subs = tmp_path / "week5"
    subs.mkdir()
    shutil.copy(CORRECT, subs / "alice.py")
    for student in UID_MODE_EXPECTED:
        shutil.copy(HOSTILE / f"{student.replace('-', '_')}.py", subs / f"{student}.py")
    done = subprocess.run([DISTLAB, "grade-class", str(subs), "--lab", "ddp", "--profile", str(class_profile(tmp_path)),
                           "--rubric", str(class_rubric(tmp_path)), "--jobs", "2", "--sandbox", "uid",
                           "--results", str(results), "--lessons", "local"], capture_output=True, text=True,
                          timeout=1800,
                          stdin=subprocess.DEVNULL, env={**os.environ, "DISTLAB_GRADER_SECRET": SECRET})
    assert done.returncode == 0, done.stdout + done.stderr
    class_dir = results / "class/week5"
    book = {row["id"]: row for row in csv.DictReader((class_dir / "gradebook.csv").open(newline=""))}
    for student, words in UID_MODE_EXPECTED.items():
        assert book[student]["status"] == "ungradable" and words in book[student]["reason"], book[student]
    the_rubric = rubric.load(class_rubric(tmp_path))
    assert book["alice"]["status"] == "graded", book["alice"]
    for item in the_rubric.items:
        if item.name not in NOISY:
            assert (float(book["alice"][item.name]) == item.points if item.points else  # a lesson: taught or not
                    book["alice"][item.name] in ("ok", "lesson")), (item.name, book["alice"])
    assert "uid sandbox" in (class_dir / "feedback/alice.md").read_text()  # every page says which sandbox
    assert json.loads((class_dir / "summary.json").read_text())["sandbox"] == "uid"
    assert SECRET not in "".join(p.read_text() for p in class_dir.glob("jobs/reads-environment/runs/*/*/rank.*.log"))
    read = "".join(p.read_text() for p in class_dir.glob("jobs/reads-other/runs/*/*/rank.*.log"))
    assert "No such file or directory" in read and CORRECT.read_text().splitlines()[0] not in read
    assert not os.stat(subs).st_mode & 0o007 and not os.stat(class_dir).st_mode & 0o006  # closed to other uids
    assert processes_of(job_uids(class_dir)) == []
    # Nothing of an earlier job reached a later one of the same uid: each job's folder is root's at its
    # end, its submission's copy gone; what it left in /tmp, /var/tmp, /dev/shm is gone too.
    read = "".join(p.read_text() for p in class_dir.glob("jobs/reads-classmate/runs/*/*/rank.*.log"))
    assert "refused alice" in read and "read alice" not in read and "planted in" not in read, read
    uids = job_uids(class_dir)
    assert [name for name, info, _, _ in files.walk(class_dir, 1000) if info.st_uid in uids] == []  # past PATH_MAX too
    assert not list(class_dir.glob("jobs/*/submission"))
    assert [p for top in ("/tmp", "/var/tmp", "/dev/shm") for p in Path(top).glob("distlab-left-*")
            if p.lstat().st_uid in uids] == []
    for run in class_dir.glob("jobs/fork-loop/runs/*/*/"):  # its forks all ended before the run's account
        marks = [p.stat().st_mtime for p in run.glob("alive.*")]
        assert marks and max(marks) <= (run / "run.json").stat().st_mtime, run
    # deep_path.py left a folder past PATH_MAX: the class's next grade walks it to close it, and goes on.
    again = subprocess.run(done.args, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert again.returncode == 0 and "0 to grade" in again.stdout, again.stdout + again.stderr


# ------------------------------------------------------------------------------------ no runs

@pytest.mark.skipif(os.geteuid() != 0, reason="the probe runs as a job's uid: root makes it one")
def test_the_uid_sandbox_refuses_in_one_line_where_its_uid_cannot_reach_the_python(tmp_path):
    closed = closed_folder(Path(os.path.realpath(sys.executable)).parent)
    refusal = uid_refusal()
    if closed is None:
        assert refusal is None
    else:
        assert f"{closed} is closed to other users" in refusal and f"chmod o+x {closed}" in refusal
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "a.py").write_text("")
    done = run_distlab(["grade-class", str(tmp_path / "subs"), "--sandbox", "uid", "--results",
                        str(private / "results")])
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "closed to other users" in done.stderr or "other users may not pass through" in done.stderr, done.stderr

def test_layouts_that_cannot_be_graded_say_why(tmp_path):
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "train.py").write_text("")
    (tmp_path / "ok" / "helpers.py").write_text("")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "bad id!").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "ok")
    (tmp_path / "solo.py").write_text("")
    found = {s.id: s for s in submissions.find_submissions(tmp_path)}
    assert found["ok"].program == tmp_path / "ok" / "train.py" and not found["ok"].problem
    assert found["solo"].program == tmp_path / "solo.py" and not found["solo"].problem
    assert found["empty"].problem == "no .py program in its folder"
    assert found["notes.txt"].problem == "notes.txt is not a .py program"
    assert "not a plain student id" in found["bad id!"].problem
    assert "is a link" in found["link"].problem


def test_a_rubric_scores_partial_credit_and_refuses_mistakes_by_name(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[[items]]\nname = "shards"\nchecks = ["observed:shards_*"]\npoints = 3\npartial = true\n'
                    '[[items]]\nname = "honest"\nchecks = ["claim:*"]\npoints = 1\nabsent_passes = true\n')
    the_rubric = rubric.load(path)
    verdicts = [Verdict("ddp", 2, "run", "1/1 ok", "all ok", True),
                Verdict("ddp", 2, "observed:shards_disjoint", "FAILED", "passed", False, "ranks 0 and 1 both ..."),
                Verdict("ddp", 2, "observed:shards_cover", "passed", "passed", True),
                Verdict("ddp", 2, "observed:shards_extra", "n/a", "passed", None)]
    scores = {s.item.name: s.score for s in the_rubric.score(verdicts)}
    assert scores == {"shards": 1.5, "honest": 1.0}  # 3 x 1 of 2 judged; no claim contradicted
    path.write_text('[[items]]\nname = "x"\nchecks = ["run"]\npoints = 1\nvisibility = "after_due_date"\n')
    with pytest.raises(UsageError, match="after_due_date, but the rubric has no due date"):
        rubric.load(path)
    path.write_text('[[items]]\nname = "x"\nchecks = ["run"]\npoints = 1\nvisibility = "secret"\n')
    with pytest.raises(UsageError, match=r"items\[1\].visibility must be one of visible, hidden, after_due_date"):
        rubric.load(path)


def test_without_bubblewrap_the_class_grade_refuses_in_one_line_naming_the_install(tmp_path, monkeypatch):
    monkeypatch.setattr(bubblewrap.shutil, "which", lambda name: None)
    assert "apt-get install bubblewrap" in available() and "--no-sandbox" in available()
    done = run_distlab(["grade-class", str(tmp_path / "missing"), "--lab", "ddp"])
    assert done.returncode == 2 and "does not exist" in done.stderr, done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid claims live in a root-only folder")
def test_jobs_at_once_never_share_a_uid():
    first, held = claim_uid()
    second, other = claim_uid()
    try:
        assert first != second  # another grader's job, or a test worker's, gets another uid
        assert _lock(first) is None  # claimed: no other job gets it while its holder runs
        end_processes_if_unclaimed(first)  # and a sweep after a kill leaves a claimed uid alone
    finally:
        os.close(held)
        os.close(other)


def test_a_checkout_under_tmp_is_bound_again_over_the_private_tmp(tmp_path):
    # A clone in /tmp (CI's, a student's): the sandbox's empty /tmp would hide the repository and its
    # environment, and every run would end with exit code 127 (command not found).
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    spec = Spec(uid=FIRST_UID, limits={}, read_only=[str(checkout)], hidden=[])
    argv = bwrap_argv(spec, str(tmp_path / "run"), ["true"])
    private_tmp = argv.index("--tmpfs", argv.index("--dev"))
    binds = [i for i in range(len(argv) - 1) if argv[i] == "--ro-bind" and argv[i + 1] == str(checkout)]
    assert binds and binds[-1] > private_tmp


@pytest.mark.parametrize("version", [1, 2])
def test_the_limits_land_in_the_cgroup_files_of_either_version(version, tmp_path, monkeypatch):
    """Both layouts, on a fake hierarchy: this host has cgroup v1 (memory and pids, v2 only for
    hugetlb), so without this the v2 path would never run before a v2 host graded with it."""
    if version == 2:
        (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    else:
        for kind in ("memory", "pids"):
            (tmp_path / kind).mkdir()
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", tmp_path)
    limits = Limits(memory_bytes=3 * GIB, processes=77)
    group = Cgroup.create("class-alice", limits)
    assert group is not None and group.version == version
    memory, pids = group.dirs["memory"], group.dirs["pids"]
    if version == 2:
        assert memory == pids == tmp_path / "distlab" / "class-alice"
        assert (tmp_path / "distlab" / "cgroup.subtree_control").read_text() == "+memory +pids"
        assert (memory / "memory.max").read_text() == str(3 * GIB)
        assert (memory / "memory.swap.max").read_text() == "0"  # RAM and swap together, as v1's memsw
        (memory / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
        (memory / "memory.peak").write_text("123456\n")
    else:
        assert memory == tmp_path / "memory" / "distlab" / "class-alice"
        assert (memory / "memory.limit_in_bytes").read_text() == str(3 * GIB)
        assert (memory / "memory.memsw.limit_in_bytes").read_text() == str(3 * GIB)
        (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
        (memory / "memory.max_usage_in_bytes").write_text("123456\n")
    assert (pids / "pids.max").read_text() == "77"
    (pids / "pids.events").write_text("max 3\n")
    assert (group.oom_kills(), group.process_limit_hits(), group.peak_memory()) == (1, 3, 123456)
    assert group.procs_files() == sorted({str(memory / "cgroup.procs"), str(pids / "cgroup.procs")})


def test_no_writable_cgroup_hierarchy_gives_no_cgroup(tmp_path, monkeypatch):
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", tmp_path)  # neither layout: the job is refused upstream
    assert Cgroup.create("class-alice", Limits()) is None


def test_the_class_page_counts_the_pitfall_that_ended_a_run_not_the_run():
    from harness.classgrade.account import Outcome
    from harness.classgrade.outputs import failed_checks

    def failing(*checks: str) -> list[Verdict]:
        return [Verdict("ddp", 2, check, "FAILED", "passed", False) for check in checks]

    outcomes = [
        Outcome("no-set-epoch", "graded", verdicts=failing("run", "observed:order_changes_per_epoch")),
        Outcome("unused", "graded", verdicts=failing("run"), crashes=[("unused_parameters", "DDP's error")]),
        Outcome("bomb", "ungradable", verdicts=failing("run"), sandbox={"breaches": ["started more than 512"]}),
        Outcome("crashed", "ungradable", verdicts=failing("run")),  # nothing else says why: the run is the finding
        Outcome("no-sampler", "graded", verdicts=failing("observed:shards_disjoint")),
    ]
    assert failed_checks(outcomes) == {"run": 1, "observed:order_changes_per_epoch": 1, "unused_parameters": 1,
                                       "sandbox: stopped": 1, "observed:shards_disjoint": 1}


def test_feedback_puts_what_ended_the_run_before_the_failed_run():
    from harness.classgrade.account import Outcome, findings

    shipped = rubric.load()
    verdicts = [Verdict("ddp", 2, "run", "0/1 ok", "all ok", False, "rank 0 exited with code 1"),
                Verdict("ddp", 2, "observed:order_changes_per_epoch", "FAILED", "passed", False, "the same order")]
    outcome = Outcome("no-set-epoch", "graded", scores=shipped.score(verdicts), verdicts=verdicts)
    assert [f.check for f in findings(outcome, shipped, shown_only=False)] == [
        "observed:order_changes_per_epoch", "run"]
    alone = [Verdict("ddp", 2, "run", "0/1 ok", "all ok", False, "rank 0 exited with code 1")]
    crashed = Outcome("crashed", "graded", scores=shipped.score(alone), verdicts=alone)
    assert [f.check for f in findings(crashed, shipped, shown_only=False)] == ["run"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--lab", "ddpp"], "unknown lab 'ddpp' (did you mean 'ddp'?)"),
    (["--profile", "cpu-smok"], "no profile 'cpu-smok' (did you mean 'cpu-smoke'?)"),
    (["--profile", "./nothere.toml"], "no profile file ./nothere.toml (it does not exist)"),
    (["--results", "{a_file}/results"], "results folder {a_file}/results is not writable (Not a directory); "
                                        "choose another --results"),
])
def test_bad_input_to_a_class_grade_is_one_line_and_nothing_is_written(tmp_path, argv, message):
    """Refused before any job starts, as `grade` and `run` refuse the same input."""
    subs, a_file = tmp_path / "week4", tmp_path / "a-file"
    subs.mkdir()
    (subs / "alice.py").write_text("")
    a_file.write_text("")
    argv = [arg.format(a_file=a_file) for arg in argv]
    done = run_distlab(["grade-class", str(subs), "--no-sandbox", "--lessons", "local", *argv], cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert message.format(a_file=a_file) in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "week4"]


def test_results_inside_the_submissions_folder_are_refused_and_nothing_is_written(tmp_path):
    subs = tmp_path / "week4"
    subs.mkdir()
    (subs / "alice.py").write_text("")
    done = run_distlab(["grade-class", str(subs), "--lab", "ddp", "--no-sandbox", "--results", str(subs)])
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "inside the submissions folder" in done.stderr and "outside it" in done.stderr
    assert sorted(p.name for p in subs.iterdir()) == ["alice.py"]  # no grade became a student's folder


BOTH = ["checkpoint.pt", "final_weights.pt"]


@pytest.mark.parametrize("judged, keep, left", [(False, False, []), (True, False, BOTH), (False, True, BOTH)])
def test_a_job_stopped_before_it_was_judged_is_set_aside_without_its_weights(tmp_path, judged, keep, left):
    """Issue 49: a class stopped mid-job and resumed set the job aside as <id>.before-1 with every
    weights file its runs had written (386 MB for one submission of the course lab). Never judged, it
    never would be: its weights are released as a judged job's are, each named in weights.json. A
    judged job's are already released (what is left was kept on purpose), and --keep keeps them."""
    from harness.classgrade.grading_loop import _set_aside

    job = tmp_path / "jobs/bob"
    run = job / "runs/ddp/20261206-032059-ws2-torchrun"
    (run / "observe").mkdir(parents=True)
    (run / "observe/final_weights.pt").write_bytes(b"w" * 1000)
    (run / "checkpoint.pt").write_bytes(b"c" * 10)
    if judged:
        (job / "observations.json").write_text("{}")
    _set_aside(job, keep)
    aside = tmp_path / "jobs/bob.before-1"
    assert not job.exists() and (aside / "runs").is_dir()
    assert sorted(p.name for p in aside.rglob("*.pt")) == left
    manifest = aside / disk.MANIFEST
    if left:
        assert not manifest.exists()
    else:
        removed = json.loads(manifest.read_text())
        assert removed["bytes"] == 1010 and {Path(e["path"]).name for e in removed["removed"]} == {
            "final_weights.pt", "checkpoint.pt"}


def test_a_students_pages_are_written_once_per_grade(tmp_path):
    """Issue 50: a job's pages were written as it ended and again, the same, at the class's end. Written
    once: asked again in the same grade, what was written stands (its outcome, not its files made again);
    each platform's results.json carries the very Markdown of feedback/<id>.md."""
    from harness.classgrade import classroom
    from harness.classgrade.grading_loop import write_pages

    (tmp_path / "week" / "carol").mkdir(parents=True)  # a wrong layout: judged without a run
    for name in ("a.py", "b.py"):
        (tmp_path / "week" / "carol" / name).write_text("print('hello')\n")
    (student,) = submissions.find_submissions(tmp_path / "week")
    room = classroom.Classroom(classroom.ClassRequest(tmp_path / "week", results=tmp_path / "results"),
                               rubric.load(rubric.DEFAULT), [student], {"carol": None}, None, 1)
    first = write_pages(room, student, COURSE)
    feedback = room.class_dir / "feedback" / "carol.md"
    said = feedback.read_text()
    assert first.status == "ungradable" and "wrong layout" in said
    for platform in ("gradescope", "prairielearn"):
        assert json.loads((room.class_dir / platform / "carol" / "results.json").read_text())["output"] == said
    feedback.unlink()  # a second writing would make it again
    assert write_pages(room, student, COURSE) is first and not feedback.exists()
