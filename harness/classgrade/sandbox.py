"""Each submission's runs inside bubblewrap: what it can see, reach, write and use, and every breach named.

The whole launcher (torchrun and its ranks, or the one python process) starts inside one sandbox
per run, so the ranks still meet over loopback, and nothing else is reachable:

    bwrap: new network namespace (loopback only), new pid, ipc and uts namespaces, a new session
      read-only: /usr (and the /bin, /lib links), /etc, the interpreter's prefix, the repository
        (harness, labs, the environment in .nox/env), the submission's own folder, the data
      hidden:    every other folder of the class (submissions, results) under those, by an empty tmpfs
      writable:  the run's own directory; a private /tmp and /dev/shm (tmpfs, charged to its memory)
    setpriv: a uid and gid of the job's own (never root), no capabilities, no_new_privs
    prlimit: open files, processes (per uid: the job's own), file size (its output), no core dumps
    cgroup (v1 or v2, where writable): memory (RAM and swap), processes

The grader creates the job's cgroup and watches it from outside while the job runs (Monitor): a job
that hits the process limit or writes more than its output limit into its folder is stopped at
once, and the kernel's OOM killer ends one that needs more memory than it may have; each breach is
kept by name ("started more than 512 processes"). What the sandbox refused a program (a
connection off loopback, a write to a read-only file) is named from the program's own output
(`denials`): a program that swallows the error is still contained, only not named.

This file is also the program that enters the sandbox (`python -I sandbox.py SPEC RUN_DIR -- CMD`):
it runs as the grader, joins the cgroup, hands the run directory to the job's uid and execs bwrap.
It needs the standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve()
INSTALL_HINT = "install bubblewrap (`apt-get install bubblewrap`, or `make setup` as root), or pass --no-sandbox"
CGROUP_ROOT = Path("/sys/fs/cgroup")
FIRST_UID = 20000  # each job runs as a uid/gid of its own from here up, claimed for as long as it runs
UIDS = 1000
# Every grader on the host claims its jobs' uids here (a lock per uid, held by the job's process):
# two class grades at once, a test suite's workers among them, never share one, and ending one
# job's processes by uid never reaches another's.
UID_LOCKS = Path("/run/lock" if os.path.isdir("/run/lock") else "/tmp") / "distlab-sandbox-uids"
GIB = 1 << 30


def size_text(count: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:g} {unit}"
    return f"{count} bytes"


@dataclass(frozen=True)
class Limits:
    """What one submission's runs may use; from the rubric's [limits] table (these are its defaults).

    Memory: a ddp smoke run at world size 2 peaked at 1.6 GiB here (the cgroup's peak: launcher, two
    ranks, the launcher); the course's full lab at 4 ranks needs about 3 GiB. Processes: a rank
    with DataLoader workers and torch's threads stays under 100 threads (threads count as
    processes for both the cgroup and RLIMIT_NPROC)."""

    memory_bytes: int = 6 * GIB
    processes: int = 512
    open_files: int = 4096
    output_bytes: int = 2 * GIB
    wall_s: float | None = None  # None: the profile's own (twice each lab's time budget)
    # Entries (files, folders, links) in its folder: a run of the course's labs leaves under 100 (logs,
    # observations, a checkpoint per epoch); each costs the host an inode, and 200k were made in 8 s.
    files: int = 10000
    depth: int = 32  # folders below its run folder: the labs' deepest is 2 (logs/<run>/attempt_0/<rank>)

    def breach(self, what: str) -> str:
        return {"memory": f"used more than {size_text(self.memory_bytes)} of memory",
                "processes": f"started more than {self.processes} processes",
                "output": f"wrote more than {size_text(self.output_bytes)} into its folder",
                "files": f"made more than {self.files} files and folders in its folder",
                "depth": f"nested folders more than {self.depth} deep in its folder",
                "unmeasurable": "left its folder in a state the grader could not measure",
                "open_files": f"opened more than {self.open_files} files at once",
                "file_size": f"wrote a file larger than {size_text(self.output_bytes)}",
                "wall": f"ran past its wall time{f' of {self.wall_s:g} s' if self.wall_s else ''}"}[what]


def job_cgroup_name(job: dict[str, Any]) -> str:
    """The cgroup of a job's runs (job.py makes it, the pool removes it if the job could not)."""
    return f"{job['class_id']}-{job['id']}"


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


def refusal(mode: str = "bwrap") -> str | None:
    """None where grade-class can sandbox its jobs here in `mode`, else the one line that says why not
    and what to do."""
    if mode == "uid":
        for needed in ("setpriv", "prlimit"):
            if shutil.which(needed) is None:
                return f"{needed} (util-linux) is not installed; install util-linux, or pass --no-sandbox"
    else:
        problem = available()
        if problem:
            return problem
    if os.geteuid() != 0:
        return ("the sandbox gives each job a uid and a cgroup of its own, which needs root; run grade-class as "
                "root (a course's grading host or container), or pass --no-sandbox")
    if mode == "uid":
        return uid_refusal()
    probe = subprocess.run([bwrap_path(), "--unshare-net", "--unshare-pid", "--ro-bind", "/", "/", "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return (f"bubblewrap cannot make namespaces here ({probe.stderr.strip()[:200]}); allow them (a privileged "
                "container), grade with --sandbox uid (a uid of its own, without namespaces), or pass --no-sandbox")
    return None


def uid_refusal() -> str | None:
    """uid mode: the job's uid must reach the environment and the repository's harness and labs (the
    ranks import them) through folders others may enter; one line saying what is closed, else None."""
    from harness.catalog import REPO

    code = "import sys; sys.path.insert(0, sys.argv[1]); import harness.on_ranks, labs.common.contract"
    spec = Spec(uid=FIRST_UID + UIDS - 1, limits={}, read_only=[], hidden=[])  # a job's uid, as it runs
    probe = subprocess.run(as_the_jobs_uid(spec, [sys.executable, "-I", "-c", code, str(REPO)]),
                           capture_output=True, text=True, timeout=60, cwd="/")
    if probe.returncode != 0:
        closed = next((str(folder) for folder in Path(os.path.realpath(sys.executable)).parents
                       if not os.stat(folder).st_mode & 0o001), None)
        if closed:
            return (f"a job's uid cannot reach this Python: {closed} is closed to other users; allow them through "
                    f"(chmod o+x {closed}), or grade with a Python they can run")
        return (f"a job's uid cannot read {sys.prefix} or {REPO}'s harness and labs "
                f"({(probe.stderr.strip().splitlines() or ['?'])[-1][:160]}); make them and the folders above them "
                "readable by others (chmod o+rX), or grade from a checkout there")
    return None


# ------------------------------------------------------------------------------------------ cgroups

class Cgroup:
    """The job's memory and process limits: cgroup v2 where its controllers are delegated, else
    v1's memory and pids hierarchies; `None` from `create` where neither is writable."""

    def __init__(self, dirs: dict[str, Path], version: int) -> None:
        self.dirs, self.version = dirs, version

    @classmethod
    def layout(cls, name: str) -> Cgroup | None:
        """Where the cgroup of this name lives on this host (made or not): v2 where its memory and pids
        controllers are there, else v1's two hierarchies; None where neither is."""
        unified = CGROUP_ROOT / "cgroup.controllers"
        with contextlib.suppress(OSError):
            if unified.is_file() and {"memory", "pids"} <= set(unified.read_text().split()):
                top = CGROUP_ROOT / "distlab"
                return cls({"memory": top / name, "pids": top / name}, 2)
        if (CGROUP_ROOT / "memory").is_dir() and (CGROUP_ROOT / "pids").is_dir():
            return cls({kind: CGROUP_ROOT / kind / "distlab" / name for kind in ("memory", "pids")}, 1)
        return None

    @classmethod
    def create(cls, name: str, limits: Limits) -> Cgroup | None:
        group = cls.layout(name)
        try:
            if group is None:
                return None
            if group.version == 2:
                top = CGROUP_ROOT / "distlab"
                top.mkdir(exist_ok=True)
                with contextlib.suppress(OSError):
                    (top / "cgroup.subtree_control").write_text("+memory +pids")
            for path in set(group.dirs.values()):
                path.mkdir(parents=True, exist_ok=True)
            group.limit(limits)
            return group
        except OSError:
            return None

    @classmethod
    def remove_named(cls, name: str) -> None:
        """Kill what is in the cgroup of this name and remove it, where it is left (a job ended before
        its own clean-up); nothing where there is none."""
        group = cls.layout(name)
        if group is not None and any(path.is_dir() for path in group.dirs.values()):
            group.remove()

    def _write(self, kind: str, name: str, value: str) -> None:
        (self.dirs[kind] / name).write_text(value)

    def limit(self, limits: Limits) -> None:
        if self.version == 2:
            self._write("memory", "memory.max", str(limits.memory_bytes))
            with contextlib.suppress(OSError):
                self._write("memory", "memory.swap.max", "0")
            self._write("pids", "pids.max", str(limits.processes))
            return
        self._write("memory", "memory.limit_in_bytes", str(limits.memory_bytes))
        with contextlib.suppress(OSError):  # without swap accounting the limit is RAM only
            self._write("memory", "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        self._write("pids", "pids.max", str(limits.processes))

    def procs_files(self) -> list[str]:
        return sorted({str(path / "cgroup.procs") for path in self.dirs.values()})

    def pids(self) -> list[int]:
        found: set[int] = set()
        for name in self.procs_files():
            with contextlib.suppress(OSError, ValueError):
                found |= {int(line) for line in Path(name).read_text().split()}
        return sorted(found)

    def _counter(self, kind: str, filename: str, key: str) -> int:
        with contextlib.suppress(OSError, ValueError):
            for line in (self.dirs[kind] / filename).read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
        return 0

    def oom_kills(self) -> int:
        return self._counter("memory", "memory.events" if self.version == 2 else "memory.oom_control", "oom_kill")

    def process_limit_hits(self) -> int:
        return self._counter("pids", "pids.events", "max")

    def peak_memory(self) -> int | None:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        with contextlib.suppress(OSError, ValueError):
            return int((self.dirs["memory"] / name).read_text())
        return None

    def kill(self) -> None:
        """SIGKILL every process in it, until none is left (a fork bomb refills between reads)."""
        for _ in range(200):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def remove(self) -> None:
        self.kill()
        for path in set(self.dirs.values()):
            for _ in range(50):  # the last processes leave a moment after SIGKILL
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)


# ------------------------------------------------------------------------------------ the sandbox

@dataclass
class Spec:
    """One job's sandbox, as the entering program reads it (JSON, written by the grader)."""

    uid: int
    limits: dict
    read_only: list[str]  # folders and files bound read-only at their own paths: the system, the repository
    hidden: list[str]  # folders masked by an empty tmpfs (other submissions, the class's results)
    own: list[str] = field(default_factory=list)  # the submission's own folder, read-only, bound after `hidden`
    cgroup_procs: list[str] = field(default_factory=list)  # cgroup.procs files the entering process joins
    gpus: list[int] | None = None  # GPU indices of this job: only their device files bound
    env: dict[str, str] = field(default_factory=dict)
    # "bwrap": the namespaces above; "uid": where namespaces are refused (a container), the job's uid,
    # its limits and its cgroup alone (uid_argv), with the grader's files made private (make_private).
    mode: str = "bwrap"
    job_folder: str = ""  # uid mode: the folders from here down to a run's are made passable to the uid

    def write(self, path: Path) -> Path:
        from harness.files import write_json  # here: the entering program has only the standard library

        write_json(path, asdict(self))
        return path


# Of the repository, what a run reads: the harness (the observer, the reference loops) and the labs
# (the course's programs, labs/common). Never the rest: .git, caches, earlier results, another week's
# submissions kept in the checkout.
REPOSITORY_PARTS = ("harness", "labs")


def base_read_only(python: str = sys.executable) -> list[str]:
    """What every run needs to read: the system, the interpreter the environment was made from, the
    environment, the repository's harness and labs."""
    from harness.catalog import REPO  # imported here: the entering program has only the standard library

    prefixes = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    interpreter = Path(os.path.realpath(python)).parent.parent  # the venv's python: a link into its base prefix
    return sorted({"/usr", "/etc", *(str(REPO / part) for part in REPOSITORY_PARTS), str(interpreter), *prefixes})


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


# ------------------------------------------------------------------------------------ seccomp

# System calls refused inside the sandbox, where the namespaces leave a way out or a channel:
# the kernel's keyrings are per uid and outlive a job (a later job could read a key an earlier one
# left), and a user namespace made inside would give the program capabilities over its own mounts.
# (name: x86_64 number, aarch64 number); clone and unshare are refused with CLONE_NEWUSER only.
SYSCALLS = {"keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
            "unshare": (272, 97), "clone": (56, 220), "clone3": (435, 435)}
ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}  # AUDIT_ARCH_*, column in SYSCALLS
CLONE_NEWUSER = 0x10000000
X32_SYSCALL_BIT = 0x40000000
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ/JGE/JSET|K, BPF_RET|K
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | errno


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The sandbox's seccomp program (classic BPF, as bwrap --seccomp takes it) for this machine's
    architecture; None on another (then the namespaces alone hold). System calls of another ABI
    (i386's int 0x80, x32 on x86_64) get ENOSYS: their numbers differ and would slip past."""
    import errno
    import platform
    import struct

    arch = ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, column = arch
    number = {name: numbers[column] for name, numbers in SYSCALLS.items()}
    eperm, enosys = _ERRNO | errno.EPERM, _ERRNO | errno.ENOSYS
    # (code, jump if true -> label, jump if false -> label, k); labels resolved below.
    program: list[tuple[int, str | None, str | None, int]] = [
        (_LD_ABS, None, None, 4),  # seccomp_data.arch
        (_JEQ, None, "enosys", audit_arch),
        (_LD_ABS, None, None, 0),  # seccomp_data.nr
        *([(_JGE, "enosys", None, X32_SYSCALL_BIT)] if audit_arch == ARCHES["x86_64"][0] else []),
        *((_JEQ, "eperm", None, number[name]) for name in ("keyctl", "add_key", "request_key")),
        (_JEQ, "enosys", None, number["clone3"]),  # its flags are in memory a filter cannot read: libc falls back
        (_JEQ, "flags", None, number["unshare"]),
        (_JEQ, "flags", None, number["clone"]),
        (_RET, None, None, _ALLOW),
        ("flags", _LD_ABS, None, None, 16),  # args[0], its low 32 bits: the flags of clone and unshare
        (_JSET, "eperm", None, CLONE_NEWUSER),
        (_RET, None, None, _ALLOW),
        ("eperm", _RET, None, None, eperm),
        ("enosys", _RET, None, None, enosys),
    ]
    labels, steps = {}, []
    for step in program:
        if isinstance(step[0], str):
            labels[step[0]] = len(steps)
            step = step[1:]
        steps.append(step)
    out = b""
    for index, (code, if_true, if_false, k) in enumerate(steps):
        jump = {None: 0, **{name: target - index - 1 for name, target in labels.items()}}
        out += struct.pack("=HBBI", code, jump[if_true], jump[if_false], k)
    return out


def load_seccomp() -> bool:
    """The filter loaded into this process (and all it execs) by prctl, as bwrap does with --seccomp:
    for uid mode, which has no bwrap. False where there is no filter for this machine."""
    import ctypes

    program = seccomp_filter()
    if program is None:
        return False

    class Program(ctypes.Structure):  # struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    steps = ctypes.create_string_buffer(program, len(program))
    fprog = Program(len(program) // 8, ctypes.cast(steps, ctypes.c_void_p))
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0 or \
            libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"seccomp: {os.strerror(ctypes.get_errno())}")
    return True


def _seccomp_fd() -> int | None:
    """The filter in a memory file bwrap reads (--seccomp FD); None where there is none for this machine."""
    program = seccomp_filter()
    if program is None:
        return None
    fd = os.memfd_create("distlab-seccomp", 0)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd


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
    # The job's GPUs only: CUDA numbers the devices it can open from 0, so inside they are 0..k-1
    # (CUDA_VISIBLE_DEVICES below), in PCI bus order as outside. Binding every GPU and hiding the
    # others by CUDA_VISIBLE_DEVICES alone would let a program that unsets it use another job's.
    for minor in gpu_minors(spec.gpus or []):
        argv += ["--dev-bind-try", f"/dev/nvidia{minor}", f"/dev/nvidia{minor}"]
    if spec.gpus:
        for device in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
            argv += ["--dev-bind-try", f"/dev/{device}", f"/dev/{device}"]
        argv += ["--ro-bind-try", "/proc/driver/nvidia", "/proc/driver/nvidia"]
        for path in gpu_sys_paths():  # read-only, with parents the job's uid can pass (not bwrap's 0700)
            argv += _parents(path, made) + ["--ro-bind", path, path]
            made.add(path)
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


# RLIMIT_NPROC a little above the cgroup's pids.max: where both hold, the cgroup must refuse first, for
# its "max" event is what names the breach (the rlimit only makes fork fail, and a fork bomb that
# retries then runs to its wall time unnamed: seen in uid mode, where no root process of bwrap's
# counts in the cgroup beside the job's); where there is no cgroup, the rlimit still bounds it.
NPROC_MARGIN = 32


def as_the_jobs_uid(spec: Spec, command: list[str]) -> list[str]:
    """`command` as the job's uid and gid (never root), no capabilities, no_new_privs, and its rlimits."""
    limits = Limits(**spec.limits)
    return ["setpriv", f"--reuid={spec.uid}", f"--regid={spec.uid}", "--clear-groups", "--no-new-privs",
            "--inh-caps=-all", "--bounding-set=-all",
            "prlimit", f"--nofile={limits.open_files}", f"--nproc={limits.processes + NPROC_MARGIN}",
            f"--fsize={limits.output_bytes}", "--core=0", "--", *command]


def uid_argv(spec: Spec, run_dir: str, command: list[str]) -> tuple[list[str], dict[str, str]]:
    """The uid mode's command and environment: no namespaces (a container that refuses them), so the
    job's uid, its rlimits, its cgroup and the files made private are what keep it in. A /tmp of its own
    inside the run directory."""
    private_tmp = os.path.join(run_dir, "tmp")
    env = {**os.environ, "HOME": private_tmp, "TMPDIR": private_tmp, "GLOO_SOCKET_IFNAME": "lo", **spec.env}
    if spec.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.gpus))
    return as_the_jobs_uid(spec, command), env


def closed_folder(path: Path) -> Path | None:
    """The first folder above `path` (itself included) other users may not pass through, or None."""
    for folder in [path, *path.parents]:
        if folder.exists() and not os.stat(folder).st_mode & 0o001:
            return folder
    return None


def passable(run_dir: str, job_folder: str) -> None:
    """uid mode: the folders from the job's folder down to the run's passable (o+x: entered by a path
    it knows, never listed) to the job's uid; everything the grader writes is private (umask 077)."""
    path = Path(run_dir).parent
    while job_folder and (path == Path(job_folder) or Path(job_folder) in path.parents):
        os.chmod(path, os.stat(path).st_mode | 0o001)
        path = path.parent


def prefix(spec_path: Path, python: str = sys.executable) -> list[str]:
    """The sandbox as a RunRequest.sandbox prefix: this file, run by the grader's interpreter, isolated."""
    from harness.run.run_dir import RUN_DIR_PLACEHOLDER

    return [python, "-I", str(HERE), str(spec_path), RUN_DIR_PLACEHOLDER, "--"]


def enter(argv: list[str]) -> None:
    """`sandbox.py SPEC RUN_DIR -- CMD...`: join the cgroup, hand the run directory to the job's uid,
    exec bwrap. Runs as the grader; nothing of the submission has started yet."""
    spec_path, run_dir, separator, *command = argv
    if separator != "--" or not command:
        sys.exit("usage: sandbox.py SPEC RUN_DIR -- COMMAND...")
    spec = Spec(**json.loads(Path(spec_path).read_text()))
    for procs in spec.cgroup_procs:
        Path(procs).write_text(str(os.getpid()))  # exec keeps the pid: bwrap and all it starts are in it
    if spec.mode == "uid":
        os.makedirs(os.path.join(run_dir, "tmp"), mode=0o700, exist_ok=True)
        passable(run_dir, spec.job_folder)
    for folder in (run_dir, os.path.join(run_dir, "logs"), *([os.path.join(run_dir, "tmp")] if spec.mode == "uid"
                                                              else [])):
        os.chown(folder, spec.uid, spec.uid)  # the launcher's logs and the observer's files are written there
    if spec.mode == "uid":
        argv, env = uid_argv(spec, run_dir, command)
        load_seccomp()  # what bwrap's --seccomp does, here by prctl
        os.chdir(run_dir)  # as bwrap's --chdir: the program starts in its own folder
        os.execvpe(argv[0], argv, env)
    tool = shutil.which("bwrap") or "bwrap"
    os.execv(tool, bwrap_argv(spec, run_dir, command, tool, seccomp_fd=_seccomp_fd()))


def _lock(uid: int) -> int | None:
    UID_LOCKS.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(UID_LOCKS / f"{uid}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        return None


def claim_uid() -> tuple[int, int]:
    """A uid no other job on this host runs as, and the lock that holds it (released when the fd is
    closed or the holder dies: a crashed grader frees its uids)."""
    for uid in range(FIRST_UID, FIRST_UID + UIDS):
        fd = _lock(uid)
        if fd is not None:
            return uid, fd
    raise RuntimeError(f"every sandbox uid from {FIRST_UID} to {FIRST_UID + UIDS - 1} is in use by a running job")


def end_processes_if_unclaimed(uid: int) -> None:
    """After a job was killed before its own sweep: end what is left of its uid, unless another job
    has claimed the uid since (then its processes are that job's)."""
    fd = _lock(uid)
    if fd is not None:
        try:
            end_processes_of(uid)
        finally:
            os.close(fd)


def processes_left(uid: int) -> list[int] | None:
    """The pids still running as a job's uid now that no job holds it; None where a job has claimed
    the uid since (its processes are that job's, not leftovers)."""
    fd = _lock(uid)
    if fd is None:
        return None
    try:
        return [p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
    finally:
        os.close(fd)


def end_processes_of(uid: int, within_s: float = 60.0) -> list[int]:
    """SIGKILL every process running as a job's uid until none is left; the pids still there after
    `within_s`. The uid is the job's alone, so this reaches what the run's own stop cannot: bwrap
    starts its command in a new session and pid namespace, and when bwrap dies first its namespace
    is torn down by the kernel a moment later, not at once."""
    deadline = time.monotonic() + within_s
    while True:
        left = []
        for proc in psutil.process_iter(["uids"]):
            if proc.info["uids"] is not None and proc.info["uids"].real == uid:
                left.append(proc.pid)
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


# --------------------------------------------------------------------------------- watching a job

def folder_usage(folder: Path, limits: Limits) -> tuple[Any, str | None]:
    """The job's folder measured (harness/files.tree_usage: by directory descriptors, no link followed),
    and the breach it is, if any: too large, too many entries, too deep, or not measurable at all
    (then the walk's error is the breach: a folder the grader cannot measure is not under its limit)."""
    from harness.files import tree_usage  # here: the entering program has only the standard library

    usage = tree_usage(folder, max_entries=limits.files, max_depth=limits.depth)
    if usage.bytes > limits.output_bytes:
        return usage, "output"
    if usage.error is None:
        return usage, None
    if usage.entries > limits.files:
        return usage, "files"
    return usage, "depth" if usage.error.startswith("folders nested") else "unmeasurable"


class Monitor(threading.Thread):
    """Watches a job's cgroup and folder while it runs; stops it at a breach and keeps the breach's name.
    Also notes every process of the job that ran `program` (its pid inside the sandbox too), so that
    the observation files can be checked against the processes that really ran it."""

    def __init__(self, cgroup: Cgroup | None, folder: Path, limits: Limits, program: str,
                 interval_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.cgroup, self.folder, self.limits, self.program = cgroup, folder, limits, program
        self.interval_s = interval_s
        self.breaches: list[str] = []
        self.program_pids: set[int] = set()  # pids as the sandbox numbered them (NSpid's last)
        self.peak_bytes = self.peak_entries = 0
        self.unmeasurable: str | None = None  # why the folder could not be measured, where it could not
        self._done = threading.Event()

    def _breach(self, what: str) -> None:
        text = self.limits.breach(what)
        if text not in self.breaches:
            self.breaches.append(text)
        if self.cgroup is not None:
            self.cgroup.kill()

    def _note_processes(self) -> None:
        for pid in self.cgroup.pids() if self.cgroup else []:
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                wrapper = os.path.basename(cmdline[0]) in (b"bwrap", b"setpriv", b"prlimit") or str(HERE).encode() \
                    in cmdline  # the sandbox's own processes carry the command line too
                if self.program.encode() in cmdline and not wrapper:
                    status = Path(f"/proc/{pid}/status").read_text()
                    nspid = re.search(r"^NSpid:\s*(.+)$", status, re.M)
                    self.program_pids.add(int(nspid.group(1).split()[-1]) if nspid else pid)

    def check(self) -> None:
        if self.cgroup is not None:
            if self.cgroup.process_limit_hits():
                self._breach("processes")
            if self.cgroup.oom_kills() and self.limits.breach("memory") not in self.breaches:
                self.breaches.append(self.limits.breach("memory"))  # the kernel has ended the process already
            self._note_processes()
        usage, breach = folder_usage(self.folder, self.limits)
        self.peak_bytes = max(self.peak_bytes, usage.bytes)
        self.peak_entries = max(self.peak_entries, usage.entries)
        if breach is not None:
            if breach == "unmeasurable":
                self.unmeasurable = usage.error
            self._breach(breach)

    def run(self) -> None:
        while not self._done.wait(self.interval_s):
            self.check()

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=5)
        self.check()


# What the sandbox refuses shows in the program's output as the system's own error; each named once.
DENIALS = (
    (re.compile(r"Network is unreachable|\[Errno 101\]|Cannot assign requested address"),
     "tried to reach the network beyond loopback (the sandbox has loopback only)"),
    (re.compile(r"Read-only file system|\[Errno 30\]"),
     "tried to write outside its own folder (everything else is read-only)"),
    (re.compile(r"Resource temporarily unavailable|can't start new thread|BlockingIOError: \[Errno 11\]"),
     "was refused a new process or thread (its process limit)"),
    (re.compile(r"Too many open files|\[Errno 24\]"), "ran out of open files (its open-file limit)"),
    (re.compile(r"File size limit exceeded|SIGXFSZ|\[Errno 27\]"), "wrote a file past its file-size limit"),
    (re.compile(r"No space left on device|\[Errno 28\]"), "filled its private /tmp or /dev/shm"),
    (re.compile(r"Operation not permitted|\[Errno 1\]\b"), "tried something only root may do"),
    (re.compile(r"Permission denied|\[Errno 13\]"), "was refused a file it may not touch (permission denied)"),
)


def denials(texts: list[str]) -> list[str]:
    """The sandbox's refusals found in a run's output, by name, in DENIALS order."""
    return [name for pattern, name in DENIALS if any(pattern.search(text) for text in texts)]


if __name__ == "__main__":
    enter(sys.argv[1:])
