"""What the GPU machine's Python needs besides what it has, checked on a CPU.

That machine's python3 (3.12, itself a venv) holds torch 2.11.0+cu130, torchvision 0.26.0, numpy,
matplotlib, rich, psutil, pyyaml, pytest and pytest-xdist, and nothing else: whatever the tests import
must come with `pip install '.[test]'`, and docker/gpu-install.py adds to it only what it lacks, from
the wheels `make gpu-wheels` made, never a stale wheel.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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

def fake_wheel(folder: Path, name: str, version: str, requires: list[str] = (), files: dict[str, str] | None = None
               ) -> Path:
    """A minimal valid wheel: the metadata pip reads, and the files given."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    files = files or {f"{name.replace('-', '_')}/__init__.py": ""}
    record = [*files, f"{dist}.dist-info/METADATA", f"{dist}.dist-info/WHEEL", f"{dist}.dist-info/RECORD"]
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
        archive.writestr(f"{dist}.dist-info/METADATA", "Metadata-Version: 2.1\n" f"Name: {name}\nVersion: {version}\n"
                         + "".join(f"Requires-Dist: {r}\n" for r in requires))
        archive.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n")
        archive.writestr(f"{dist}.dist-info/RECORD", "".join(f"{m},,\n" for m in record))
    return path


def install(wheels: Path, target: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(INSTALL), "--wheels", str(wheels), "--target", str(target), *extra],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.integration
def test_only_what_this_python_lacks_is_installed_and_the_own_wheel_every_time(tmp_path):
    """pip's dry run counts what this Python has (pytest, here and on the GPU machine); the target is
    made afresh, so a rebuilt wheel of the same version replaces the old one (it did not, in a venv)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    fake_wheel(wheels, "distlab", "0.1.0", ["pytest", "zz-distlab-only-here"], {"harness/marker.py": "FIRST = 1\n"})
    fake_wheel(wheels, "zz-distlab-only-here", "1.0")
    fake_wheel(wheels, "pytest", "0.0.1")  # never installed: this Python has a pytest that satisfies "pytest"
    target = tmp_path / "site"
    done = install(wheels, target)
    assert done.returncode == 0, done.stderr
    record = json.loads((target / ".distlab-install.json").read_text())
    assert sorted(item["wheel"].split("-")[0] for item in record["installed"]) == ["distlab", "zz_distlab_only_here"]
    assert (target / "harness" / "marker.py").read_text() == "FIRST = 1\n" and not (target / "pytest").exists()
    fake_wheel(wheels, "distlab", "0.1.0", ["pytest", "zz-distlab-only-here"], {"harness/marker.py": "SECOND = 2\n"})
    assert install(wheels, target).returncode == 0
    assert (target / "harness" / "marker.py").read_text() == "SECOND = 2\n"  # the rebuilt wheel, not the old one


@pytest.mark.parametrize(("case", "message"), [
    ("missing", "lacks a package that"), ("stale", "was built from other code than"),
    ("two", "2 distlab wheels in"), ("none", "no distlab wheel in")])
def test_the_install_refuses_in_one_line_and_installs_nothing(case, message, tmp_path):
    wheels, checkout = tmp_path / "wheels", tmp_path / "checkout"
    wheels.mkdir()
    (checkout / "harness").mkdir(parents=True)
    (checkout / "harness" / "x.py").write_text("NEW = 1\n")
    if case != "none":
        fake_wheel(wheels, "distlab", "0.1.0", ["zz-nowhere-to-be-found"] if case == "missing" else [],
                   {"harness/x.py": "OLD = 1\n" if case == "stale" else "NEW = 1\n"})
    if case == "two":
        fake_wheel(wheels, "distlab", "0.2.0", [], {"harness/x.py": "NEW = 1\n"})
    done = install(wheels, tmp_path / "site", "--checkout", str(checkout))
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "site").exists()
