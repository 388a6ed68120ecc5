"""Every number carries its provenance: the versions, hardware and settings a result depends on.

Only the standard library at import time (the harness imports this without torch); torch, and
mpi4py when the lab has loaded it, are asked lazily.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from importlib import metadata
from typing import Any

from labs.common.host import cpu_model, git_commit, gpus, usable_cores
from labs.common.topology import Topology


def version(dist_name: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed."""
    try:
        return metadata.version(dist_name)
    except metadata.PackageNotFoundError:
        return None


def mpi_library() -> str | None:
    """The MPI library mpi4py runs on (Open MPI, MPICH, ...), if this process has loaded mpi4py."""
    if "mpi4py" not in sys.modules:  # importing mpi4py initialises MPI; only report it if the lab did
        return None
    from mpi4py import MPI

    return MPI.Get_library_version().splitlines()[0].strip().rstrip("\x00")  # Open MPI ends it with a NUL


def versions() -> dict[str, str | None]:
    """python, torch, torchvision, horovod, mpi4py, the MPI library and NCCL, as this process sees them."""
    nccl = None
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "python": platform.python_version(),
        "torch": version("torch"),
        "torchvision": version("torchvision"),
        "horovod": version("horovod"),
        "mpi4py": version("mpi4py"),
        "mpi": mpi_library(),
        "nccl": nccl,
    }


def hardware() -> dict[str, Any]:
    """The CPU, the cores this process may use (affinity, cgroup quota, host: labs/common/host.py) and
    what limits them, the host's own count beside it, and the GPUs."""
    cores = usable_cores()
    return {"cpu_model": cpu_model(), "cores": cores.count, "cores_limited_by": cores.limited_by,
            "host_cores": cores.host, "gpus": gpus()}


def provenance(topology: Topology, backend: str) -> dict[str, Any]:
    """Everything a number depends on, so a result can be traced and compared."""
    threads = None
    with contextlib.suppress(ImportError):
        import torch

        threads = torch.get_num_threads()
    return {
        "versions": versions(),
        "hardware": hardware(),
        "hostname": topology.hostname,
        "world_size": topology.world_size,
        "threads_per_rank": threads,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "backend": backend,
        "launcher": topology.launcher,
        "git_commit": git_commit(),
    }
