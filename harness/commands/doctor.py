"""`distlab doctor`: what this host offers, and which labs, launchers and world sizes it can run.

MPI and Horovod are probed in child processes: importing mpi4py initialises MPI, and a
broken Horovod build can abort the interpreter that loads it.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from importlib import metadata
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.catalog import LABS, LAUNCHERS_FOR_BACKEND
from harness.run.launchers import LAUNCHERS, find_tool
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
    if not found["backends"]["gloo"]:
        issues.append("torch.distributed has no Gloo: reinstall torch with `make setup`")
    if not found["backends"]["mpi"]:
        issues.append("no working MPI (mpi4py): the mpi backend is unavailable; run `make setup`")
    if not found["backends"]["horovod"]:
        issues.append("Horovod is missing or built without PyTorch: the horovod lab cannot run; run `make setup`")
    if not found["versions"]["deepspeed"]:
        issues.append("DeepSpeed is missing: the deepspeed lab cannot run; run `make setup` "
                      "(or pip install 'distlab[deepspeed]')")
    for name in ("torchrun", "mpirun", "horovodrun"):
        if not found["launchers"][name]:
            issues.append(f"launcher {name} not found; {LAUNCHERS[name].install_hint}")
    return issues


def main(as_json: bool = False) -> int:
    try:
        found = facts()
    except ImportError as error:
        print(f"distlab doctor: error: {error}; run `make setup` to install torch", file=sys.stderr)
        return 1
    missing = problems(found)
    if as_json:
        print(json.dumps({**found, "problems": missing}, indent=2))
        return 1 if missing else 0
    console = Console(highlight=False)
    versions = Table(title="versions", show_header=False)
    for name, value in found["versions"].items():
        versions.add_row(name, escape(value) if value else "[red]missing[/red]")
    versions.add_row("horovod ops", ", ".join(found["horovod_build"].get("tensor operations", [])) or "-")
    versions.add_row("horovod controllers", ", ".join(found["horovod_build"].get("controllers", [])) or "-")
    console.print(versions)
    gpus = found["gpus"]
    cpu = found["cpu"]
    limited = cpu["cores_limited_by"] != "host"
    ours = f" of the host's {cpu['host_cores']} ({cpu['cores_limited_by']})" if limited else ""
    console.print(f"CPU: {cpu['model']}, {cpu['cores']} cores{ours}; GPUs: "
                  + (f"{gpus['count']} x {gpus['models'][0]} (driver {gpus['driver']})" if gpus["count"] else "none"))
    console.print("backends: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in found["backends"].items()))
    labs = Table(title="runnable here")
    for column in ("lab", "backend", "launchers", "world sizes (no oversubscription)"):
        labs.add_column(column)
    for lab, usable in found["labs"].items():
        if not usable:
            labs.add_row(lab, "[red]none[/red]", "", "")
        for entry in usable:
            labs.add_row(lab, entry["backend"], ", ".join(entry["launchers"]),
                         entry["world_sizes_without_oversubscribing"])
    console.print(labs)
    for problem in missing:
        console.print(f"[red]problem:[/red] {escape(problem)}")
    return 1 if missing else 0


def fingerprint() -> dict[str, Any]:
    """The few facts that choose a profile: GPU count and models, CPU cores and model."""
    gpus = host.gpus()
    return {"gpus": gpus["count"], "gpu_models": gpus["models"], "cores": host.usable_cores().count,
            "cpu_model": host.cpu_model()}
