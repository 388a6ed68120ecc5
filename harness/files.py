"""Files a program could have touched: read them safely, write the harness's own by rename.

A program under test can replace anything in its run directory (it knows the path from
--record): a FIFO would block the harness, a device never end, a link lead it elsewhere, a
directory make a write fail. So a file the harness did not write is read only if it is a regular
file of bounded size, opened without blocking (O_NONBLOCK) and checked with fstat; and a file the
harness writes goes to a temporary file first and is renamed over whatever is there (a link is
replaced, never followed; a directory in the way is set aside, never deleted).

This module is the one reader of files a program could have touched (records, observations, weights,
logs): every reader goes through `read_regular_file` (or `read_text`), so no new reader can forget;
JSON such a file holds goes through `parse_json`/`read_json` (no NaN or infinity, nesting and numbers
bounded, a key given twice refused), a file below a program's folder through `read_below` (no link
followed on the way).
A folder a program writes is measured by `tree_usage`, through directory descriptors: no path is
too long to measure, no link is followed, and what cannot be measured says so.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

_KINDS = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]


class NotARegularFile(ValueError):
    """What was to be read is a FIFO, device, directory, link or too large: never read."""


def _open_regular(path: Path | str, follow: bool, dir_fd: int | None = None) -> int:
    """A descriptor of `path` if it is a regular file; never blocks (O_NONBLOCK: a FIFO opens at once)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
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


def read_regular_file(path: Path | str, limit: int, *, tail: bool = False, follow: bool = False,
                      dir_fd: int | None = None) -> bytes:
    """The bytes of a file the harness did not write itself, safely.

    Only a regular file is read (a FIFO would block, a device never end); with follow=False a
    symbolic link is refused too. Larger than `limit`: NotARegularFile, or with tail=True the last
    `limit` bytes. OSError for what the system refuses (no such file, permission).
    """
    fd = _open_regular(path, follow, dir_fd)
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


def _read_at_most(handle: IO[bytes], limit: int, path: Path | str) -> bytes:
    data = handle.read(limit + 1)  # the file may have grown since fstat
    if len(data) > limit:
        raise NotARegularFile(f"{path} is more than the {limit} bytes allowed")
    return data


def read_below(top: Path | str, relative: str, limit: int, *, tail: bool = False) -> bytes:
    """A file below `top` (a folder a program could change), each folder on the way opened without
    following a link (relative to its parent's descriptor: no path too long, no link where a folder
    was). NotARegularFile for a link, FIFO, device on the way or at the end; OSError otherwise."""
    parts = [part for part in str(relative).split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise NotARegularFile(f"{relative} is not a path below the folder")
    fd = os.open(top, _DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, _DIRECTORY, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise NotARegularFile(f"{relative}: {part} is not a folder (a link, never followed)") from None
                raise
            os.close(fd)
            fd = child
        return read_regular_file(parts[-1], limit, tail=tail, dir_fd=fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------ JSON a program could have written

JSON_DEPTH = 64  # nesting of objects and arrays; the observer's and the contract's deepest is under 8
JSON_NUMBER = 2.0 ** 63  # any number beyond a 64-bit integer's range is a mistake, not a measurement
JSON_INT_DIGITS = 20


class UntrustedJSON(ValueError):
    """JSON no consumer can use: not JSON, NaN or infinity, a number out of range, nested too deeply,
    a key given twice (which of the two a reader takes is the reader's, not the writer's, choice)."""


def _refuse_constant(name: str) -> Any:
    raise UntrustedJSON(f"{name} is not a number JSON allows (a measurement must be finite)")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > JSON_INT_DIGITS or abs(int(text)) > JSON_NUMBER:
        raise UntrustedJSON(f"the number {text[:24]}{'...' if len(text) > 24 else ''} is out of range "
                            f"(at most {JSON_NUMBER:.3g} in size)")
    return int(text)


def _bounded_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or abs(value) > JSON_NUMBER:
        raise UntrustedJSON(f"the number {text[:24]} is out of range (at most {JSON_NUMBER:.3g} in size)")
    return value


def _no_key_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        twice = next(key for i, (key, _) in enumerate(pairs) if key in dict(pairs[:i]))
        raise UntrustedJSON(f"the key {twice[:40]!r} is given twice in one object")
    return found


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")


def json_nesting(text: str, stop_past: int = JSON_DEPTH) -> int:
    """How deeply arrays and objects nest in JSON text (strings skipped), without recursion; counting
    stops past `stop_past`."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_STRING.sub('""', text)):
        if match.group() in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > stop_past:
                    break
        else:
            depth -= 1
    return deepest


def parse_json(text: str | bytes, max_depth: int = JSON_DEPTH) -> Any:
    """JSON a program could have written, with limits (UntrustedJSON names what is wrong): nesting at
    most `max_depth`, no NaN or infinity, numbers within JSON_NUMBER, no key twice in an object. The
    one parser of such JSON: a NaN in a timing ends one submission's grade, never the class's."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise UntrustedJSON(f"not UTF-8 text (byte {error.start})") from None
    depth = json_nesting(text, max_depth)
    if depth > max_depth:
        raise UntrustedJSON(f"nested {depth} levels deep, more than the {max_depth} allowed")
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_int=_bounded_int, parse_float=_bounded_float,
                          object_pairs_hook=_no_key_twice)
    except json.JSONDecodeError as error:
        raise UntrustedJSON(f"not valid JSON ({error.msg} at line {error.lineno})") from None
    except RecursionError:  # json_nesting bounds it; kept as a last net
        raise UntrustedJSON("nested too deeply") from None


def read_json(path: Path | str, limit: int, *, dir_fd: int | None = None, max_depth: int = JSON_DEPTH) -> Any:
    """A JSON file a program could have touched: `read_regular_file` (at most `limit` bytes, a regular
    file, no link) parsed by `parse_json`. NotARegularFile/UntrustedJSON (ValueErrors) or OSError."""
    return parse_json(read_regular_file(path, limit, dir_fd=dir_fd), max_depth)


@dataclass
class TreeUsage:
    """What a folder holds, counted without following a link: the disk it takes, its entries, how deep
    it nests, the entries that are not regular files or folders, and why it could not be counted whole."""

    bytes: int = 0  # st_blocks x 512 of every entry: what the folder costs the disk
    entries: int = 0  # files, folders, links: the inodes it takes
    depth: int = 0  # folders below the top, at the deepest
    special: list[tuple[str, str]] = field(default_factory=list)  # (path relative to the top, its kind)
    error: str | None = None  # the walk stopped here: the count is a floor, not the size


# Entries that vanish or change between the listing and the look while a program runs (a temporary
# file renamed into place, a folder replaced by a link): passed over, not an error.
_RACES = (errno.ENOENT, errno.ELOOP, errno.ENOTDIR)
_DIRECTORY = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class TooDeep(ValueError):
    """A folder nested deeper than a walk may go."""


def walk(top: Path, max_depth: int = 64) -> Iterator[tuple[str, os.stat_result, int, str]]:
    """Every entry below `top`, depth first: (its path from `top`, its lstat, the descriptor of the
    folder holding it, its name). By directory descriptors, one per level open at a time: no path
    grows past PATH_MAX, no link is followed. OSError for what the system refuses (but an entry that
    vanishes or changes while a program runs is passed over), TooDeep past `max_depth` levels."""
    root = os.open(top, _DIRECTORY)
    stack: list[tuple[int, Any, str]] = []
    try:
        stack.append((root, os.scandir(root), ""))
        while stack:
            fd, listing, where = stack[-1]
            entry = next(listing, None)
            if entry is None:
                listing.close()
                os.close(fd)
                stack.pop()
                continue
            name = f"{where}{entry.name}"
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError as error:
                if error.errno in _RACES:
                    continue
                raise
            yield name, info, fd, entry.name
            if stat.S_ISDIR(info.st_mode):
                if len(stack) >= max_depth:
                    raise TooDeep(f"folders nested more than {max_depth} deep ({name[:200]}...)")
                try:
                    child = os.open(entry.name, _DIRECTORY, dir_fd=fd)
                except OSError as error:
                    if error.errno in _RACES:
                        continue
                    raise
                stack.append((child, os.scandir(child), f"{name}/"))
    finally:
        for fd, listing, _ in stack:
            listing.close()
            os.close(fd)


def special_kind(info: os.stat_result) -> str | None:
    """What an entry is when it is neither a regular file nor a folder ("a symbolic link", "a FIFO"...)."""
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link"
    return next((name for test, name in _KINDS[1:] if test(info.st_mode)), None)


def tree_usage(top: Path, max_entries: int | None = None, max_depth: int = 64) -> TreeUsage:
    """`top` measured by `walk`. Stops, with `error` set, past `max_entries` entries or `max_depth`
    levels, or at an error the system gives."""
    usage = TreeUsage()
    try:
        for name, info, _, _ in walk(top, max_depth):
            usage.entries += 1
            usage.bytes += info.st_blocks * 512
            usage.depth = max(usage.depth, name.count("/"))
            if max_entries is not None and usage.entries > max_entries:
                usage.error = f"more than {max_entries} entries"
                break
            kind = special_kind(info)
            if kind is not None:
                usage.special.append((name, kind))
    except TooDeep as error:
        usage.error = str(error)
    except (OSError, RecursionError) as error:
        usage.error = f"could not be measured whole ({type(error).__name__}: {error})"
    return usage


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
