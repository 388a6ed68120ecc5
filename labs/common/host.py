"""Facts about the host that both the labs and the harness need, defined once.

Only the standard library at import time: the harness imports this without torch, and
torch is imported lazily where a GPU question needs it.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def cpu_model() -> str:
    """The CPU's marketing name: machines of one kind differ up to 8x in speed, so records name it."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


# What a GPU driver leaves on a host where torch.cuda could find a device: NVIDIA's kernel module
# (also seen inside containers), its device nodes, WSL2's GPU bridge, and ROCm's device for torch's
# HIP build. Where none exists there is no GPU to count, and torch is not imported to say so.
GPU_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def gpu_count() -> int:
    """GPUs this process can use (CUDA_VISIBLE_DEVICES applies); 0 without torch, CUDA or a GPU driver.

    Importing torch costs a CPU host 1.4 s of CPU (Intel Xeon), paid by every `distlab` command
    that picks a backend; on a host with no GPU driver the answer is known without it."""
    if not any(os.path.exists(path) for path in GPU_DRIVER_PATHS):
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def rank_device(requested: str, local_rank: int, local_world_size: int, gpus: int) -> str:
    """The device one rank computes on: "cpu" or "cuda:<index>". The one rule behind the labs' --device.

    auto: GPU <local rank> when every rank on this node can have a GPU of its own, else the CPU for
    every rank. It is the rule the harness's backend_for follows (harness/catalog.py: NCCL when each
    rank has a GPU, Gloo "on the CPUs" otherwise); giving each rank cuda:<local rank> regardless sent
    the ranks past the last GPU to "invalid device ordinal".
    cuda: asked for by name, so the ranks share the GPUs, local rank modulo their count: two ranks
    over Gloo with CUDA tensors on one GPU work (NCCL refuses two ranks on one GPU, and says so).
    cpu: the CPU."""
    if requested == "cpu" or (requested == "auto" and gpus < max(1, local_world_size)):
        return "cpu"
    if requested not in ("auto", "cuda"):
        raise ValueError(f"unknown device {requested!r}; choose auto, cpu or cuda")
    if not gpus:
        raise ValueError("--device cuda: no GPU is visible; use --device cpu")
    return f"cuda:{local_rank % gpus}"


def gpus() -> dict[str, Any]:
    """Count, models and driver of the visible GPUs, for provenance."""
    count = gpu_count()
    if not count:
        return {"count": 0, "models": [], "driver": None}
    import torch

    driver = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        driver = out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout else None
    return {"count": count, "models": [torch.cuda.get_device_name(i) for i in range(count)], "driver": driver}



def fingerprint() -> dict[str, Any]:
    """The few facts that choose a profile and describe a measurement: GPU count and models, CPU
    cores and model."""
    found = gpus()
    return {"gpus": found["count"], "gpu_models": found["models"], "cores": os.cpu_count() or 1,
            "cpu_model": cpu_model()}

def git_commit(where: Path = REPO) -> str | None:
    """The commit the code ran from: DISTLAB_GIT_COMMIT when the harness passed it on (ranks may run
    in a copy without .git, e.g. a container), else asked of git; None outside a checkout."""
    if os.environ.get("DISTLAB_GIT_COMMIT"):
        return os.environ["DISTLAB_GIT_COMMIT"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5)
        if out.returncode == 0:
            return out.stdout.strip()
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it), for a store or rendezvous to bind."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
