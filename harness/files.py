"""Files a program could have touched: read them safely, write the harness's own by rename.

A program under test can replace anything in its run directory (it knows the path from
--record): a FIFO would block the harness, a device never end, a link lead it elsewhere, a
directory make a write fail. So a file the harness did not write is read only if it is a regular
file of bounded size, opened without blocking (O_NONBLOCK) and checked with fstat; and a file the
harness writes goes to a temporary file first and is renamed over whatever is there (a link is
replaced, never followed; a directory in the way is set aside, never deleted).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import IO, Any

_KINDS = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]


class NotARegularFile(ValueError):
    """What was to be read is a FIFO, device, directory, link or too large: never read."""


def _open_regular(path: Path, follow: bool) -> int:
    """A descriptor of `path` if it is a regular file; never blocks (O_NONBLOCK: a FIFO opens at once)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except OSError as error:
        if error.errno == errno.ELOOP and not follow:  # the last part is a symbolic link
            raise NotARegularFile(f"{path} is a symbolic link, not a regular file") from None
        if error.errno == errno.ENXIO:  # a socket
            raise NotARegularFile(f"{path} is a socket, not a regular file") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
        raise NotARegularFile(f"{path} is {kind}, not a regular file")
    return fd


def read_regular_file(path: Path, limit: int, *, tail: bool = False, follow: bool = False) -> bytes:
    """The bytes of a file the harness did not write itself, safely.

    Only a regular file is read (a FIFO would block, a device never end); with follow=False a
    symbolic link is refused too. Larger than `limit`: NotARegularFile, or with tail=True the last
    `limit` bytes. OSError for what the system refuses (no such file, permission).
    """
    fd = _open_regular(Path(path), follow)
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            if not tail:
                raise NotARegularFile(f"{path} is {size} bytes, more than the {limit} allowed")
            handle.seek(size - limit)
        return handle.read(limit + 1)[:limit] if tail else _read_at_most(handle, limit, path)


def read_text(path: Path, limit: int, *, tail: bool = False) -> str:
    """A file the harness did not write, as text (undecodable bytes replaced): at most `limit` bytes,
    the last ones with tail=True; "" where it is missing, unreadable or not a regular file."""
    try:
        return read_regular_file(path, limit, tail=tail).decode(errors="replace")
    except (OSError, ValueError):
        return ""


def _read_at_most(handle: IO[bytes], limit: int, path: Path) -> bytes:
    data = handle.read(limit + 1)  # the file may have grown since fstat
    if len(data) > limit:
        raise NotARegularFile(f"{path} is more than the {limit} bytes allowed")
    return data


def copy_regular_file(path: Path, out: IO[bytes]) -> int:
    """Append a regular file's bytes to `out` as they are, in pieces; NotARegularFile otherwise."""
    fd = _open_regular(Path(path), follow=False)
    copied = 0
    with os.fdopen(fd, "rb") as handle:
        while chunk := handle.read(1 << 20):
            out.write(chunk)
            copied += len(chunk)
    return copied


def write_bytes(path: Path, data: bytes) -> None:
    """Write a harness file by rename: a link or FIFO the program planted there is replaced, never
    followed; a directory in the way is set aside. Readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_IN_THE_WAY = (errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.ENOTEMPTY)  # a directory where a file goes


def replace(tmp: str | Path, path: Path) -> None:
    try:
        os.replace(tmp, path)
    except OSError as error:
        if error.errno not in _IN_THE_WAY:
            raise
        set_aside(path)
        os.replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    """The harness's one JSON writer: indented, one trailing newline, by rename (write_bytes)."""
    write_bytes(path, (json.dumps(data, indent=2) + "\n").encode())


def set_aside(path: Path, name: str | None = None) -> Path | None:
    """Move what is at `path` out of the way (kept for inspection, never deleted); its new path."""
    base = name or f"{path.stem}.corrupt{path.suffix}"
    for attempt in range(1, 100):
        target = path.with_name(base if attempt == 1 else f"{Path(base).stem}.{attempt}{Path(base).suffix}")
        if os.path.lexists(target):
            continue
        with contextlib.suppress(OSError):
            os.rename(path, target)
            return target
    return None
