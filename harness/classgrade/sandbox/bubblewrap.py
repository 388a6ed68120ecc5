"""bwrap's command line for a run: its namespaces, what is bound read-only, hidden, writable, its GPUs."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from harness.classgrade.sandbox.spec import Spec
from harness.classgrade.sandbox.uid import as_the_jobs_uid

INSTALL_HINT = "install bubblewrap (`apt-get install bubblewrap`, or `make setup` as root), or pass --no-sandbox"


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def available() -> str | None:
    """None where the sandbox can start here, else the one line that says how to get it."""
    tool = bwrap_path()
    if tool is None:
        return f"the sandbox tool bubblewrap (bwrap) is not installed; {INSTALL_HINT}"
    for needed in ("setpriv", "prlimit"):
        if shutil.which(needed) is None:
            return f"{needed} (util-linux) is not installed; install util-linux, or pass --no-sandbox"
    return None



NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # one folder per GPU, by PCI bus id, each with its "Device Minor"


def gpu_minors(indices: list[int]) -> list[int]:
    """The /dev/nvidiaN of each GPU index in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID, nvidia-smi's):
    the driver's device minor of each, which need not be the index; the index where the driver says none."""
    try:  # bus ids ("0000:1b:00.0", fixed width, lower case) sort as the bus order
        infos = [Path(NVIDIA_GPUS, bus, "information").read_text() for bus in sorted(os.listdir(NVIDIA_GPUS))]
        minors = [int(re.search(r"^Device Minor:\s*(\d+)", info, re.M).group(1)) for info in infos]  # type: ignore[union-attr]
    except (OSError, AttributeError, ValueError):  # no driver here, or one that does not say: the indices
        minors = []
    return [minors[i] if i < len(minors) else i for i in indices]


def gpu_sys_paths() -> list[str]:
    """What NCCL's topology detection reads (src/os/linux.cc, src/graph/xml.cc): each GPU's PCI path,
    resolved from /sys/class/pci_bus/<domain:bus>/../../<bus id>, the attributes along it up to the
    root complex (class, link speeds and widths, numa_node), and each NUMA node's cpumap; without
    them it guesses the topology. NVIDIA's module version is read there too."""
    roots = sorted(str(p) for p in Path("/sys/devices").glob("pci*"))
    wanted = ["/sys/class/pci_bus", *roots, "/sys/bus/pci", "/sys/devices/system/node", "/sys/module/nvidia"]
    return [path for path in wanted if os.path.exists(path)]


def _under(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _parents(path: str, made: set[str]) -> list[str]:
    """`--dir` for each folder above `path` not made yet: bwrap would make them mode 0700, closed to the job's uid."""
    args: list[str] = []
    parts = Path(path).parents
    for parent in reversed(list(parts)[:-1]):  # from the top, without "/"
        text = str(parent)
        if text not in made:
            made.add(text)
            args += ["--perms", "0755", "--dir", text]
    return args



def _gpu_binds(spec: Spec, made: set[str]) -> list[str]:
    """The job's GPUs only: CUDA numbers the devices it can open from 0, so inside they are 0..k-1
    (CUDA_VISIBLE_DEVICES, bwrap_argv), in PCI bus order as outside. Binding every GPU and hiding the
    others by CUDA_VISIBLE_DEVICES alone would let a program that unsets it use another job's.
    `made`: the folders bound or made so far, which this adds to."""
    argv = []
    for minor in gpu_minors(spec.gpus or []):
        argv += ["--dev-bind-try", f"/dev/nvidia{minor}", f"/dev/nvidia{minor}"]
    if spec.gpus:
        for device in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
            argv += ["--dev-bind-try", f"/dev/{device}", f"/dev/{device}"]
        argv += ["--ro-bind-try", "/proc/driver/nvidia", "/proc/driver/nvidia"]
        for path in gpu_sys_paths():  # read-only, with parents the job's uid can pass (not bwrap's 0700)
            argv += _parents(path, made) + ["--ro-bind", path, path]
            made.add(path)
    return argv


def bwrap_argv(spec: Spec, run_dir: str, command: list[str], tool: str = "bwrap", seccomp_fd: int | None = None
               ) -> list[str]:
    argv = [tool, "--die-with-parent", "--new-session", "--unshare-net", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox",
            *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else [])]
    made: set[str] = set()
    for name in ("bin", "lib", "lib64", "sbin"):  # merged-/usr systems: links; otherwise the folders themselves
        host = Path("/") / name
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), str(host)]
        made.add(str(host))
    bound = sorted(set(spec.read_only), key=lambda p: (p.count("/"), p))  # a folder before what lies in it
    for path in bound:
        if os.path.exists(path):
            argv += _parents(path, made) + ["--ro-bind", path, path]
            made.add(path)
    cpu_info = "/sys/devices/system/cpu"  # torch reads the CPU's topology; nothing else of /sys is shown
    argv += _parents(cpu_info, made) + ["--ro-bind-try", cpu_info, cpu_info]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp",
             "--perms", "1777", "--tmpfs", "/dev/shm"]
    scratch = ["/tmp", "/dev/shm"]  # private and empty now: what was bound or made under them is gone
    made = {p for p in made if not _under(p, scratch)}
    for path in bound:  # a checkout or environment under /tmp (a clone there) is bound again over it
        if _under(path, scratch) and os.path.exists(path):
            argv += _parents(path, made) + ["--ro-bind", path, path]
            made.add(path)
    argv += _gpu_binds(spec, made)
    # Hidden next (the class's other folders, where a broad bind shows them), then what is the job's
    # own, bound into those empty folders: the parents made before are gone under the new tmpfs.
    covered = []
    for path in spec.hidden:
        if _under(path, bound):
            argv += ["--perms", "0755", "--tmpfs", path]
            covered.append(path)
    made = {p for p in made if not _under(p, covered)}
    for path in sorted(set(spec.own), key=lambda p: (p.count("/"), p)):
        if os.path.exists(path):
            argv += _parents(path, made) + ["--ro-bind", path, path]
            made.add(path)
    argv += _parents(run_dir, made) + ["--bind", run_dir, run_dir, "--chdir", run_dir]
    env = {"HOME": "/tmp", "TMPDIR": "/tmp", "GLOO_SOCKET_IFNAME": "lo", **spec.env}
    if spec.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(len(spec.gpus))))
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    for name, value in env.items():
        argv += ["--setenv", name, value]
    return argv + ["--", *as_the_jobs_uid(spec, command)]
