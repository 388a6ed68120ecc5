"""Who else used our cores while a run ran: the CPU time the kernel counted on the CPUs this process may
use (/proc/stat, one line per CPU), less the CPU time of the run's own processes (getrusage of the
harness and of every process it reaped, which is every process of the run: the launcher reaps its
ranks, the harness the launcher, the rendezvous helper and any orphan, before the second reading).

Measured, not assumed: a grade cannot know that two other programs are busy on its cores, and
multi-threaded ranks beside them run 3 to 40 times slower (labs/TRAINING.md, the robustness sweep),
for reasons that are not the program's. The verdicts read the figure (verdict/speed.py,
speed_not_judged). Beside it, what the kernel tells as cheaply: the CPU time a hypervisor took from our
CPUs (steal, a busy host's other virtual machines) and the run queue (tasks runnable on the whole host,
/proc/loadavg's fourth field, sampled while the run ran: the run's own ranks included)."""

from __future__ import annotations

import contextlib
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC_STAT = Path("/proc/stat")
PROC_LOADAVG = Path("/proc/loadavg")
STEAL_COLUMN = 7
# Of /proc/stat's columns (user nice system idle iowait irq softirq steal guest guest_nice), the
# ones a CPU spent running something: guest time is inside user already, and steal is time another
# virtual machine took from this one's CPU, so it is counted as someone else's.
BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
# Other processes' load a run may have beside it and still count as having its cores: half a core.
# Less than one CPU-bound program takes beside it (the scheduler shares the cores fairly: beside 2
# threads on 2 cores it gets 2/3 of a core, two such programs a core between them), more than the
# kernel's own work and an idle shell or editor.
OTHERS_TOLERANCE = 0.5


@dataclass(frozen=True)
class CpuClock:
    at: float  # time.monotonic()
    busy: float | None  # CPU-seconds spent on our CPUs by everything; None where /proc/stat is unreadable
    ours: float  # CPU-seconds of this process and its reaped descendants
    steal: float | None = None  # CPU-seconds a hypervisor took from our CPUs (inside busy too)


def read_clock(stat: Path = PROC_STAT) -> CpuClock:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    busy, steal = _busy_seconds(stat)
    return CpuClock(time.monotonic(), busy, ours, steal)


def _busy_seconds(stat: Path) -> tuple[float | None, float | None]:
    """The busy and the stolen time of the CPUs in this process's affinity, in seconds."""
    cpus = {f"cpu{n}" for n in os.sched_getaffinity(0)} if hasattr(os, "sched_getaffinity") else None
    ticks = stolen = 0
    try:
        for line in stat.read_text().splitlines():
            name, _, values = line.partition(" ")
            if name.startswith("cpu") and name != "cpu" and (cpus is None or name in cpus):
                columns = values.split()
                ticks += sum(int(columns[i]) for i in BUSY_COLUMNS if i < len(columns))
                stolen += int(columns[STEAL_COLUMN]) if len(columns) > STEAL_COLUMN else 0
    except (OSError, ValueError):
        return None, None
    hertz = os.sysconf("SC_CLK_TCK")
    return ticks / hertz, stolen / hertz


def others_cores(start: CpuClock, end: CpuClock) -> float | None:
    """The cores that other processes kept busy on average between the two readings (0.0 on an
    otherwise idle machine, give or take the kernel's own work); None where it cannot be measured."""
    wall = end.at - start.at
    if start.busy is None or end.busy is None or wall <= 0:
        return None
    return max(0.0, ((end.busy - start.busy) - (end.ours - start.ours)) / wall)


def steal_cores(start: CpuClock, end: CpuClock) -> float | None:
    """The cores a hypervisor took from ours on average between the two readings (0.0 on bare metal)."""
    wall = end.at - start.at
    if start.steal is None or end.steal is None or wall <= 0:
        return None
    return max(0.0, (end.steal - start.steal) / wall)


class RunQueue:
    """The host's runnable tasks, sampled while a run runs (the waiting loop's every turn, 0.2 s):
    more runnable tasks than cores means someone waits, whoever they are."""

    def __init__(self, loadavg: Path = PROC_LOADAVG) -> None:
        self.loadavg = loadavg
        self.samples: list[int] = []

    def sample(self) -> None:
        with contextlib.suppress(OSError, ValueError, IndexError):  # "0.52 0.58 0.59 3/912 12345": runnable/all
            self.samples.append(int(self.loadavg.read_text().split()[3].split("/")[0]))

    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


def _count(value: Any) -> Any:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def contended(cpu: dict[str, Any]) -> bool:
    """Whether, in a run's cpu account (run/accounting.py, cpu_account), the other processes and the
    run's own ranks x threads wanted more than our CPUs by over OTHERS_TOLERANCE (a quota's share of
    a big host beside busy tenants on other CPUs does not count), or a hypervisor stole that much:
    the run waited for cores, whatever its program did. The speed verdicts (verdict/speed.py,
    interference) and `distlab run`'s summary read it."""
    others, steal = _count(cpu.get("others_cores")), _count(cpu.get("steal_cores")) or 0.0
    cores = _count(cpu.get("cores"))
    cpus = _count(cpu.get("cpus")) or cores
    wanted = (_count(cpu.get("ranks_here")) or cores or 1) * (_count(cpu.get("threads_per_rank")) or 1)
    if others is not None and cpus and others + min(wanted, cores or wanted) > cpus + OTHERS_TOLERANCE:
        return True
    return bool(steal > OTHERS_TOLERANCE)
