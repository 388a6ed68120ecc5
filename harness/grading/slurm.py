"""A grade's cells executed as one Slurm job array (`distlab grade --slurm`), judged where it was submitted.

One task per cell (a lab at a world size, its reference runs before each of its runs, on one node:
a ratio holds only between runs on the same machine). Each task plans the same grade on its node
from the spec written beside the array (the profile by its path: a node must not pick another
profile for its own hardware), runs its cell through the grade's own `execute` and writes what it
saw as JSON; the submitting side then judges every cell together (judge.run_grade), as a grade on
one machine does, so the verdicts across world sizes are the same. The nodes must share the
results folder and the installation (same paths), as the Slurm templates already assume.

A multi-node run (`distlab template slurm-torchrun`) keeps one run directory per node;
observe/observations.merge judges their observations as one run's.

    distlab grade --profile cpu-smoke --slurm            # submit, wait, grade, report
    distlab grade --profile cpu-smoke --slurm --dry-run  # print the array job, submit nothing
    python -m harness.grading.slurm cell SPEC INDEX      # what each array task runs
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.console import console
from harness.files import write_json
from harness.grading import stored
from harness.grading.execute import execute
from harness.grading.plan import Cell, GradePlan, plan_grade
from harness.run import slurm_array
from harness.run.run_dir import new_run_dir
from harness.verdict import profiles
from harness.verdict.verdicts import Sample
from labs.common.host import fingerprint

SPEC_FILE = "grade-slurm.json"
SCRIPT_FILE = "grade-array.sbatch"
TASK = "cell"  # the array's files: cell-<i>.out, cell-<i>.jobid, cell-<i>.json (its samples)


def spec_of(grade_plan: GradePlan, folder: Path) -> dict[str, Any]:
    """What a task needs to plan the same grade on its node."""
    return {"profile": str(grade_plan.profile.path), "labs": list(grade_plan.labs),
            "world_sizes": grade_plan.world_sizes, "repeats": grade_plan.repeats,
            "programs": {lab: str(path) for lab, path in grade_plan.programs.items()},
            "results": str(grade_plan.results_root), "timeout": grade_plan.timeout_s,
            "cells": [list(cell) for cell in grade_plan.cells()], "folder": str(folder)}


def array_script(spec: dict[str, Any], threads: int, time_limit_s: float, sbatch_args: list[str]) -> str:
    """The job array: task i runs cell i on one node, with a CPU per rank and thread."""
    cells = spec["cells"]
    folder = Path(spec["folder"])
    table = "\n".join(f"#   task {i}: {lab} at world size {ws}" for i, (lab, ws) in enumerate(cells))
    head = slurm_array.header(array_name(folder), folder, TASK, len(cells),
                              cpus=max(ws for _, ws in cells) * threads, time_limit_s=time_limit_s,
                              sbatch_args=sbatch_args)
    return f"""#!/usr/bin/env bash
# distlab grade on Slurm: one array task per cell, each on one node (written by distlab grade --slurm).
{table}
{head}exec {shlex.quote(sys.executable)} -m harness.grading.slurm cell \\
  {shlex.quote(spec["folder"] + "/" + SPEC_FILE)} "$SLURM_ARRAY_TASK_ID"
"""


def array_name(folder: Path) -> str:
    """The grade's array by its folder: what a stopped grade cancels."""
    return slurm_array.array_name("grade", folder)


def _cell_time_s(grade_plan: GradePlan, lab: str, ws: int) -> float:
    """A task's time limit: every run of the cell and its references at their own timeout."""
    request = grade_plan.request(lab, ws)
    runs = grade_plan.runs(lab) * (2 if grade_plan.reference(lab, ws) else 1) + 1
    return runs * request.timeout_s


@dataclass
class Array:
    """A grade's job array, written to its folder; `execute` submits it and waits (a grading executor)."""

    folder: Path
    script: str

    @property
    def script_path(self) -> Path:
        return self.folder / SCRIPT_FILE

    def execute(self, grade_plan: GradePlan, done: dict[Cell, list[Sample]],
                references: dict[Cell, list[Sample]]) -> None:
        submit(self.folder, grade_plan, done, references)


def prepare(grade_plan: GradePlan, sbatch_args: list[str]) -> Array:
    """The array for a plan, its spec and script written to a new folder under the results."""
    folder = new_run_dir(grade_plan.results_root, "grade-slurm", max(ws for _, ws in grade_plan.cells()),
                         grade_plan.profile.name)
    spec = spec_of(grade_plan, folder)
    time_s = max(_cell_time_s(grade_plan, lab, ws) for lab, ws in grade_plan.cells())
    script = array_script(spec, grade_plan.profile.threads_per_rank or 1, time_s, sbatch_args)
    write_json(folder / SPEC_FILE, spec)
    (folder / SCRIPT_FILE).write_text(script)
    return Array(folder, script)


def submit(folder: Path, grade_plan: GradePlan, done: dict[Cell, list[Sample]],
           references: dict[Cell, list[Sample]]) -> None:
    """sbatch --wait the array (cancelled if the grade is stopped meanwhile), then every task's samples
    into `done` and `references`. A task that
    left none (killed, out of time, failed to start) counts each of its runs as failed, with the
    task's Slurm state as the reason."""
    cells = [tuple(cell) for cell in json.loads((folder / SPEC_FILE).read_text())["cells"]]
    job_id, sbatch_exit = slurm_array.submit(folder / SCRIPT_FILE, array_name(folder), chdir=Path.cwd())
    console.print(f"Slurm job array {job_id}: {len(cells)} task(s) ended (sbatch exit {sbatch_exit})",
                  markup=False)
    states = {index: slurm_array.task_state(folder, job_id, index, TASK) for index in range(len(cells))}
    write_json(folder / "sacct.json", states)
    for index, (lab, ws) in enumerate(cells):
        path = folder / f"cell-{index}.json"
        if path.exists():
            data = json.loads(path.read_text())
            for key, target in (("done", done), ("references", references)):
                for cell, samples in stored.runs_from_json(data[key]).items():
                    target.setdefault(cell, []).extend(samples)
            continue
        row = states[index]
        reason = (f"Slurm task {job_id}_{index} ended {row.get('State', 'without accounting')} "
                  f"(exit {row.get('ExitCode', '?')}) and returned no runs; see {folder}/cell-{index}.out")
        done.setdefault((lab, ws), []).extend(Sample(str(folder), "failed", reason, 0.0, None)
                                              for _ in range(grade_plan.runs(lab)))


def run_cell(spec_path: Path, index: int) -> int:
    """One array task: cell `index` of the grade in `spec_path`, run and observed by `execute` on
    this node; its samples written next to the spec for the submitting side."""
    spec = json.loads(spec_path.read_text())
    lab, ws = spec["cells"][index]
    host = fingerprint()
    grade_plan = plan_grade(profiles.load_profile(Path(spec["profile"])), labs=spec["labs"],
                            world_sizes=spec["world_sizes"], repeats=spec["repeats"],
                            programs={lab: Path(path) for lab, path in spec["programs"].items()},
                            results_root=Path(spec["results"]), timeout_s=spec["timeout"], gpus=host["gpus"])
    grade_plan = dataclasses.replace(grade_plan, labs=[lab], world_sizes=[ws])
    if grade_plan.cells() != [(lab, ws)]:
        raise SystemExit(f"task {index}: this node plans {grade_plan.cells()} for cell {lab} at {ws}")
    done: dict[Cell, list[Sample]] = {}
    references: dict[Cell, list[Sample]] = {}
    try:
        execute(grade_plan, done, references)
    finally:  # a run stopped by Slurm's SIGTERM still returns what finished
        out = {"done": stored.runs_to_json(done), "references": stored.runs_to_json(references)}
        write_json(spec_path.parent / f"cell-{index}.json", out)  # by rename: never read half written
    return 0


def _stop(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # Slurm's SIGTERM at the time limit: run_cell's finally writes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGTERM, _stop)
    if len(argv) != 3 or argv[0] != "cell" or not argv[2].isdigit():
        print("usage: python -m harness.grading.slurm cell SPEC INDEX (what distlab grade --slurm's array tasks run)",
              file=sys.stderr)
        return 2
    return run_cell(Path(argv[1]), int(argv[2]))


if __name__ == "__main__":
    sys.exit(main())
