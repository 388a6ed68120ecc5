"""uid mode: the grader's files made private to root, by the descriptor walk.

Without namespaces the job's uid sees the host's files as any other user does, so the class's folders
are closed to others (chmod o-rwx) before any job runs. A folder left by an earlier run may nest past
PATH_MAX or hold links: it is walked by directory descriptors (harness/files.walk), no link followed,
each entry changed through a descriptor of its own (never a path a program could swap for a link).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

from harness.files import TooDeep, walk

DEPTH = 1000  # levels (a descriptor each); below that the closed folders above keep other users out
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _change(name: str | Path, mode: Callable[[int], int], dir_fd: int | None = None) -> None:
    with contextlib.suppress(FileNotFoundError, OSError):
        fd = os.open(name, _OPEN, dir_fd=dir_fd)
        try:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode):
                os.fchmod(fd, mode(info.st_mode))
        finally:
            os.close(fd)


def change_tree(top: Path, mode: Callable[[int], int]) -> None:
    """`mode(old) -> new` applied to `top` and every folder and regular file below it; links, FIFOs,
    sockets and devices are passed over (never followed, never opened for reading)."""
    if not os.path.isdir(top) or os.path.islink(top):
        return
    _change(top, mode)
    with contextlib.suppress(OSError, TooDeep):
        for _, info, fd, base in walk(top, DEPTH):
            if stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode):
                _change(base, mode, dir_fd=fd)


def close_to_others(top: Path) -> None:
    """`top` and all below it closed to other users (o-rwx)."""
    change_tree(top, lambda mode: stat.S_IMODE(mode) & ~0o007)


def open_to_others(top: Path) -> None:
    """`top` and all below it readable by others (o+r), folders and programs passable (o+x)."""
    change_tree(top, lambda mode: stat.S_IMODE(mode) | 0o004 | (0o001 if stat.S_ISDIR(mode) or mode & 0o100 else 0))


def hand_back(folder: Path, job_uid: int) -> None:
    """uid mode, once no process of the job's uid is left: everything in the job's folder the uid owned
    is root's again, closed to others, without setuid/setgid bits. The next job runs as the same uid
    (claims go lowest first): it could otherwise read an earlier student's program, or replace its rank
    logs and delete its checkpoint before a regrade."""
    def own(name: str | Path, info: os.stat_result, dir_fd: int | None = None) -> None:
        if info.st_uid == job_uid or info.st_gid == job_uid:
            with contextlib.suppress(OSError):
                os.chown(name, 0, 0, dir_fd=dir_fd, follow_symlinks=False)

    if not os.path.isdir(folder) or os.path.islink(folder):
        return
    own(folder, os.lstat(folder))
    with contextlib.suppress(OSError, TooDeep):
        for _, info, fd, base in walk(folder, DEPTH):
            own(base, info, fd)
    change_tree(folder, lambda mode: stat.S_IMODE(mode) & ~0o6007)
