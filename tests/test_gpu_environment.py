"""What the GPU machine's Python needs besides what it has, checked on a CPU.

That machine's python3 (3.12, itself a venv) holds torch 2.11.0+cu130, torchvision 0.26.0, numpy,
matplotlib, rich, psutil, pyyaml, pytest and pytest-xdist, and nothing else: whatever the tests import
must come with `pip install '.[test]'`, and docker/gpu-install.py adds to it only what it lacks, from
the wheels `make gpu-wheels` made, never a stale wheel.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

import pytest
from conftest import build_wheel, python_without_distlab
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from harness.verdict.profiles import load_profile

REPO = Path(__file__).resolve().parents[1]
INSTALL = REPO / "docker" / "gpu-install.py"
# Installed by `nox -s env` (a pinned pair from a configurable index), not by the extra; the GPU machine has both.
BESIDE_THE_EXTRA = {"torch", "torchvision"}


def requirement_closure(name: str, extras: frozenset[str]) -> set[str]:
    """Every distribution `pip install name[extras]` brings, by its installed metadata."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(name, extras)]
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in seen:
            continue
        seen.add((canonicalize_name(name), extras))
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            environment = [{"extra": extra} for extra in extras] or [{"extra": ""}]
            if requirement.marker and not any(requirement.marker.evaluate(env) for env in environment):
                continue
            todo.append((requirement.name, frozenset(requirement.extras)))
    return {name for name, _ in seen}


def top_level_imports(path: Path) -> set[str]:
    """Modules a test file imports when it is collected: module level, not under try (an optional one)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_test_extra_brings_every_module_the_tests_import():
    """pyyaml came only with Horovod: without it tests/test_multinode.py did not even collect."""
    brought = requirement_closure("distlab", frozenset({"test"})) | BESIDE_THE_EXTRA
    local = {"conftest", "harness", "labs", "slurm_cluster", *(p.stem for p in (REPO / "tests").glob("*.py"))}
    providers = metadata.packages_distributions()
    missing = {}
    for path in sorted((REPO / "tests").glob("*.py")):
        for module in top_level_imports(path) - local - set(sys.stdlib_module_names) - {"__future__"}:
            distributions = {canonicalize_name(d) for d in providers.get(module, [module])}
            if not distributions & brought:
                missing[module] = path.name
    assert not missing, f"imported by the tests, not in pyproject's test extra: {missing}"


# ------------------------------------------------------------------- docker/gpu-install.py
# The real wheel, built from a clone of this checkout as `make gpu-wheels` builds it, installed by the
# real script: the fake wheels these tests used had the layout of before (harness/ at the top), so the
# suite stayed green while every real wheel was refused and no step could import the harness.

@pytest.fixture(scope="module")
def gpu_wheels(tmp_path_factory) -> tuple[Path, Path]:
    """The folder `make gpu-wheels` fills (distlab's wheel alone: this Python has the rest), and the clone."""
    clone, wheels = tmp_path_factory.mktemp("clone"), tmp_path_factory.mktemp("gpu-wheels")
    build_wheel(clone, wheels)
    return wheels, clone


def install(wheels: Path, target: Path, *extra: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, str(INSTALL), "--wheels", str(wheels), "--target", str(target), *extra],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.integration
def test_the_wheel_built_from_the_checkout_installs_and_only_it(gpu_wheels, tmp_path):
    """pip's dry run counts what this Python has (every dependency, here); the target is made afresh,
    so a rebuilt wheel of the same version replaces the old one (it did not, in a venv)."""
    wheels, clone = gpu_wheels
    target = tmp_path / "site"
    target.mkdir()
    (target / "left-from-before.py").write_text("STALE = 1\n")
    done = install(wheels, target, "--checkout", str(clone))
    assert done.returncode == 0, done.stderr
    assert not (target / "left-from-before.py").exists()
    record = json.loads((target / ".distlab-install.json").read_text())
    (wheel,) = wheels.glob("distlab-*.whl")
    assert [item["wheel"] for item in record["installed"]] == [wheel.name]
    # As the wheel lays it out: one top-level package, the harness and the labs inside it.
    assert sorted(p.name for p in target.iterdir() if not p.name.startswith(".")) == [
        "bin", "distlab", f"{wheel.name.split('-py3')[0]}.dist-info"]
    assert (target / "distlab" / "harness" / "commands" / "acceptance.py").read_bytes() == \
        (clone / "harness" / "commands" / "acceptance.py").read_bytes()


@pytest.mark.parametrize(("case", "message"), [
    ("stale", "was built from other code than"), ("missing", "lacks a package that"),
    ("two", "2 distlab wheels in"), ("none", "no distlab wheel in")])
def test_the_install_refuses_in_one_line_and_installs_nothing(case, message, gpu_wheels, tmp_path):
    """stale: one line of the checkout changed after the wheel was built; missing: a package no wheel holds."""
    built, clone = gpu_wheels
    wheels, checkout, extra = tmp_path / "wheels", tmp_path / "checkout", []
    shutil.copytree(clone, checkout)
    shutil.copytree(built, wheels)
    if case == "stale":
        with (checkout / "harness" / "commands" / "acceptance.py").open("a") as changed:
            changed.write("# changed after the build\n")
    if case == "missing":
        extra = ["--also", "zz-distlab-nowhere-to-be-found"]
    if case == "two":
        shutil.copy(next(wheels.glob("*.whl")), wheels / "distlab-0.0.1-py3-none-any.whl")
    if case == "none":
        for wheel in wheels.glob("*.whl"):
            wheel.unlink()
    done = install(wheels, tmp_path / "site", "--checkout", str(checkout), *extra)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    if case == "stale":
        assert "(harness/commands/acceptance.py and 0 more differ)" in done.stderr
    assert not (tmp_path / "site").exists()


@pytest.mark.integration
@pytest.mark.long
@pytest.mark.timeout(1260)  # the acceptance's own limit is 1200 s
def test_the_acceptance_runs_from_the_install_and_returns_what_its_out_folder_should(gpu_wheels, tmp_path):
    """docker/gpu-acceptance.sh's two commands on this host's Python, --cpu-proxy: the install, then
    the wheel's `distlab acceptance` from a folder outside any checkout, PYTHONPATH the install alone:
    preflight, doctor, one row calibrated and graded (two ranks through this Python's torchrun). The
    Python is one without distlab, as the GPU machine's: on main every real wheel was refused, and
    with that fixed every step died on `No module named 'harness'`."""
    wheels, clone = gpu_wheels
    site, out, results, elsewhere = (tmp_path / name for name in ("site", "out", "results", "elsewhere"))
    elsewhere.mkdir()
    python = str(python_without_distlab(tmp_path / "host"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DISTLAB_OBSERVE_DIR")}
    bare = subprocess.run([python, "-c", "import harness"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert "No module named 'harness'" in bare.stderr  # the checkout is out of reach, as there
    installed = install(wheels, site, "--checkout", str(clone), python=python)
    assert installed.returncode == 0, installed.stderr
    env.update(PYTHONPATH=str(site), DISTLAB_CHECKOUT=str(clone), PATH=f"{Path(sys.executable).parent}:"
               f"{env.get('PATH', '')}")
    done = subprocess.run([python, str(site / "bin" / "distlab"), "acceptance", "--cpu-proxy", "--rows",
                           "check_gloo_cuda", "--out", str(out), "--results", str(results), "--deadline", "900"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=1200)
    log = (out / "acceptance.log").read_text() if (out / "acceptance.log").exists() else ""
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-2000:]}\n{log[-3000:]}"
    summary = json.loads((out / "acceptance.json").read_text())
    # The steps ran the wheel's distlab, and the record of the install says what it was.
    assert summary["preflight"]["distlab_from"] == str(site / "distlab")
    (wheel,) = wheels.glob("distlab-*.whl")
    assert [item["wheel"] for item in summary["preflight"]["installed"]["installed"]] == [wheel.name]
    assert [(s["step"].split()[0], s["status"]) for s in summary["steps"]] == [
        ("doctor", "ok"), ("calibrate", "ok"), ("grade", "ok")]
    assert summary["failed"] == [] and summary["rows_left_out_of_profile"] == []
    assert summary["profile_rows"] == ["check_gloo_cuda"] and summary["grade"]["failures"] == []
    # The profile's name is the run's own: committed, it never collides with the next acceptance's.
    name = summary["profile"]
    assert name.startswith("cpu-proxy-") and name != "cpu-proxy" and Path(summary["results"]).name == name
    # What comes back from the GPU machine: at most 8 files, no folders, each small; the doctor's facts
    # whole; the profile loads; the archive holds the runs.
    back = sorted(p.name for p in out.iterdir())
    assert back == sorted(["acceptance.json", "acceptance.log", "acceptance.tar.gz", "doctor.json", f"{name}.toml"])
    assert all((out / b).stat().st_size < 1 << 20 for b in back)
    doctor = json.loads((out / "doctor.json").read_text())
    assert doctor["versions"]["torch"] and "check" in str(doctor["labs"])
    assert list(load_profile(out / f"{name}.toml").labs) == ["check_gloo_cuda"]
    with tarfile.open(out / "acceptance.tar.gz") as tar:
        names = tar.getnames()
    assert f"{name}/plan.toml" in names and any("/check/" in n and n.endswith("run.json") for n in names)
