"""What a grade keeps on disk once its runs are judged: no model states, each named by its digest.

A run of a data-parallel lab leaves model states behind: the observer's copy of each rank's final
weights (observe/final_weights*.pt, which the harness evaluates itself: observe/accuracy.py), the
program's own checkpoints (which the evaluator loads, observed:checkpoint_loads, and which the resume
cell's second attempt resumes from, grading/cells.py). ResNet-18's state is 45 MB, twice that with
SGD's momentum: one cpu-smoke grade of a class's submission left 24 such files, 1.3 GB. Each is read
only while its run is judged. What is judged again later reads none of them: a class's --regrade
judges the job's observations.json (the samples, the evaluator's measurements and the checkpoint
checks in them) and the failed runs' logs; a grade's report is written from the same samples.

So once a grade's samples are stored, every file its runs wrote with a weights suffix (`WEIGHTS`) is
removed, and named in weights.json beside them with its size and sha256: the digest of what was
judged (each rank's final state's own digest stays in observe/rank.<r>.json). `--keep` keeps them.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness import files
from harness.console import printable

# Model states and checkpoints as torch, safetensors, torch.distributed.checkpoint and Lightning name them.
WEIGHTS = (".pt", ".pth", ".bin", ".safetensors", ".distcp", ".ckpt")
MANIFEST = "weights.json"  # beside the runs: what was removed, by path, size and sha256
MAX_DEPTH = 64  # of folders below a run's: a program's deeper ones are left as they are (and said)
CHUNK = 1 << 20


def _sha256(name: str, dir_fd: int) -> str | None:
    """A regular file's sha256, opened without following a link or blocking on a FIFO put in its place."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        digest = hashlib.sha256()
        while chunk := os.read(fd, CHUNK):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


def release_weights(run_dirs: Iterable[Path], folder: Path) -> dict[str, Any]:
    """Every weights file below `run_dirs` removed (regular files only: a link is never followed, nor
    removed in place of its target), each listed in `folder`/weights.json with its size and sha256.
    What could not be walked (a folder nested past MAX_DEPTH, an error) is said there, never raised:
    a grade is never lost for its disk."""
    removed: list[dict[str, Any]] = []
    problems: list[str] = []
    for run_dir in dict.fromkeys(Path(d) for d in run_dirs):  # in order, each once
        if run_dir.is_symlink() or not run_dir.is_dir():
            continue
        shown = run_dir.relative_to(folder) if run_dir.is_relative_to(folder) else run_dir
        try:
            for name, info, dir_fd, base in files.walk(run_dir, MAX_DEPTH):
                if not stat.S_ISREG(info.st_mode) or not base.endswith(WEIGHTS):
                    continue
                digest = _sha256(base, dir_fd)
                if digest is None:
                    continue  # replaced by something else while it was read: not a file to remove
                os.unlink(base, dir_fd=dir_fd)
                removed.append({"path": printable(str(shown / name)), "bytes": info.st_size, "sha256": digest})
        except (OSError, files.TooDeep) as error:
            problems.append(f"{printable(str(shown))}: not walked whole ({type(error).__name__}: {error})"[:500])
    manifest = {"removed": removed, "bytes": sum(entry["bytes"] for entry in removed), "problems": problems,
                "why": "weights and checkpoints are read only while a run is judged (harness/grading/disk.py); "
                       "--keep keeps them"}
    files.write_json(folder / MANIFEST, manifest)
    return manifest
