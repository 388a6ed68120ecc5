"""A run's directory: claimed once (never reused, never overwritten), its names, and the space kept in
it so that record.json and run.json fit on a full disk."""

from __future__ import annotations

import datetime as dt
import errno
import os
import re
from pathlib import Path

from harness.run.errors import RunRefused

OBSERVE_DIR = "observe"  # in the run directory: one rank.<r>.json per rank, rank 0's final_weights.pt


RUN_DIR_PLACEHOLDER = "{run_dir}"  # in a lab argument: this run's directory (e.g. --checkpoint {run_dir}/ck.pt)


RESERVE_BYTES = 256 << 10  # set aside at the start, so record.json and run.json fit on a full disk


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")  # lab, launcher, backend: parts of paths


def check_safe_name(what: str, name: object) -> None:
    """RunRefused unless `name` is one plain name (never '..' or a path): it becomes a folder's name."""
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name):
        raise RunRefused(f"{what} name {name!r} may hold only letters, digits, '.', '_', '+' and '-' "
                         "(it names folders)")


def new_run_dir(results_root: Path, lab: str, world_size: int, launcher: str) -> Path:
    """A directory no earlier run used: mkdir without exist_ok is the atomic claim.

    `lab` and `launcher` become path parts, so each must be one plain name (never '..' or a path).
    """
    for what, name in (("lab", lab), ("launcher", launcher)):
        if not SAFE_NAME.fullmatch(name):
            raise RunRefused(f"{what} name {name!r} may hold only letters, digits, '.', '_', '+' and '-' "
                             "(it names a folder under the results root)")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = Path(results_root) / lab / f"{stamp}-ws{world_size}-{launcher}"
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, 1000):
            candidate = base if attempt == 1 else base.with_name(f"{base.name}-{attempt}")
            try:
                candidate.mkdir()
                return candidate
            except FileExistsError:
                continue
    except OSError as error:
        raise RunRefused(folder_problem(Path(results_root), error)) from None
    raise RunRefused(f"could not claim a run directory under {base.parent}")


def claim_results_root(results_root: Path) -> None:
    """The results root made, with the folders above it, or RunRefused naming the fix: the one check of
    a --results folder, for every command that writes under one (a path below a regular file stops
    even root)."""
    try:
        Path(results_root).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RunRefused(folder_problem(Path(results_root), error)) from None


def folder_problem(root: Path, error: OSError) -> str:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"results folder {root} is full ({error.strerror}); free some space or choose another --results"
    return (f"results folder {root} is not writable ({error.strerror or error}); choose another --results")


def reserve_space(path: Path) -> None:
    with path.open("wb") as handle:
        try:
            os.posix_fallocate(handle.fileno(), 0, RESERVE_BYTES)
        except OSError as error:
            if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate
                raise
            handle.write(b"\0" * RESERVE_BYTES)
            handle.flush()
            os.fsync(handle.fileno())
