"""A grade's plan: which cells (a profile row at a world size) run, how often, against what.

Built from typed parts, never from a command line: a profile, the rows asked for, the world sizes,
the repeats, the programs graded in place of the course's labs (row or lab -> path), a results
folder, and the host's GPUs. `plan_grade` checks every run before the first one starts (a bad cell
found after an hour helps nobody); with `check_runs=False` it checks nothing of this host, for
judging runs that are stored already (a regrade on another machine).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.catalog import DEFAULT_LAUNCHER, LABS, find_lab
from harness.run.request import RunRequest, build_request
from harness.usage import UsageError
from harness.verdict.expectations import Profile
from harness.verdict.profiles import against_course_lab
from harness.verdict.references import PROGRAM_PAIRS, REFERENCES, Reference, course_lab

Cell = tuple[str, int]  # a profile row and a world size


@dataclass
class GradePlan:
    profile: Profile
    labs: list[str]
    world_sizes: list[int] | None  # None: each lab's own list from the profile
    repeats: int
    programs: dict[str, Path]
    results_root: Path
    timeout_s: float | None
    gpus: int | None = None  # GPUs visible: a GPU profile grades the world sizes they can hold
    # Put before every launcher (RunRequest.sandbox): grade-class runs each job's runs in its sandbox.
    sandbox: tuple[str, ...] = ()
    # Each cell's requests, built once (by plan_grade, which checks them all before anything starts)
    # and reused by every step after it: the runs, the reference runs, the rates, the pairing.
    _requests: dict[tuple[str, int, bool], RunRequest] = field(default_factory=dict, init=False, repr=False)
    _references: dict[Cell, RunRequest | None] = field(default_factory=dict, init=False, repr=False)

    def cells(self) -> list[Cell]:
        planned = []
        for lab in self.labs:
            exp = self.profile.labs[lab]
            # Expectations exist only where the profile has them: --world-sizes selects among those.
            sizes = [ws for ws in exp.world_sizes if not self.world_sizes or ws in self.world_sizes]
            one_gpu_per_rank = exp.backend in (None, LABS[exp.catalog_lab].gpu_backend)  # a Gloo row shares them
            if self.profile.on_gpus and self.gpus is not None and one_gpu_per_rank:
                sizes = [ws for ws in sizes if ws <= self.gpus]
            planned += [(lab, ws) for ws in sizes if LABS[exp.catalog_lab].runs_at(ws)]
        return planned

    def program(self, lab: str) -> Path | None:
        """The student's program graded in a row, or None: the course's own lab."""
        return self.programs.get(lab) or self.programs.get(self.profile.labs[lab].catalog_lab)

    def bracketed(self, lab: str) -> bool:
        """A student's program timed against the course lab: its runs are bracketed by the lab's
        (lab, program, lab, ..., lab) and there are at least PROGRAM_PAIRS of them."""
        return self.program(lab) is not None and self.profile.labs[lab].reference is not None

    def runs(self, lab: str) -> int:
        """Runs of each cell of a row: --repeats, at least PROGRAM_PAIRS for a bracketed program."""
        return max(self.repeats, PROGRAM_PAIRS) if self.bracketed(lab) else self.repeats

    def cell_runs(self, lab: str, world_size: int) -> tuple[int, int]:
        """A cell's planned runs: its own, and its reference's (one before each, and one after the last
        for a bracketed program); a speed row's extra pairs (execute.py) come on top, where needed."""
        runs = self.runs(lab)
        return runs, (runs + self.bracketed(lab) if self.reference(lab, world_size) else 0)

    def planned_runs(self) -> int:
        """Every run the plan starts before any extra pair: what progress counts "run k of n" against."""
        return sum(sum(self.cell_runs(lab, ws)) for lab, ws in self.cells())

    def budget_s(self) -> float:
        """The planned runs' time by the profile's stated budgets (each row's time_budget_s, a reference
        run counted at its cell's): the estimate of a grade before any of its runs is measured."""
        return sum(sum(self.cell_runs(lab, ws)) * self.profile.labs[lab].time_budget_s for lab, ws in self.cells())

    def request(self, lab: str, world_size: int, course: bool = False) -> RunRequest:
        """The run of one cell (`course`: with the course's lab, whatever program the row grades),
        built the first time it is asked for and the same object after."""
        key = (lab, world_size, course)
        if key not in self._requests:
            self._requests[key] = self._build_request(lab, world_size, course)
        return self._requests[key]

    def _build_request(self, lab: str, world_size: int, course: bool) -> RunRequest:
        """A cell's run, checked like `distlab run` checks its own (request.build_request)."""
        exp = self.profile.labs[lab]
        request = build_request(exp.catalog_lab, world_size, exp.args_at(world_size),
                                launcher=exp.launcher if world_size > 1 else None, backend=exp.backend,
                                threads=self.profile.threads_per_rank,
                                timeout_s=self.timeout_s or exp.time_budget_s * 2, results_root=self.results_root,
                                program=None if course else self.program(lab), gpus=self.gpus)
        if world_size == 1 and self.program(lab) and (exp.launcher or DEFAULT_LAUNCHER[request.backend]) == "torchrun":
            # A student's DDP program runs at world size 1 as its users run it, under torchrun (a program
            # written for torchrun reads RANK and LOCAL_RANK); the course lab beside it the same way.
            request = dataclasses.replace(request, launcher="torchrun")
        return dataclasses.replace(request, sandbox=list(self.sandbox)) if self.sandbox else request

    def reference(self, lab: str, world_size: int) -> Reference | None:
        """What a cell's throughput is a ratio to: the profile's plain loop, or for a student's
        program the course's lab (harness/verdict/references.py). Needs nothing of this host."""
        exp = self.profile.labs[lab]
        if exp.reference is None:
            return None
        if self.program(lab):
            return course_lab(LABS[exp.catalog_lab], exp.throughput_metric)
        return REFERENCES[exp.reference]

    def reference_request(self, lab: str, world_size: int) -> RunRequest | None:
        """The reference's run for a cell, built once: the cell's own request, with the reference's program."""
        if (lab, world_size) not in self._references:
            reference = self.reference(lab, world_size)
            self._references[lab, world_size] = None if reference is None else reference.request(
                self.request(lab, world_size, course=self.program(lab) is not None))
        return self._references[lab, world_size]


def plan_grade(profile: Profile, *, labs: Sequence[str] = (), world_sizes: Sequence[int] | None = None,
               repeats: int = 1, programs: Mapping[str, Path] | None = None, results_root: Path,
               timeout_s: float | None = None, gpus: int | None = None, sandbox: Sequence[str] = (),
               check_runs: bool = True) -> GradePlan:
    """The grade of `labs` (rows, or labs: every row that runs the lab; empty: all the profile's),
    every run validated before the first one starts unless `check_runs` is False. UsageError names
    what cannot be graded."""
    asked = list(dict.fromkeys(labs)) or list(profile.labs)
    for lab in asked:
        if lab not in profile.labs:
            find_lab(lab)
        if not any(row == lab or exp.catalog_lab == lab for row, exp in profile.labs.items()):
            raise UsageError(f"profile {profile.name} has no expectations for lab {lab}; "
                             f"its labs: {', '.join(profile.labs)}")
    # `ddp` grades the rows that run ddp (ddp and a variant such as ddp-sync-bn); a row's own name
    # grades that row. Profile order throughout.
    rows = [row for row, exp in profile.labs.items() if row in asked or exp.catalog_lab in asked]
    # A row whose world size 1 is another's (single_device: the baseline for ddp) brings that row along.
    needed = {profile.labs[row].single_device for row in rows}
    rows = [row for row in profile.labs if row in rows or row in needed]
    chosen: dict[str, Path] = {}
    for lab, path in (programs or {}).items():
        if lab not in LABS and lab not in profile.labs:
            raise UsageError(f"a program is graded as a lab, one of {', '.join(LABS)} (got {lab!r})")
        if check_runs and not Path(path).is_file():
            raise UsageError(f"program {path} for lab {lab} does not exist")
        chosen[lab] = Path(path).resolve()
    grade_plan = GradePlan(profile, rows, list(world_sizes) if world_sizes else None, repeats, chosen,
                           Path(results_root).resolve(), timeout_s, gpus=gpus, sandbox=tuple(sandbox))
    grade_plan.profile = dataclasses.replace(profile, labs={
        row: against_course_lab(exp) if grade_plan.program(row) else exp for row, exp in profile.labs.items()})
    if not grade_plan.cells():
        raise UsageError("nothing to run: no lab of the profile runs at the world sizes given")
    if check_runs:
        for lab, ws in grade_plan.cells():
            grade_plan.request(lab, ws)
    return grade_plan
