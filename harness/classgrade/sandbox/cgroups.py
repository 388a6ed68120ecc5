"""The job's cgroup: memory and process limits (v2 where its controllers are delegated, else v1)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

from harness.classgrade.sandbox.limits import Limits
from labs.common.host import MEMORY_EVENTS, PEAK_MEMORY, PIDS_EVENTS, cgroup_counter, cgroup_number, cpu_quota_settings

CGROUP_ROOT = Path("/sys/fs/cgroup")


def job_cgroup_name(job: dict[str, Any]) -> str:
    """The cgroup of a job's runs (job.py makes it, the pool removes it if the job could not)."""
    return f"{job['class_id']}-{job['id']}"



class Cgroup:
    """The job's memory and process limits: cgroup v2 where its controllers are delegated, else
    v1's memory and pids hierarchies; `None` from `create` where neither is writable. A CPU quota
    too where one is asked for (`distlab bench submission`'s box; a job has none)."""

    def __init__(self, dirs: dict[str, Path], version: int) -> None:
        self.dirs, self.version = dirs, version

    @classmethod
    def layout(cls, name: str, cpu: bool = False) -> Cgroup | None:
        """Where the cgroup of this name lives on this host (made or not): v2 where its memory and pids
        controllers (and cpu, with `cpu`) are there, else v1's hierarchies; None where neither is."""
        kinds = ("memory", "pids", *(("cpu",) if cpu else ()))
        unified = CGROUP_ROOT / "cgroup.controllers"
        with contextlib.suppress(OSError):
            if unified.is_file() and set(kinds) <= set(unified.read_text().split()):
                top = CGROUP_ROOT / "distlab"
                return cls(dict.fromkeys(kinds, top / name), 2)
        if all((CGROUP_ROOT / kind).is_dir() for kind in kinds):
            return cls({kind: CGROUP_ROOT / kind / "distlab" / name for kind in kinds}, 1)
        return None

    @classmethod
    def create(cls, name: str, limits: Limits, cpus: float | None = None) -> Cgroup | None:
        group = cls.layout(name, cpu=cpus is not None)
        try:
            if group is None:
                return None
            if group.version == 2:
                top = CGROUP_ROOT / "distlab"
                top.mkdir(exist_ok=True)
                with contextlib.suppress(OSError):
                    (top / "cgroup.subtree_control").write_text("+memory +pids" + (" +cpu" if cpus else ""))
            for path in set(group.dirs.values()):
                path.mkdir(parents=True, exist_ok=True)
            group.limit(limits)
            for file, value in cpu_quota_settings(cpus, group.version).items() if cpus is not None else ():
                group._write("cpu", file, value)
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

    def oom_kills(self) -> int:
        return cgroup_counter(self.dirs["memory"] / MEMORY_EVENTS[self.version], "oom_kill")

    def process_limit_hits(self) -> int:
        return cgroup_counter(self.dirs["pids"] / PIDS_EVENTS, "max")

    def peak_memory(self) -> int | None:
        return cgroup_number(self.dirs["memory"] / PEAK_MEMORY[self.version])

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
