"""The Gradescope bundle where it will run: a container laid out as Gradescope's, with its limits.

The image is built as Gradescope builds an autograder's: a fresh OS (docker/gradescope/base.sh:
Debian 12 made here with debootstrap, where Gradescope's are Ubuntu; the file says what differs),
the bundle unzipped into /autograder/source and its setup.sh run once as root, with the network
(docker/gradescope/Dockerfile). Each submission then runs as Gradescope runs one: run_autograder as
root in /autograder, the student's files in /autograder/submission, submission_metadata.json beside
them, results read from /autograder/results/results.json; no user namespaces (a root container, no
--userns) and no network at all (--network none: loopback only), with CPU and memory limits on the
container (--cpus, --memory): Gradescope's default of half a CPU and 768 MB, and the resources the
bundle asks for.

Opt-in, like the other container tests: DISTLAB_ENGINE_TESTS=1 (`nox -s gradescope`, `make
gradescope-test`). It builds an image of about 7 GB (PyPI's torch: the CPU index may be unreachable;
TORCH_INDEX_URL chooses) and grades four submissions; docs/grading-class.md has the times.
Each run's figures go to results/gradescope/summary.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DISTLAB = str(Path(sys.executable).parent / "distlab")
BASE = "localhost/distlab-gradescope-base:bookworm"
IMAGE = "localhost/distlab-gradescope:test"
LESSONS = "https://example.org/course/blob/main/"
GRADESCOPE_DEFAULT = ("0.5", "768m")  # Gradescope's default resources: half a CPU, 768 MB
TIMEOUT_S = 2400  # Gradescope's longest autograder timeout
SUMMARY = REPO / "results" / "gradescope" / "summary.json"
METADATA = {"id": 1, "created_at": "2026-12-03T14:00:00.000000+00:00", "submission_method": "upload",
            "assignment": {"id": 1, "title": "DDP lab", "total_points": "14.0",
                           "due_date": "2026-12-10T23:59:00.000000-08:00",
                           "late_due_date": "2026-12-12T23:59:00.000000-08:00"},
            "users": [{"email": "student@example.org", "id": 1, "name": "Student"}], "previous_submissions": []}

# The first test builds the image (setup.sh downloads torch): far past the suite's 600 s per test.
pytestmark = [pytest.mark.engine, pytest.mark.integration,
              pytest.mark.timeout(3600)]


def engine() -> str:
    for name in ([os.environ["ENGINE"]] if os.environ.get("ENGINE") else ["podman", "docker"]):
        if shutil.which(name) and subprocess.run([name, "info"], capture_output=True, timeout=120).returncode == 0:
            return name
    pytest.skip("no container engine answers here (podman or docker); `nox -s image` installs podman on Debian")


def record(key: str, value: object) -> None:
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    summary = json.loads(SUMMARY.read_text()) if SUMMARY.exists() else {}
    summary[key] = value
    SUMMARY.write_text(json.dumps(summary, indent=1) + "\n")


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> dict[str, str]:
    if os.environ.get("DISTLAB_ENGINE_TESTS") != "1":
        pytest.skip("container tests are opt-in: DISTLAB_ENGINE_TESTS=1 (nox -s gradescope runs them)")
    tool = engine()
    SUMMARY.unlink(missing_ok=True)
    if subprocess.run([tool, "image", "inspect", BASE], capture_output=True, timeout=120).returncode != 0:
        started = time.monotonic()
        subprocess.run([str(REPO / "docker/gradescope/base.sh"), BASE], env={**os.environ, "ENGINE": tool},
                       check=True, timeout=1800)
        record("base_seconds", round(time.monotonic() - started))
    folder = tmp_path_factory.mktemp("gradescope")
    (folder / "submissions").mkdir()
    # Gradescope's timeout at its most (40 minutes), not its default: 10 minutes is enough for a grade
    # on an idle machine of this kind (docs/grading-class.md), and no test may rest on the machine's speed.
    made = subprocess.run([DISTLAB, "grade-class", str(folder / "submissions"), "--autograder",
                           str(folder / "gradescope.zip"), "--lessons", LESSONS], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "AUTOGRADER_TIMEOUT_S": str(TIMEOUT_S)})
    assert made.returncode == 0, made.stderr
    context = folder / "context"
    zipfile.ZipFile(folder / "gradescope.zip").extractall(context / "bundle")
    for name in ("setup.sh", "run_autograder"):
        (context / "bundle" / name).chmod(0o755)
    shutil.copy(REPO / "docker/with-extra-ca.sh", context / "with-extra-ca.sh")
    build = [tool, "build", "--file", str(REPO / "docker/gradescope/Dockerfile"), "--tag", IMAGE,
             "--build-arg", f"BASE={BASE}", "--network", "host"]
    extra_ca = os.environ.get("EXTRA_CA") or os.environ.get("PIP_CERT")
    if extra_ca:
        build += ["--secret", f"id=extra_ca,src={extra_ca}"]
    if tool == "podman":
        build += ["--format", "docker"]  # OCI images have no SHELL: the Dockerfile's pipefail would be lost
    started = time.monotonic()
    subprocess.run([*build, str(context)], check=True, timeout=3600)
    setup = subprocess.run([tool, "run", "--rm", IMAGE, "cat", "/autograder/source/setup-seconds.txt"],
                           capture_output=True, text=True, timeout=300)
    record("image", {"build_seconds": round(time.monotonic() - started), "setup_seconds": int(setup.stdout),
                     "base": BASE, "torch_index": os.environ.get("TORCH_INDEX_URL", "the CPU index")})
    return {"engine": tool, "folder": str(folder)}


def grade(image: dict[str, str], name: str, program: str, cpus: str, memory: str) -> dict:
    """One submission through run_autograder, as Gradescope runs it, in a container with these limits."""
    root = Path(image["folder"]) / name
    for folder in ("submission", "results", "work"):
        (root / folder).mkdir(parents=True)
    (root / "submission" / "train.py").write_text(program)
    (root / "submission_metadata.json").write_text(json.dumps(METADATA))
    started = time.monotonic()
    done = subprocess.run([image["engine"], "run", "--rm", "--network", "none", "--cpus", cpus, "--memory", memory,
                           "--memory-swap", memory, "--workdir", "/autograder",
                           "-v", f"{root / 'submission'}:/autograder/submission",
                           "-v", f"{root / 'results'}:/autograder/results",
                           "-v", f"{root / 'work'}:/autograder/work",
                           "-v", f"{root / 'submission_metadata.json'}:/autograder/submission_metadata.json:ro",
                           IMAGE, "/autograder/run_autograder"], capture_output=True, text=True,
                          timeout=TIMEOUT_S + 300)
    seconds = time.monotonic() - started
    (root / "stdout.log").write_text(done.stdout + done.stderr)
    results = json.loads((root / "results" / "results.json").read_text())
    distlab = results.get("extra_data", {}).get("distlab", {})
    record(name, {"limits": {"cpus": cpus, "memory": memory}, "seconds": round(seconds),
                  "execution_time": results.get("execution_time"), "score": results.get("score"),
                  "status": distlab.get("status"), "sandbox": distlab.get("sandbox"),
                  "peak_memory_bytes": distlab.get("peak_memory_bytes"), "resources": distlab.get("resources"),
                  "tests": {t["name"]: [t["score"], t.get("max_score")] for t in results.get("tests", [])},
                  "output": results.get("output", "")[:600]})
    return {"results": results, "distlab": distlab, "seconds": seconds, "root": root}


def needs(image: dict[str, str]) -> tuple[str, str]:
    """The resources the bundle asks for (autograder.json): the limits Gradescope's settings must give."""
    config = json.loads(zipfile.ZipFile(Path(image["folder"]) / "gradescope.zip").read("autograder.json"))
    return str(config["needs"]["cpus"]), f"{config['needs']['memory_bytes'] // (1 << 20)}m"


def test_gradescope_s_default_resources_get_one_line_naming_what_to_select(image):
    graded = grade(image, "default-resources", (REPO / "labs/ddp/train.py").read_text(), *GRADESCOPE_DEFAULT)
    results, distlab = graded["results"], graded["distlab"]
    assert distlab["status"] == "resources", results
    # What it measured is the container's cgroup, not the host's cores and memory.
    assert distlab["resources"] == {"cpus": 0.5, "memory_bytes": 768 << 20}
    cpus, memory = needs(image)
    assert "\n" not in results["output"] and "select at least 1.5 GB of memory" in results["output"]
    assert results["score"] == 0.0 and results["tests"][0]["tags"] == ["resources"]


def test_a_correct_submission_earns_every_point_it_can_see(image):
    graded = grade(image, "correct", (REPO / "labs/ddp/train.py").read_text(), *needs(image))
    results, distlab = graded["results"], graded["distlab"]
    assert distlab["status"] == "graded", results["output"]
    scores = {t["name"]: (t["score"], t["max_score"], t["visibility"]) for t in results["tests"]}
    # Every item a student sees earns its points; speed (hidden) is a ratio to the course lab beside it.
    assert all(score == most for name, (score, most, seen) in scores.items() if seen != "hidden"), scores
    assert results["output_format"] == "md" and results["leaderboard"][0]["name"] == "rate / course lab"
    assert 0 < results["execution_time"] < TIMEOUT_S
    # Which isolation graded it is named. In this container bubblewrap gets no namespaces: until the
    # no-namespace mode lands (harness/classgrade/gradescope.py, sandbox_mode), none, and every page says so.
    assert distlab["sandbox"] in ("bwrap", "uid", "none")
    assert ("WITHOUT the sandbox" in results["output"]) == (distlab["sandbox"] == "none")
    assert distlab["due"] == "2026-12-12T23:59:00-08:00"  # Gradescope's late due date, not the rubric's
    assert distlab["oom_kills"] == 0


def test_a_wrong_submission_is_told_what_to_fix_with_a_link_to_the_lesson(image):
    lab = (REPO / "labs/ddp/train.py").read_text()
    assert lab.count("sampler.set_epoch(epoch)") == 1, "the lab changed: its set_epoch line is not found once"
    graded = grade(image, "wrong", lab.replace("sampler.set_epoch(epoch)", "pass"), *needs(image))
    results = graded["results"]
    assert graded["distlab"]["status"] == "graded", results["output"]
    order = next(t for t in results["tests"] if t["name"] == "a new order every epoch")
    assert order["score"] == 0 and order["status"] == "failed"
    assert f"]({LESSONS}labs/TRAINING.md#" in order["output"] and "set_epoch" in results["output"]
    assert results["score"] < json.loads(zipfile.ZipFile(Path(image["folder"]) / "gradescope.zip").read(
        "autograder.json"))["max_score"]


def test_a_hostile_submission_gets_no_points_and_the_results_name_the_isolation(image):
    graded = grade(image, "hostile", (REPO / "tests/submissions/writes_grader.py").read_text(), *needs(image))
    results, distlab = graded["results"], graded["distlab"]
    assert distlab["status"] == "ungradable", results["output"]
    assert results["score"] == 0.0 and results["tests"][0]["tags"] == ["ungradable"]
    assert distlab["sandbox"] in ("bwrap", "uid", "none")
    # What stopped it, for the record: without namespaces (mode none) nothing but its own mistakes
    # keeps a root program from the grader's files; the no-namespace mode's uid and `chmod o=` must.
    record("hostile_reason", distlab["reason"])
