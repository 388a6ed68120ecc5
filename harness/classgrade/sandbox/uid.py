"""A uid of the job's own: claimed for the job, its rlimits, every process of it ended."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil

from harness.classgrade.sandbox.limits import Limits
from harness.classgrade.sandbox.spec import Spec

FIRST_UID = 20000  # each job runs as a uid/gid of its own from here up, claimed for as long as it runs
UIDS = 1000
# Every grader on the host claims its jobs' uids here (a lock per uid, held by the job's process):
# two class grades at once, a test suite's workers among them, never share one, and ending one
# job's processes by uid never reaches another's.
UID_LOCKS = Path("/run/lock" if os.path.isdir("/run/lock") else "/tmp") / "distlab-sandbox-uids"


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


# Folders every uid may write (sticky, world-writable): a job's files there count against no limit of
# its folder and outlive it, where the next job of the uid would read them (1 GiB in /var/tmp, 64 MiB in
# /dev/shm were). The job's own TMPDIR is in its run folder (uid_argv); what it leaves here anyway is
# charged to its output while it runs (monitor.py) and removed at its end.
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
SCRATCH_DEPTH = 2  # world-writable folders inside them (/tmp/.X11-unix) are looked in too


def scratch_left(job_uid: int, tops: tuple[str, ...] = SCRATCH) -> list[tuple[str, int]]:
    """What the uid owns in the shared scratch folders (top-level entries, and those of world-writable
    folders in them), with the disk each takes (a folder's whole tree, by descriptors)."""
    from harness.files import tree_usage  # here: the entering program has only the standard library

    found: list[tuple[str, int]] = []
    folders = [(top, 1) for top in tops]
    while folders:
        folder, level = folders.pop()
        with contextlib.suppress(OSError), os.scandir(folder) as listing:
            for entry in listing:
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    if info.st_uid == job_uid:
                        size = tree_usage(Path(entry.path)).bytes + info.st_blocks * 512 \
                            if stat.S_ISDIR(info.st_mode) else info.st_blocks * 512
                        found.append((entry.path, size))
                    elif stat.S_ISDIR(info.st_mode) and info.st_mode & 0o002 and level < SCRATCH_DEPTH:
                        folders.append((entry.path, level + 1))
    return found


def remove_scratch(job_uid: int, tops: tuple[str, ...] = SCRATCH) -> list[tuple[str, int]]:
    """Every entry of the uid's in the scratch folders removed (a folder by shutil.rmtree, which walks
    by descriptors and follows no link); what was removed and its size."""
    left = scratch_left(job_uid, tops)
    for path, _ in left:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return left
