"""Who else used our cores while a run ran: the CPU time the kernel counted on the CPUs this process may
use (/proc/stat, one line per CPU), less the CPU time of the run's own processes (getrusage of the
harness and of every process it reaped, which is every process of the run: the launcher reaps its
ranks, the harness the launcher, the rendezvous helper and any orphan, before the second reading).

Measured, not assumed: a grade cannot know that two other programs are busy on its cores, and
multi-threaded ranks beside them run 3 to 40 times slower (labs/TRAINING.md, the robustness sweep),
for reasons that are not the program's. The verdicts read the figure (verdict/verdicts.py,
speed_not_judged)."""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
# Of /proc/stat's columns (user nice system idle iowait irq softirq steal guest guest_nice), the
# ones a CPU spent running something: guest time is inside user already, and steal is time another
# virtual machine took from this one's CPU, so it is counted as someone else's.
BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class CpuClock:
    at: float  # time.monotonic()
    busy: float | None  # CPU-seconds spent on our CPUs by everything; None where /proc/stat is unreadable
    ours: float  # CPU-seconds of this process and its reaped descendants


def read_clock(stat: Path = PROC_STAT) -> CpuClock:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    return CpuClock(time.monotonic(), _busy_seconds(stat), ours)


def _busy_seconds(stat: Path) -> float | None:
    """The busy time of the CPUs in this process's affinity, in seconds."""
    cpus = {f"cpu{n}" for n in os.sched_getaffinity(0)} if hasattr(os, "sched_getaffinity") else None
    ticks = 0
    try:
        for line in stat.read_text().splitlines():
            name, _, values = line.partition(" ")
            if name.startswith("cpu") and name != "cpu" and (cpus is None or name in cpus):
                columns = values.split()
                ticks += sum(int(columns[i]) for i in BUSY_COLUMNS if i < len(columns))
    except (OSError, ValueError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def others_cores(start: CpuClock, end: CpuClock) -> float | None:
    """The cores that other processes kept busy on average between the two readings (0.0 on an
    otherwise idle machine, give or take the kernel's own work); None where it cannot be measured."""
    wall = end.at - start.at
    if start.busy is None or end.busy is None or wall <= 0:
        return None
    return max(0.0, ((end.busy - start.busy) - (end.ours - start.ours)) / wall)
