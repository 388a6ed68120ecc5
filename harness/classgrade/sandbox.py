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
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

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

    def breach(self, what: str) -> str:
        return {"memory": f"used more than {size_text(self.memory_bytes)} of memory",
                "processes": f"started more than {self.processes} processes",
                "output": f"wrote more than {size_text(self.output_bytes)} into its folder",
                "open_files": f"opened more than {self.open_files} files at once",
                "file_size": f"wrote a file larger than {size_text(self.output_bytes)}",
                "wall": f"ran past its wall time{f' of {self.wall_s:g} s' if self.wall_s else ''}"}[what]


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


# ------------------------------------------------------------------------------------------ cgroups

class Cgroup:
    """The job's memory and process limits: cgroup v2 where its controllers are delegated, else
    v1's memory and pids hierarchies; `None` from `create` where neither is writable."""

    def __init__(self, dirs: dict[str, Path], version: int) -> None:
        self.dirs, self.version = dirs, version

    @classmethod
    def create(cls, name: str, limits: Limits) -> Cgroup | None:
        unified = CGROUP_ROOT / "cgroup.controllers"
        try:
            if unified.is_file() and {"memory", "pids"} <= set(unified.read_text().split()):
                top = CGROUP_ROOT / "distlab"
                top.mkdir(exist_ok=True)
                with contextlib.suppress(OSError):
                    (top / "cgroup.subtree_control").write_text("+memory +pids")
                group = cls({"memory": top / name, "pids": top / name}, 2)
            elif (CGROUP_ROOT / "memory").is_dir() and (CGROUP_ROOT / "pids").is_dir():
                group = cls({kind: CGROUP_ROOT / kind / "distlab" / name for kind in ("memory", "pids")}, 1)
            else:
                return None
            for path in set(group.dirs.values()):
                path.mkdir(parents=True, exist_ok=True)
            group.limit(limits)
            return group
        except OSError:
            return None

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

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=1))
        return path


def base_read_only(python: str = sys.executable) -> list[str]:
    """What every run needs to read: the system, the interpreter the environment was made from, the repository."""
    from harness.catalog import REPO  # imported here: the entering program has only the standard library

    prefixes = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    interpreter = Path(os.path.realpath(python)).parent.parent  # the venv's python: a link into its base prefix
    return sorted({"/usr", "/etc", str(REPO), str(interpreter), *prefixes})


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


def bwrap_argv(spec: Spec, run_dir: str, command: list[str], tool: str = "bwrap") -> list[str]:
    limits = Limits(**spec.limits)
    argv = [tool, "--die-with-parent", "--new-session", "--unshare-net", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
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
    argv += ["--", "setpriv", f"--reuid={spec.uid}", f"--regid={spec.uid}", "--clear-groups", "--no-new-privs",
             "--inh-caps=-all", "--bounding-set=-all",
             "prlimit", f"--nofile={limits.open_files}", f"--nproc={limits.processes}",
             f"--fsize={limits.output_bytes}", "--core=0", "--", *command]
    return argv


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
    for folder in (run_dir, os.path.join(run_dir, "logs")):
        os.chown(folder, spec.uid, spec.uid)  # the launcher's logs and the observer's files are written there
    tool = shutil.which("bwrap") or "bwrap"
    os.execv(tool, bwrap_argv(spec, run_dir, command, tool))


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

def folder_bytes(folder: Path) -> int:
    total = 0
    for root, dirs, files in os.walk(folder, onerror=lambda _: None):
        for name in files + dirs:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


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
        self.peak_bytes = 0
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
        used = folder_bytes(self.folder)
        self.peak_bytes = max(self.peak_bytes, used)
        if used > self.limits.output_bytes:
            self._breach("output")

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
