"""Runs as one process stores them for another: a class job's observations.json (classgrade/job.py,
read back by classgrade/outcome.py) and a Slurm task's cell-<i>.json (grading/slurm.py). One
format: each cell's Samples, as their fields, under "<lab>@<world size>" (cell_key). The replay
fixture (tests/fixtures/replay/runs.json) keys its cells the same way, but keeps run directories,
not Samples: it replays the launches, and the grade builds the Samples from them again."""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.grading.plan import Cell
from harness.verdict.verdicts import Sample


def cell_key(cell: Cell) -> str:
    lab, world_size = cell
    return f"{lab}@{world_size}"


def cell_of(key: str) -> Cell:
    lab, _, world_size = key.rpartition("@")
    return lab, int(world_size)


def runs_to_json(runs: dict[Cell, list[Sample]]) -> dict[str, list[dict[str, Any]]]:
    return {cell_key(cell): [dataclasses.asdict(s) for s in samples] for cell, samples in runs.items()}


def runs_from_json(data: dict[str, list[dict[str, Any]]]) -> dict[Cell, list[Sample]]:
    """The runs stored by runs_to_json; a field this version of Sample lacks is left out (a job
    stored by a later distlab is still read)."""
    names = {f.name for f in dataclasses.fields(Sample)}
    return {cell_of(key): [Sample(**{k: v for k, v in s.items() if k in names}) for s in samples]
            for key, samples in data.items()}
