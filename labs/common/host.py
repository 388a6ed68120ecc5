"""Facts about the host that both the labs and the harness need, defined once.

Only the standard library at import time: the harness imports this without torch, and
torch is imported lazily where a GPU question needs it.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import random
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def setup_command(without_checkout: str) -> str:
    """How to install what this host lacks: a checkout's `make setup` (its Makefile lies beside harness/
    and labs/), else `without_checkout`: an installed wheel has no Makefile, and `make setup` names a
    command its users do not have."""
    return "run `make setup`" if (REPO / "Makefile").is_file() else without_checkout


def pip_install(pip_args: str) -> str:
    """pip of the Python running distlab, the one the labs run with: another pip installs elsewhere."""
    return f"run `{sys.executable} -m pip install {pip_args}`"


def cpu_model() -> str:
    """The CPU's marketing name: machines of one kind differ up to 8x in speed, so records name it."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class Cores:
    """The CPU cores this process may use: the fewest that any limit leaves it, and which limit that is."""

    count: int  # whole cores, at least 1
    limited_by: str  # "affinity", "cgroup cpu.max" (v2), "cgroup cpu.cfs_quota_us" (v1) or "host"
    host: int  # what the kernel reports for the machine (os.cpu_count())
    affinity: int | None  # the CPUs this process may be scheduled on (taskset, cpuset, Slurm's binding)
    quota: float | None  # the cgroup's CPU quota in cores, e.g. 1.5 (None: no quota)

    def describe(self) -> str:
        if self.limited_by == "host":
            return f"{self.count} cores (the host's)"
        quota = f"{self.quota:g} cores of quota" if self.quota is not None else ""
        return f"{self.count} of the host's {self.host} cores ({self.limited_by}" + (
            f": {quota})" if quota and self.limited_by.startswith("cgroup") else ")")


def usable_cores(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> Cores:
    """How many cores are ours: the CPUs we may run on (affinity), then the cgroup's CPU quota, then the host.

    os.cpu_count() reports the machine: inside a Slurm allocation, a Kubernetes pod with a CPU limit,
    a container with a quota or under taskset it overstates what a process gets, and threads sized
    from it oversubscribe. The quota is rounded down (1.5 cores of quota run 1 thread at full speed,
    not 2) and the smallest quota on the way up the cgroup tree counts. `cgroup_root` and
    `proc_cgroup` are parameters so that a folder laid out like /sys/fs/cgroup can stand in for it."""
    host = os.cpu_count() or 1
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    limited_by, quota = cgroup_cpu_quota(cgroup_root, proc_cgroup)
    candidates = [(host, "host")]
    if affinity:
        candidates.append((affinity, "affinity"))
    if quota is not None:
        candidates.append((max(1, math.floor(quota)), limited_by))
    count = min(n for n, _ in candidates)
    # The first limit that binds names it (affinity before an equal quota); none below the host: "host".
    named = next((why for n, why in candidates[1:] if n == count), "host") if count < host else "host"
    return Cores(count, named, host, affinity, quota)


# The one reader of cgroup files: this process's own groups (the CPU quota here; the memory a
# Gradescope container was given, classgrade/gradescope.py) and the counters of a group the grader
# made (classgrade/sandbox/cgroups.py, which creates, limits and removes them).

def own_cgroups(proc_cgroup: Path = PROC_SELF_CGROUP) -> list[tuple[str, str, str]]:
    """This process's cgroups as /proc/self/cgroup lists them, (hierarchy, controllers, path): a v1
    line `4:cpu,cpuacct:/path` as ("4", "cpu,cpuacct", "/path"), the v2 line `0::/path` as ("0", "",
    "/path"); none where the file cannot be read."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return []
    return [(hierarchy, controllers, path) for hierarchy, controllers, path in
            ((line.split(":", 2) + ["", ""])[:3] for line in lines)]


def own_cgroup_file(controller: str, name: str, cgroup_root: Path = CGROUP_ROOT,
                    proc_cgroup: Path = PROC_SELF_CGROUP) -> Path | None:
    """A file of this process's own group: cgroup v2's unified one (controller ""), else the v1
    controller's. Inside a container the group is mounted at the controller's root; on a host, under its path."""
    own = {}
    for _, controllers, path in own_cgroups(proc_cgroup):
        for each in controllers.split(",") if controllers else [""]:
            own[each] = path.lstrip("/")
    for folder in ([cgroup_root / controller / own.get(controller, ""), cgroup_root / controller] if controller else
                   [cgroup_root / own.get("", ""), cgroup_root]):
        if (folder / name).is_file():
            return folder / name
    return None


def cgroup_number(path: Path | None) -> int | None:
    """A cgroup file holding one number (memory.peak, memory.limit_in_bytes), or None: no such file, "max"."""
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().strip()) if path is not None else None
    return None


def cgroup_counter(path: Path | None, key: str) -> int:
    """A counter of a cgroup file of `key value` lines (memory.events' oom_kill, pids.events' max): 0 where absent."""
    with contextlib.suppress(OSError, ValueError):
        return sum(int(value) for name, _, value in (line.partition(" ") for line in
                                                     (path.read_text() if path else "").splitlines()) if name == key)
    return 0


# Each counter's file: cgroup v2's, v1's.
PEAK_MEMORY = {2: "memory.peak", 1: "memory.max_usage_in_bytes"}
MEMORY_EVENTS = {2: "memory.events", 1: "memory.oom_control"}  # the oom_kill counter in either
PIDS_EVENTS = "pids.events"  # the max counter: forks refused at pids.max
UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a huge number


def own_memory_limit(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> int | None:
    """Bytes of memory this process's group may use (v2 memory.max, v1 memory.limit_in_bytes); None: no limit."""
    for controller, name in (("", "memory.max"), ("memory", "memory.limit_in_bytes")):
        value = cgroup_number(own_cgroup_file(controller, name, cgroup_root, proc_cgroup))  # None: "max"
        if value is not None and value < UNLIMITED:
            return value
    return None


def tightest_memory_limit(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> int | None:
    """The least memory limit of this process's group and the groups above it (a job's own group may
    allow more than the container it lies in): v1's memory hierarchy, else v2's; None: no limit."""
    def read(name: str) -> Callable[[Path], int | None]:
        return lambda folder: (value if (value := cgroup_number(folder / name)) is not None and value < UNLIMITED
                               else None)

    for _hierarchy, controllers, path in own_cgroups(proc_cgroup):
        if "memory" in controllers.split(",") and (cgroup_root / "memory").is_dir():
            found = _smallest(cgroup_root / "memory", path, read("memory.limit_in_bytes"))
            return int(found) if found is not None else None
    v2 = next((path for hierarchy, controllers, path in own_cgroups(proc_cgroup) if hierarchy == "0"), None)
    found = _smallest(cgroup_root, v2, read("memory.max")) if v2 is not None else None
    return int(found) if found is not None else None


def own_memory_account(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> dict[str, Any]:
    """This process's group's peak memory and the processes its limit killed."""
    def own(version: int, names: dict[int, str]) -> Path | None:
        return own_cgroup_file("" if version == 2 else "memory", names[version], cgroup_root, proc_cgroup)

    return {"peak_memory_bytes": cgroup_number(own(2, PEAK_MEMORY) or own(1, PEAK_MEMORY)),
            "oom_kills": cgroup_counter(own(2, MEMORY_EVENTS) or own(1, MEMORY_EVENTS), "oom_kill")}


CPU_PERIOD_US = 100_000  # the period a CPU quota is given over (the kernel's default)


def cpu_quota_settings(cpus: float, version: int) -> dict[str, str]:
    """The files, in the order to write them, and values that give a cgroup `cpus` CPUs of quota: what
    cgroup_cpu_quota reads back (a benchmark's box of half a CPU, as Gradescope gives by default)."""
    quota = max(1000, round(cpus * CPU_PERIOD_US))  # the kernel's least quota is 1 ms
    if version == 2:
        return {"cpu.max": f"{quota} {CPU_PERIOD_US}"}
    return {"cpu.cfs_period_us": str(CPU_PERIOD_US), "cpu.cfs_quota_us": str(quota)}


def cgroup_cpu_quota(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP
                     ) -> tuple[str, float | None]:
    """The CPU quota of this process's cgroup in cores (None: unlimited), with the file it came from.

    /proc/self/cgroup names the cgroup: a v1 line `N:cpu,cpuacct:/path` (the cpu controller's
    hierarchy, which takes precedence on hybrid hosts) or the v2 line `0::/path`. The quota is the
    smallest on the way from that cgroup up to the root: a parent's limit binds its children."""
    v1 = v2 = None
    for hierarchy, controllers, path in own_cgroups(proc_cgroup):
        if "cpu" in controllers.split(","):
            v1 = (controllers, path)
        elif controllers == "" and hierarchy == "0":
            v2 = path
    if v1 is not None:
        folder = next((cgroup_root / name for name in (v1[0], "cpu") if (cgroup_root / name).is_dir()), None)
        return ("cgroup cpu.cfs_quota_us", _smallest(folder, v1[1], _v1_quota)) if folder else ("", None)
    if v2 is not None:
        return "cgroup cpu.max", _smallest(cgroup_root, v2, _v2_quota)
    return "", None


def _smallest(mount: Path, path: str, read) -> float | None:
    """The smallest quota from the cgroup at `path` up to the hierarchy's root. A path the mount does
    not hold (a container that sees only its own cgroup, mounted at the root) starts at the root."""
    here = mount / path.strip("/")
    if not here.is_dir():
        here = mount
    quotas = []
    while True:
        with contextlib.suppress(OSError, ValueError):
            quota = read(here)
            if quota is not None:
                quotas.append(quota)
        if here == mount or mount not in here.parents:
            break
        here = here.parent
    return min(quotas) if quotas else None


def _v2_quota(folder: Path) -> float | None:
    """cpu.max: `max 100000` (no limit) or `<quota> <period>` in microseconds."""
    quota, _, period = (folder / "cpu.max").read_text().strip().partition(" ")
    return None if quota == "max" else int(quota) / int(period or 100000)


def _v1_quota(folder: Path) -> float | None:
    """cpu.cfs_quota_us (-1: no limit) over cpu.cfs_period_us."""
    quota = int((folder / "cpu.cfs_quota_us").read_text())
    return None if quota < 0 else quota / int((folder / "cpu.cfs_period_us").read_text())


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
    return {"gpus": found["count"], "gpu_models": found["models"], "cores": usable_cores().count,
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


# Where free_port looks when the kernel's range cannot be read: Linux's default ephemeral range.
DEFAULT_EPHEMERAL_PORTS = (32768, 60999)
EPHEMERAL_PORTS_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000  # below it, the ports that services are configured on (SSH, 3000, 5432, 8080...)


def ephemeral_ports() -> tuple[int, int]:
    """The range the kernel takes a port from for a socket that names none (bind to 0, connect)."""
    with contextlib.suppress(OSError, ValueError):
        low, high = map(int, EPHEMERAL_PORTS_FILE.read_text().split())
        return low, high
    return DEFAULT_EPHEMERAL_PORTS


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now and outside the ephemeral range, for a store or rendezvous to bind later.

    Outside the range because the port is bound later, by another process (rank 0): a port the kernel
    picks (bind to 0) comes from the ephemeral range, where every outgoing connection, Gloo's listeners
    and mpirun's daemons take theirs, and on a busy host one of them took it in between (CI: "Address
    already in use" on rank 0). A port outside it is only ever taken by a bind that names it. The kernel
    picks when no port is left outside the range.
    """
    low, high = ephemeral_ports()
    outside = [*range(LOWEST_PORT, low), *range(high + 1, 65536)]
    for port in random.sample(outside, min(64, len(outside))):
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind((host, port))
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
