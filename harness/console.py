"""Where the harness talks to people: one console, and progress that suits where output goes.

On a terminal a run sequence shows a bar with done/total, elapsed time and an estimate of the time
left, and the current run's last line; in a file or a CI log (no terminal, no redraws) it prints one
plain line per finished run instead, so `distlab grade > log` shows progress as it happens. Every
estimate is made of what was measured (the runs done so far) or, before any, of the profile's time
budgets, and says which.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn

console = Console(highlight=False, soft_wrap=True)


def duration(seconds: float) -> str:
    """A span of time as people read it: "40 s", "7 min 5 s", "1 h 12 min"."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s" if seconds < 600 else f"{round(seconds / 60)} min"
    return f"{seconds // 3600} h {round(seconds % 3600 / 60)} min"


def time_left(run_seconds: list[float], runs_left: int, at_once: int = 1, budget_s: float | None = None) -> str:
    """What is left, estimated from what was measured, saying from what: the mean wall time of the runs
    done so far (`run_seconds`), `at_once` at a time; before any is done, the profile's time budgets
    (`budget_s`, for all that is left); "" where neither is known."""
    if runs_left <= 0:
        return ""
    if run_seconds:
        mean = sum(run_seconds) / len(run_seconds)
        return (f"about {duration(runs_left * mean / max(1, at_once))} left ({runs_left} run(s) at {mean:.0f} s, "
                f"the mean of the {len(run_seconds)} done{f', {at_once} at once' if at_once > 1 else ''})")
    if budget_s:
        return f"about {duration(budget_s)} left by the profile's time budgets (no run done yet)"
    return ""


class RunProgress:
    """Told when a run starts, prints a line of output, and ends; `on_event` (if given) is told each
    of those as data (a class grade's job passes them to the grader, which shows them)."""

    def __init__(self, total: int, progress: Progress | None, budget_s: float | None = None,
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.total, self.finished, self._progress = total, 0, progress
        self.budget_s, self._on_event = budget_s, on_event
        self.run_seconds: list[float] = []  # each finished run's wall time: what the estimate is made of
        self._task = progress.add_task("starting", total=total, left=self.left()) if progress else None
        self._label, self._started = "", time.monotonic()

    def left(self) -> str:
        """The estimate of what is left: the runs done so far, else the share of the profile's budgets."""
        budget = self.budget_s * (self.total - self.finished) / self.total if self.budget_s and self.total else None
        return time_left(self.run_seconds, self.total - self.finished, budget_s=budget)

    def _tell(self, event: str, **fields: Any) -> None:
        if self._on_event is not None:
            self._on_event({"event": event, "run": self.finished + (event == "started"), "of": self.total,
                            **fields})

    def add(self, runs: int, why: str = "") -> None:
        """Runs that were not planned at the start (a speed row's extra pairs), or planned runs not
        started after all (negative: a cell that needs no more, `why` says so on the screen or log)."""
        self.total += runs
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, total=self.total, left=self.left())
        if why:
            console.print(why, markup=False)
        self._tell("added", **({"why": why} if why else {}))

    def started(self, label: str) -> None:
        self._label, self._started = label, time.monotonic()
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=label)
        self._tell("started", label=label)

    def line(self, text: str) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=f"{self._label}  {text.strip()[:60]}")

    def ended(self, outcome: str) -> None:
        self.finished += 1
        self.run_seconds.append(time.monotonic() - self._started)
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1, left=self.left())
        else:  # a log: one line per run, as text (outcomes quote the lab's output)
            left = self.left()
            console.print(f"[{self.finished}/{self.total}] {self._label}: {outcome}{f'; {left}' if left else ''}",
                          markup=False)
        self._tell("ended", label=self._label, outcome=outcome, seconds=self.run_seconds[-1])


@contextmanager
def run_progress(total: int, budget_s: float | None = None,
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> Iterator[RunProgress]:
    """A sequence of `total` runs shown: a bar on a terminal, a line per finished run elsewhere."""
    if not console.is_terminal:
        yield RunProgress(total, None, budget_s, on_event)
        return
    with Progress(*bar_columns(), console=console, transient=True) as progress:
        yield RunProgress(total, progress, budget_s, on_event)


def bar_columns() -> tuple[ProgressColumn, ...]:
    """A progress bar's columns: what runs, the bar, done of total, time so far, the estimate (a task's
    `left` field: time_left's words, which say what it was made of)."""
    return (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[left]}"))


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
