"""What one submission's runs may use, and each breach in words a student reads."""

from __future__ import annotations

from dataclasses import dataclass

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
