"""The Gradescope bundle (`grade-class --autograder`), its grading step and the results it writes.

What the bundle holds and what its setup installs; its grading step (harness/classgrade/gradescope.py)
run on Gradescope's layout in a temporary folder: the resources it measures, an ungradable
submission, a grader that fails, the deadline, run_autograder's own trap; and the fields of
Gradescope's and PrairieLearn's results. A whole grade in Gradescope's container, with its limits,
is tests/test_gradescope.py (opt-in: it builds an image).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
import tomli_w

from harness.classgrade import gradescope, lessons, platforms, rubric
from harness.classgrade.account import Outcome
from harness.classgrade.feedback import feedback_markdown
from harness.verdict.profiles import tomllib
from harness.verdict.verdicts import Verdict

REPO = Path(__file__).resolve().parent.parent
DISTLAB = str(Path(sys.executable).parent / "distlab")
LESSONS = "https://example.org/course/blob/abc123/"


def bundle(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "subs").mkdir(exist_ok=True)
    return subprocess.run([DISTLAB, "grade-class", str(tmp_path / "subs"), "--autograder", str(tmp_path / "ag.zip"),
                           *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bundle")
    done = bundle(folder, "--lessons", LESSONS)
    assert done.returncode == 0, done.stderr
    return folder / "ag.zip"


def test_the_bundle_holds_the_scripts_the_config_and_the_harness(built):
    archive = zipfile.ZipFile(built)
    assert set(archive.namelist()) == {"setup.sh", "run_autograder", "autograder.json", "rubric.toml", "distlab.tar"}
    modes = {info.filename: info.external_attr >> 16 for info in archive.infolist()}
    assert modes["setup.sh"] == modes["run_autograder"] == 0o755 and modes["autograder.json"] == 0o644
    config = json.loads(archive.read("autograder.json"))
    # cpu-smoke's ddp row at two ranks; the smallest box measured (half a CPU, 1.5 GB), a CPU a rank for
    # the speed to be judged; the rubric's points; Gradescope's 10 minutes.
    assert (config["lab"], config["profile"], config["world_sizes"]) == ("ddp", "cpu-smoke", [2])
    assert config["needs"] == {"cpus": 0.5, "memory_bytes": 3 << 29, "speed_cpus": 2}
    assert config["max_score"] == rubric.load().max_score and config["timeout_s"] == 600
    assert config["lessons"] == LESSONS
    with tarfile.open(fileobj=io.BytesIO(archive.read("distlab.tar"))) as tar:
        names = set(tar.getnames())
        requirements = tar.extractfile("requirements.txt").read().decode()
    assert {"harness/classgrade/rubrics/ddp.toml", "harness/profiles/cpu-smoke.toml", "labs/ddp/train.py",
            "harness/schemas/record.schema.json", "harness/classgrade/gradescope.py", "VERSION.json"} <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    # Only what grading needs: distlab's own dependencies, no extra's (tests, DeepSpeed, linters).
    assert "rich" in requirements and "jsonschema" in requirements
    assert not any(word in requirements for word in ("pytest", "deepspeed", "ruff", "tensorboard"))


def test_setup_installs_cpu_torch_from_a_configurable_index_and_both_scripts_pass_shellcheck(built, tmp_path):
    setup = zipfile.ZipFile(built).read("setup.sh").decode()
    assert '--index-url "https://download.pytorch.org/whl/cpu" "torch==' in setup
    assert "deepspeed" not in setup.lower() and "make setup" not in setup and "[test" not in setup
    assert "setup-seconds.txt" in setup  # it times itself
    done = bundle(tmp_path, "--lessons", LESSONS, env={"TORCH_INDEX_URL": "https://mirror.example.org/torch-cpu"})
    assert done.returncode == 0, done.stderr
    assert '--index-url "https://mirror.example.org/torch-cpu"' in zipfile.ZipFile(tmp_path / "ag.zip").read(
        "setup.sh").decode()
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(shellcheck).exists():
        pytest.skip("shellcheck is not installed (the lint extra has it)")
    for name in ("setup.sh", "run_autograder"):
        (tmp_path / name).write_bytes(zipfile.ZipFile(built).read(name))
    checked = subprocess.run([shellcheck, str(tmp_path / "setup.sh"), str(tmp_path / "run_autograder")],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout


def test_a_bundle_is_never_written_over_and_needs_a_lesson_address(tmp_path, built):
    (tmp_path / "ag.zip").write_bytes(b"staff's own")
    done = bundle(tmp_path, "--lessons", LESSONS)
    assert done.returncode == 2 and "exists" in done.stderr and (tmp_path / "ag.zip").read_bytes() == b"staff's own"
    if lessons.course_lesson_root() is None:  # this checkout has no https origin (or it is no checkout)
        done = bundle(tmp_path / "subs", env={})
        assert done.returncode == 2 and "--lessons URL" in done.stderr and len(done.stderr.splitlines()) == 1
    (tmp_path / "ag.zip").unlink()
    done = bundle(tmp_path, "--lessons", "local")  # this machine's files: no student on Gradescope opens them
    assert done.returncode == 2 and "--lessons URL" in done.stderr and len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "ag.zip").exists()


@pytest.mark.parametrize(("remote", "address"), [
    ("git@github.com:course/ddp-lab.git", "https://github.com/course/ddp-lab"),
    ("https://student:ghp_token@github.com/course/ddp-lab.git", "https://github.com/course/ddp-lab"),
    ("ssh://git@gitlab.example.org/dept/ddp-lab.git", "https://gitlab.example.org/dept/ddp-lab"),
    ("/srv/git/ddp-lab.git", None),
])
def test_lesson_links_use_the_course_repository_s_web_address_without_credentials(remote, address):
    assert lessons.web_address(remote) == address


# ------------------------------------------------------------------ what the container was given

def fake_cgroup(monkeypatch, tmp_path: Path, files: dict[str, str], own: str) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "self-cgroup").write_text(own)
    monkeypatch.setattr(gradescope, "CGROUP", tmp_path)
    monkeypatch.setattr(gradescope, "PROC_CGROUP", tmp_path / "self-cgroup")


def test_the_cpus_and_memory_are_the_container_s_cgroup_v2_limits(monkeypatch, tmp_path):
    fake_cgroup(monkeypatch, tmp_path, {"cpu.max": "50000 100000\n", "memory.max": "805306368\n",
                                        "memory.peak": "700000000\n", "memory.events": "low 0\noom_kill 2\n"},
                "0::/\n")
    assert gradescope.container_cpus() == 0.5 and gradescope.container_memory() == 768 << 20
    assert gradescope.memory_account() == {"peak_memory_bytes": 700000000, "oom_kills": 2}


def test_the_cpus_and_memory_are_the_container_s_cgroup_v1_limits(monkeypatch, tmp_path):
    # As runc mounts them in a container on v1: the container's own group at each controller's root.
    fake_cgroup(monkeypatch, tmp_path, {"cpu/cpu.cfs_quota_us": "150000\n", "cpu/cpu.cfs_period_us": "100000\n",
                                        "memory/memory.limit_in_bytes": "3221225472\n",
                                        "memory/memory.max_usage_in_bytes": "1234\n"},
                "4:memory:/libpod_parent/libpod-1\n3:cpu,cpuacct:/libpod_parent/libpod-1\n")
    assert gradescope.container_cpus() == min(1.5, len(os.sched_getaffinity(0)))
    assert gradescope.container_memory() == 3 << 30
    fake_cgroup(monkeypatch, tmp_path, {"memory/memory.limit_in_bytes": str(1 << 62)}, "4:memory:/\n")
    assert gradescope.container_memory() != 1 << 62  # no limit: the machine's memory


def test_too_few_resources_is_one_line_that_names_what_to_select():
    needs = {"cpus": 0.5, "memory_bytes": 3 << 29, "speed_cpus": 2}  # the bundle's at two ranks
    line = gradescope.short_of(needs, 0.5, 768 << 20)  # Gradescope's default box
    assert line is not None and "\n" not in line
    assert "given 0.75 GB and 0.5 CPU(s)" in line and "select at least 1.5 GB of memory and 0.5 CPU(s)" in line
    assert line.endswith("(2 CPUs for its speed to be judged).")
    assert gradescope.short_of(needs, 0.5, 3 << 29) is None  # the smallest box grades; speed not comparable
    assert gradescope.short_of(needs, 2.0, 4 << 30) is None


# ----------------------------------------------------------------- the grading step, on its layout

def layout(tmp_path: Path, built: Path, files: dict[str, str], **config: object) -> Path:
    """Gradescope's folders: source (the bundle, unpacked as setup.sh does), submission, metadata."""
    root = tmp_path / "autograder"
    source = root / "source"
    zipfile.ZipFile(built).extractall(source)
    (source / "distlab").mkdir()
    with tarfile.open(source / "distlab.tar") as tar:
        tar.extractall(source / "distlab", filter="data")
    settings = json.loads((source / "autograder.json").read_text())
    (source / "autograder.json").write_text(json.dumps({**settings, **config}))
    (root / "submission").mkdir()
    for name, text in files.items():
        (root / "submission" / name).write_text(text)
    (root / "submission_metadata.json").write_text(json.dumps(
        {"assignment": {"due_date": "2026-12-10T23:59:00.000000-08:00", "late_due_date": None}, "users": []}))
    return root


def grading_step(root: Path, timeout: float = 600) -> tuple[subprocess.CompletedProcess[str], dict]:
    done = subprocess.run([sys.executable, "-m", "harness.classgrade.gradescope", str(root / "source/autograder.json")],
                          cwd=root / "source/distlab", capture_output=True, text=True, timeout=timeout)
    return done, json.loads((root / "results/results.json").read_text())


def test_too_few_resources_grade_nothing_and_say_so(tmp_path, built):
    root = layout(tmp_path, built, {"train.py": "print('hi')\n"}, needs={"cpus": 4096, "memory_bytes": 1 << 30})
    done, results = grading_step(root)
    assert done.returncode == 0
    assert results["extra_data"]["distlab"]["status"] == "resources" and results["score"] == 0.0
    assert "and 4096 CPU(s)." in results["output"] and "\n" not in results["output"]
    assert results["tests"][0]["tags"] == ["resources"] and isinstance(results["execution_time"], int)
    assert not (root / "work").exists()  # nothing was run


@pytest.mark.integration
def test_an_ungradable_submission_has_its_own_status_not_a_bare_zero(tmp_path, built):
    root = layout(tmp_path, built, {"a.py": "print('a')\n", "b.py": "print('b')\n"})  # two programs, no train.py
    done, results = grading_step(root)
    assert done.returncode == 0, done.stderr
    distlab = results["extra_data"]["distlab"]
    assert distlab["status"] == "ungradable" and "none is train.py" in distlab["reason"]
    assert results["tests"] == [{"name": "gradable", "score": 0.0, "max_score": rubric.load().max_score,
                                 "status": "failed", "output": f"Ungradable: `{distlab['reason']}`",
                                 "tags": ["ungradable"], "visibility": "visible"}]
    assert results["output_format"] == "md" and "**Ungradable**" in results["output"]
    assert distlab["sandbox"] in ("bwrap", "uid", "none") and distlab["due"] == "2026-12-10T23:59:00-08:00"
    assert isinstance(results["execution_time"], int) and results["execution_time"] >= 0


@pytest.mark.integration
def test_a_grader_that_fails_still_leaves_results_that_say_so(tmp_path, built):
    root = layout(tmp_path, built, {"train.py": "print('hi')\n"}, profile="no-such-profile")
    done, results = grading_step(root)
    assert done.returncode == 0, done.stderr
    distlab = results["extra_data"]["distlab"]
    assert distlab["status"] == "error" and "exit code 2" in results["output"]
    assert "not a grade of your program" in results["output"]
    assert "no profile 'no-such-profile'" in distlab["log"]  # the grade's own words, for staff


@pytest.mark.integration
def test_a_grade_past_the_deadline_is_stopped_and_named(tmp_path, built):
    # 55 s of Gradescope's timeout leave 10 s to grade: the course lab does not finish in that.
    root = layout(tmp_path, built, {"train.py": (REPO / "labs/ddp/train.py").read_text()}, timeout_s=55)
    started = time.monotonic()
    done, results = grading_step(root)
    assert done.returncode == 0, done.stderr
    assert results["extra_data"]["distlab"]["status"] == "error" and "deadline" in results["output"]
    assert time.monotonic() - started < 55 + gradescope.STOP_GRACE_S
    leftovers = subprocess.run(["pgrep", "-f", str(root)], capture_output=True, text=True)
    assert leftovers.stdout == "", leftovers.stdout  # the grade's processes were stopped with it


def run_autograder(root: Path, python: str | None, stop_after: bool = False) -> dict:
    """run_autograder itself, with a venv whose python is `python` (a shell script) or missing."""
    (root / "venv" / "bin").mkdir(parents=True)
    if python is not None:
        (root / "venv/bin/python").write_text(f"#!/bin/sh\n{python}\n")
        (root / "venv/bin/python").chmod(0o755)
    process = subprocess.Popen(["bash", str(root / "source/run_autograder")], env={**os.environ,
                               "AUTOGRADER_ROOT": str(root)}, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    if stop_after:
        while not (root / "started").exists():  # the step has begun: its traps are set
            assert process.poll() is None, "run_autograder ended before its step began"
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=60)
    return json.loads((root / "results/results.json").read_text())


@pytest.mark.parametrize(("python", "stop_after", "words"), [
    (None, False, "ended before its grading step wrote results (exit code 127)"),
    ("exit 3", False, "ended before its grading step wrote results (exit code 3)"),
    ('touch "$AUTOGRADER_ROOT/started"; exec sleep 60', True, "was stopped by a signal"),
])
def test_run_autograder_leaves_results_when_its_step_cannot_run(tmp_path, built, python, stop_after, words):
    root = layout(tmp_path, built, {"train.py": "print('hi')\n"})
    results = run_autograder(root, python, stop_after)
    assert results["extra_data"]["distlab"]["status"] == "error" and words in results["output"]
    assert results["score"] == 0.0 and results["tests"][0]["max_score"] == rubric.load().max_score


# ------------------------------------------------------------------------ the results' own fields

def write_rubric(tmp_path: Path, **visibility: str) -> Path:
    data = tomllib.loads(rubric.DEFAULT.read_text())
    for item in data["items"]:
        item["visibility"] = visibility.get(item["name"].replace(" ", "_"), item.get("visibility", "visible"))
    path = tmp_path / "rubric.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def graded_outcome(the_rubric: rubric.Rubric, rate_ratio: float | None = 1.05) -> Outcome:
    verdicts = [Verdict("ddp", 2, "run", "1/1 ok", "all ok", True),
                Verdict("ddp", 2, "observed:shards_disjoint", "FAILED", "passed", False,
                        "ranks 0 and 1 both fetched 256 of the same samples"),
                Verdict("ddp", 2, "observed:shards_cover", "passed", "passed", True),
                Verdict("ddp", 2, "observed:order_changes_per_epoch", "passed", "passed", True),
                Verdict("ddp", 2, "observed:replicas_identical", "passed", "passed", True),
                Verdict("ddp", 2, "img_per_sec_ratio", "1.050", ">= 0.7 x course lab", True)]
    return Outcome("alice", "graded", "", the_rubric.score(verdicts), verdicts, {}, [], 20.0, rate_ratio,
                   sandboxed=False)


def test_gradescope_results_carry_markdown_every_visibility_a_leaderboard_and_absolute_lessons(tmp_path):
    the_rubric = rubric.load(write_rubric(tmp_path, a_new_order_every_epoch="after_published",
                                          one_model_on_every_rank="after_due_date"), due=dt.datetime(
        2026, 12, 10, tzinfo=dt.timezone.utc))
    outcome = graded_outcome(the_rubric)
    results = platforms.gradescope_results(outcome, the_rubric, LESSONS, execution_time=61.4)
    assert results["execution_time"] == 61
    assert (results["output_format"], results["test_output_format"]) == ("md", "md")
    assert {t["name"]: t["visibility"] for t in results["tests"]} == {
        "runs to the end": "visible", "each rank its own shard": "visible",
        "a new order every epoch": "after_published", "one model on every rank": "after_due_date",
        "one checkpoint writer": "visible", "process group and steps": "visible", "an honest record": "visible",
        "speed": "hidden", "BatchNorm statistics averaged": "visible", "a checkpoint that loads": "visible",
        "resumes where it stopped": "visible"}
    shard = next(t for t in results["tests"] if t["name"] == "each rank its own shard")
    assert shard["status"] == "failed" and shard["score"] == 1.5
    assert f"]({LESSONS}labs/TRAINING.md#what-ddp-adds-labsddptrainpy)" in shard["output"]
    assert results["leaderboard"] == [{"name": "rate / course lab", "value": 1.05, "order": "desc"}]
    assert results["extra_data"]["distlab"]["sandbox"] == "none"
    assert "WITHOUT the sandbox" in results["output"] and "](https://" in results["output"]
    assert "leaderboard" not in platforms.gradescope_results(graded_outcome(the_rubric, None), the_rubric, LESSONS)


def test_the_feedback_follows_gradescope_s_due_date_not_the_rubric_s(tmp_path):
    path = write_rubric(tmp_path, each_rank_its_own_shard="after_due_date")
    metadata = {"assignment": {"due_date": "2020-01-01T00:00:00.000000+00:00",
                               "late_due_date": "2020-01-03T00:00:00.000000+00:00"},
                "users": [{"assignment": {"due_date": "2099-01-01T00:00:00Z"}}]}  # one submitter's extension
    due = gradescope.platform_due(metadata)
    assert due == dt.datetime(2099, 1, 1, tzinfo=dt.timezone.utc)  # the latest: nobody sees it early
    hidden = feedback_markdown(graded_outcome(rubric.load(path, due=due)), rubric.load(path, due=due), "")
    assert "each rank its own shard" not in hidden and "shards_disjoint" not in hidden
    past = gradescope.platform_due({"assignment": {"due_date": "2020-01-01T00:00:00+00:00", "late_due_date": None}})
    shown = feedback_markdown(graded_outcome(rubric.load(path, due=past)), rubric.load(path, due=past), "")
    assert "each rank its own shard" in shown and "shards_disjoint" in shown


def test_prairielearn_results_from_the_same_outcome(tmp_path):
    the_rubric = rubric.load()
    results = platforms.prairielearn_results(graded_outcome(the_rubric), the_rubric, LESSONS)
    assert results["gradable"] is True
    assert results["score"] == pytest.approx(graded_outcome(the_rubric).score / the_rubric.max_score)
    assert 0 <= results["score"] <= 1 and "speed" not in {t["name"] for t in results["tests"]}  # hidden
    assert all({"name", "points", "max_points", "message", "output"} <= set(t) for t in results["tests"])
    ungradable = Outcome("bob", "ungradable", "wrong layout: 2 .py files and none is train.py")
    results = platforms.prairielearn_results(ungradable, the_rubric, LESSONS)
    assert results["gradable"] is False and "score" not in results
    assert results["format_errors"] == ["Ungradable: wrong layout: 2 .py files and none is train.py"]
