"""The launcher's output and the ranks' logs: drained as bytes, kept byte for byte, shown safely.

Nothing a program prints is obeyed by a terminal (escape sequences are shown), and nothing it left
in logs/ is read unless it is a regular file of bounded size.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from harness.console import printable
from harness.files import NotARegularFile, read_below, read_regular_file, replace, write_bytes
from harness.on_ranks.observer.distlab_observer.fileformat import (
    PASS_LINE,
    PASS_LINES_KEPT,
    PASS_NOTES_FILE,
    parse_pass_line,
)
from harness.run.launchers import LAUNCHERS
from harness.run.request import RunRequest

LOG_TAIL_LINES = 20


LOG_SCAN_BYTES = 1 << 20  # what is read of a log's end to name a failure or a hang


def read_end(path: Path, limit: int = LOG_SCAN_BYTES) -> str:
    """The last `limit` bytes of a log, decoded for people; '' if it is not a regular file."""
    try:
        return read_regular_file(path, limit, tail=True).decode(errors="replace")
    except (OSError, ValueError):
        return ""


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """A log's last lines, for a terminal (escape sequences shown, not obeyed)."""
    return printable("\n".join(read_end(path, 64 << 10).splitlines()[-lines:]))




PASS_LINE_MARK = PASS_LINE.split(" ", 1)[0].encode()  # looked for in every line's bytes before any decoding


class StreamedPasses:
    """The observer's line for each loader pass (fileformat.PASS_LINE), as the launcher passed it on,
    kept in the harness's own memory: the files of the run folder are the program's to change while
    it runs. The first line for a rank, pid and pass stays (a line printed later never replaces it); at most
    PASS_LINES_KEPT, so a program printing lines without end fills no memory (its passes then have no
    line, and are not verified)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the pump adds while the harness may already write them out
        self._digests: dict[tuple[int, int, int], str] = {}

    def see(self, text: str) -> None:
        found = parse_pass_line(text)
        if found is None:
            return
        rank, pid, number, digest = found
        with self._lock:
            if len(self._digests) < PASS_LINES_KEPT:
                self._digests.setdefault((rank, pid, number), digest)

    def to_bytes(self) -> bytes:
        """One PASS_LINE each, in the order they arrived: the observe folder's PASS_NOTES_FILE."""
        with self._lock:
            kept = list(self._digests.items())
        return "".join(PASS_LINE.format(rank=rank, pid=pid, number=number, digest=digest) + "\n"
                       for (rank, pid, number), digest in kept).encode()


def keep_streamed_passes(observe_dir: Path, passes: StreamedPasses) -> str | None:
    """Once no process of the run is left: the pass lines the harness collected, as PASS_NOTES_FILE in
    the observe folder, by rename (a file or link the program left under that name is replaced, never
    followed). Nowhere where the observer wrote nothing (no folder) or a link stands for the folder
    (observations.load refuses it). An error to report, or None."""
    if observe_dir.is_symlink() or not observe_dir.is_dir():
        return None
    target = observe_dir / PASS_NOTES_FILE
    try:
        write_bytes(target, passes.to_bytes())
    except OSError as error:
        with contextlib.suppress(OSError):  # whatever the program left there is not the harness's
            target.unlink()
        return f"{PASS_NOTES_FILE}: {error.strerror or error}"
    return None


class OutputPump(threading.Thread):
    """Drain the launcher's output as bytes, whatever they are: written to the logs as received,
    decoded (with replacement) only to show them, and each line looked at for the observer's pass
    lines (`passes`). A sink that fails (a full disk) is dropped and the error kept; the pipe is
    always drained, so the launcher never blocks on it."""

    def __init__(self, stream: IO[bytes], sinks: list[IO[bytes]], echo: bool,
                 on_line: Callable[[str], None] | None) -> None:
        super().__init__(daemon=True)
        self.stream, self.sinks, self.echo, self.on_line = stream, sinks, echo, on_line
        self.errors: list[str] = []
        self.bytes = 0
        self.passes = StreamedPasses()

    def run(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = b""
        fd = self.stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            self.bytes += len(chunk)
            for sink in list(self.sinks):
                try:
                    sink.write(chunk)
                    sink.flush()
                except (OSError, ValueError) as error:
                    self.errors.append(f"{getattr(sink, 'name', 'log')}: output lost after {self.bytes - len(chunk)} "
                                       f"bytes ({getattr(error, 'strerror', None) or error})")
                    self.sinks.remove(sink)
            if self.echo:
                try:
                    sys.stdout.write(printable(decoder.decode(chunk)))
                    sys.stdout.flush()
                except (OSError, ValueError):  # nobody reads our output any more (a closed pipe)
                    self.echo = False
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if len(pending) > 1 << 16:  # a line without end: shown in pieces
                lines.append(pending)
                pending = b""
            for line in lines:
                if PASS_LINE_MARK in line:
                    self.passes.see(line.decode(errors="replace"))
                if self.on_line:
                    try:
                        self.on_line(printable(line.decode(errors="replace").rstrip("\r")))
                    except Exception as error:  # the caller's display failed; the output still flows
                        self.errors.append(f"on_line: {type(error).__name__}: {error}")
                        self.on_line = None


# Of each part of a rank's log, the tail kept: a lab's smoke run prints a few KiB, a full one under 1
# MiB; sparse files of 1 GiB each left in logs/ would otherwise become gigabytes written by root.
RANK_LOG_BYTES = 8 << 20


def gather_rank_logs(request: RunRequest, run_dir: Path) -> dict[int, Path]:
    """One rank.<r>.log per rank of the run, whatever layout the launcher used, each part's last
    RANK_LOG_BYTES as they are.

    Only regular files are read, each by the folders' descriptors (a FIFO or a link the program left in
    logs/, or a link where a folder was, is never followed: noted, not read); folders named as ranks the
    run does not have are passed over; each rank.<r>.log is written by rename.
    """
    gathered = {}
    found = LAUNCHERS[request.launcher].rank_logs(run_dir / "logs")
    for rank, parts in sorted((rank, parts) for rank, parts in found.items() if rank < max(request.world_size, 1)):
        target = run_dir / f"rank.{rank}.log"
        fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                for part in parts:
                    out.write(f"==> {part.relative_to(run_dir)} <==\n".encode())
                    try:
                        kept = read_below(run_dir, str(part.relative_to(run_dir)), RANK_LOG_BYTES, tail=True)
                    except (NotARegularFile, OSError) as refused:  # left there by the program: not read
                        out.write(f"(not read: {refused})\n".encode())
                        continue
                    if len(kept) == RANK_LOG_BYTES:
                        out.write(f"(its last {RANK_LOG_BYTES >> 20} MiB)\n".encode())
                    out.write(kept)
            replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        gathered[rank] = target
    return gathered
