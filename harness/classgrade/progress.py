"""A class grade's progress, as it happens: each submission (i of m) and each of its runs (k of n), with
an estimate of the time left.

The runs are told by each job over a pipe (job.progress_writer, pool.Pool.events). On a terminal: a
bar for the class and one for each running submission (its current run by name); elsewhere (a file,
a CI log) one plain line per finished run. Estimates are made of what was measured: the mean wall
time of the runs this grade finished so far, `at_once` submissions at a time; before any, the
profile's time budgets (GradePlan.budget_s). Each says which.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rich.progress import Progress, TaskID

from harness.console import bar_columns, console, time_left


@dataclass
class Running:
    """A submission being graded, as its job told it: runs finished of planned, the run now."""

    number: int  # its place in this grade: submission `number` of m
    done: int
    of: int
    task: TaskID | None


class ClassProgress:
    def __init__(self, submissions: int, runs_each: int, at_once: int, budget_each_s: float | None,
                 progress: Progress | None) -> None:
        self.submissions, self.runs_each, self.at_once = submissions, runs_each, at_once
        self.budget_each_s, self._progress = budget_each_s, progress
        self.finished = 0
        self.run_seconds: list[float] = []  # every run this grade finished, all submissions: the estimate's measure
        self.running: dict[str, Running] = {}
        self._started = 0
        self._class = progress.add_task("submissions", total=submissions, left=self.left()) if progress else None

    def left(self) -> str:
        """The class's time left: the runs still to come (those left of the running submissions, all of
        those waiting), at the measured mean, as many at once as the pool runs."""
        waiting = self.submissions - self.finished - len(self.running)
        runs_left = sum(max(0, job.of - job.done) for job in self.running.values()) + waiting * self.runs_each
        at_once = max(1, min(self.at_once, self.submissions - self.finished))
        budget = (self.budget_each_s * runs_left / self.runs_each / at_once
                  if self.budget_each_s and self.runs_each else None)
        return time_left(self.run_seconds, runs_left, at_once, budget)

    def started(self, student: str) -> str:
        """A submission's job started: its place in the grade, as "submission i of m"."""
        self._started += 1
        task = None
        if self._progress is not None:
            task = self._progress.add_task(f"{student}: starting", total=self.runs_each, left="")
        self.running[student] = Running(self._started, 0, self.runs_each, task)
        return f"submission {self._started} of {self.submissions}"

    def show(self, told: list[tuple[str, dict[str, Any]]]) -> None:
        """The runs' events the jobs told (Pool.events): the bars moved, or a line per finished run."""
        for student, event in told:
            job = self.running.get(student)
            if job is None:
                continue
            with contextlib.suppress(TypeError, ValueError):  # a job's event is shown, never trusted to be whole
                job.of = int(event.get("of", job.of))
                kind, label = event.get("event"), str(event.get("label", ""))
                if kind == "ended":
                    job.done = int(event.get("run", job.done + 1))
                    self.run_seconds.append(float(event["seconds"]))
                now = f"{student}: run {min(job.done + 1, job.of)} of {job.of}  {label}" if kind == "started" else None
                if self._progress is not None and job.task is not None:
                    self._progress.update(job.task, total=job.of, completed=job.done, description=now)
                    if self._class is not None:
                        self._progress.update(self._class, left=self.left())
                elif kind == "added" and event.get("why"):
                    console.print(f"{student}: {str(event['why'])[:300]}", markup=False)
                elif kind == "ended":
                    left = self.left()
                    console.print(f"{student}: run {job.done} of {job.of} ({label}): {event.get('outcome', '')}; "
                                  f"{self.finished} of {self.submissions} submission(s) done"
                                  f"{f', {left}' if left else ''}", markup=False)

    def ended(self, student: str) -> str:
        """A submission's job ended (its pages written): the class's count and estimate, in words."""
        job = self.running.pop(student, None)
        self.finished += 1
        if self._progress is not None:
            if job is not None and job.task is not None:
                self._progress.remove_task(job.task)
            if self._class is not None:
                self._progress.update(self._class, completed=self.finished, left=self.left())
        left = self.left()
        return f"{self.finished} of {self.submissions} submission(s) done{f', {left}' if left else ''}"


@contextlib.contextmanager
def class_progress(submissions: int, runs_each: int, at_once: int, budget_each_s: float | None
                   ) -> Iterator[ClassProgress]:
    """The class's progress shown: bars on a terminal (what is printed meanwhile goes above them),
    lines in a log."""
    if not console.is_terminal:
        yield ClassProgress(submissions, runs_each, at_once, budget_each_s, None)
        return
    with Progress(*bar_columns(), console=console, transient=True) as progress:
        yield ClassProgress(submissions, runs_each, at_once, budget_each_s, progress)
