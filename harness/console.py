"""Where the harness talks to people: one console, and progress that suits where output goes.

On a terminal a run sequence shows a bar with done/total, elapsed time and ETA, and the current
run's last line; in a file or a CI log (no terminal, no redraws) it prints one plain line per
finished run instead, so `distlab grade > log` shows progress as it happens.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(highlight=False, soft_wrap=True)


class RunProgress:
    """Told when a run starts, prints a line of output, and ends."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.finished, self._progress = total, 0, progress
        self._task = progress.add_task("starting", total=total) if progress else None
        self._label = ""

    def add(self, runs: int) -> None:
        """Runs that were not planned at the start (a speed row's extra pairs)."""
        self.total += runs
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, total=self.total)

    def started(self, label: str) -> None:
        self._label = label
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=label)

    def line(self, text: str) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=f"{self._label}  {text.strip()[:60]}")

    def ended(self, outcome: str) -> None:
        self.finished += 1
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1)
        else:  # a log: one line per run, as text (outcomes quote the lab's output)
            console.print(f"[{self.finished}/{self.total}] {self._label}: {outcome}", markup=False)


@contextmanager
def run_progress(total: int) -> Iterator[RunProgress]:
    if not console.is_terminal:
        yield RunProgress(total, None)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        yield RunProgress(total, progress)


def fmt(value: float | None, scale: float = 1.0, spec: str = ".4g") -> str:
    """A number for a table cell; "-" where there is none."""
    return "-" if value is None else format(value * scale, spec)


def print_json(summary: dict) -> None:
    """--json: the command's summary on stdout, one JSON document (people's output goes to stderr then)."""
    sys.stdout.write(json.dumps(summary, indent=2, default=str) + "\n")


# Control characters, and the bidirectional controls that reorder what a reader sees (a right-to-left
# override makes "exe.txt" read as "txt.exe": Trojan Source, CVE-2021-42574).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """Text safe for a terminal (or a page): control characters (escape sequences) and bidirectional
    controls shown, not obeyed."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}",
                        text)
