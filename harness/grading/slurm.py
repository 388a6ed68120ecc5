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
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from shutil import which
from typing import Any

from harness.console import console
from harness.files import write_json
from harness.grading.execute import execute
from harness.grading.plan import Cell, GradePlan, plan_grade
from harness.run.run_dir import new_run_dir
from harness.usage import UsageError
from harness.verdict import profiles
from harness.verdict.verdicts import Sample
from labs.common.host import fingerprint

SPEC_FILE = "grade-slurm.json"
SCRIPT_FILE = "grade-array.sbatch"
SACCT_FIELDS = ("JobID", "State", "ExitCode", "NodeList", "Elapsed")


def sacct(job_id: str, env: dict[str, str] | None = None) -> list[dict[str, str]]:
    """The job's accounting rows (its steps and array tasks too): from slurmdbd where a cluster
    has one, else from the job completion log (jobcomp/filetxt, `sacct -c`)."""
    rows = []
    for completion in ([], ["-c"]):
        done = subprocess.run(["sacct", *completion, "-j", job_id, "-n", "-P", "-o", ",".join(SACCT_FIELDS)],
                              capture_output=True, text=True, env=env, timeout=60)
        if done.returncode == 0 and done.stdout.strip():
            rows = [dict(zip(SACCT_FIELDS, line.split("|"), strict=False)) for line in done.stdout.splitlines()]
            break
    return rows


def check_submit_host(sbatch_args: list[str]) -> None:
    """UsageError unless this host can submit and account an array: before anything is planned or written."""
    if not all(map(which, ("sbatch", "sacct"))):
        raise UsageError("--slurm needs Slurm's sbatch and sacct on PATH (run it on a login node of the cluster)")
    for arg in sbatch_args:
        if not arg.startswith("-") or any(c in arg for c in "\n\r\0"):
            raise UsageError(f"--sbatch-arg {arg!r} is not one sbatch option; give it as --sbatch-arg=--partition=cpu")


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
    cpus = max(ws for _, ws in cells) * threads
    minutes = max(1, int(time_limit_s // 60) + 1)
    extra = "".join(f"#SBATCH {shlex.quote(arg)}\n" for arg in sbatch_args)
    table = "\n".join(f"#   task {i}: {lab} at world size {ws}" for i, (lab, ws) in enumerate(cells))
    return f"""#!/usr/bin/env bash
# distlab grade on Slurm: one array task per cell, each on one node (written by distlab grade --slurm).
{table}
#SBATCH --job-name=distlab-grade
#SBATCH --array=0-{len(cells) - 1}
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task={cpus}
#SBATCH --time={minutes}
#SBATCH --output={shlex.quote(spec["folder"])}/cell-%a.out
{extra}set -euo pipefail
# The task's own job id, for sacct: a completion log (jobcomp, no slurmdbd) knows tasks only by it.
echo "$SLURM_JOB_ID" > {shlex.quote(spec["folder"])}/cell-"$SLURM_ARRAY_TASK_ID".jobid
exec {shlex.quote(sys.executable)} -m harness.grading.slurm cell {shlex.quote(spec["folder"] + "/" + SPEC_FILE)} \\
  "$SLURM_ARRAY_TASK_ID"
"""


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
    """sbatch --wait the array, then every task's samples into `done` and `references`. A task that
    left none (killed, out of time, failed to start) counts each of its runs as failed, with the
    task's Slurm state as the reason."""
    cells = [tuple(cell) for cell in json.loads((folder / SPEC_FILE).read_text())["cells"]]
    done_ = subprocess.run(["sbatch", "--parsable", "--wait", f"--chdir={os.getcwd()}", str(folder / SCRIPT_FILE)],
                           capture_output=True, text=True)
    job_id = done_.stdout.strip().split(";")[0]
    if not job_id:
        raise UsageError(f"sbatch refused the grade's array job: {done_.stderr.strip() or done_.returncode}")
    console.print(f"Slurm job array {job_id}: {len(cells)} task(s) ended (sbatch exit {done_.returncode})",
                  markup=False)
    states = {index: task_state(folder, job_id, index) for index in range(len(cells))}
    write_json(folder / "sacct.json", states)
    for index, (lab, ws) in enumerate(cells):
        path = folder / f"cell-{index}.json"
        if path.exists():
            data = json.loads(path.read_text())
            for key, target in (("done", done), ("references", references)):
                for entry in data[key]:
                    target.setdefault((entry["lab"], entry["world_size"]), []).extend(
                        Sample(**sample) for sample in entry["samples"])
            continue
        row = states[index]
        reason = (f"Slurm task {job_id}_{index} ended {row.get('State', 'without accounting')} "
                  f"(exit {row.get('ExitCode', '?')}) and returned no runs; see {folder}/cell-{index}.out")
        done.setdefault((lab, ws), []).extend(Sample(str(folder), "failed", reason, 0.0, None)
                                              for _ in range(grade_plan.runs(lab)))


def task_state(folder: Path, job_id: str, index: int, task: str = "cell") -> dict[str, str]:
    """Array task `index`'s row in sacct: as JOB_INDEX where slurmdbd keeps accounting, else by the
    task's own job id (what the task wrote first, as `<task>-<index>.jobid`); {} where neither is known."""
    jobid_file = folder / f"{task}-{index}.jobid"
    own = jobid_file.read_text().strip() if jobid_file.exists() else ""
    for wanted in filter(None, (f"{job_id}_{index}", own)):
        for row in sacct(wanted):
            if row.get("JobID") == wanted:
                return row
    return {}


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
        out = {key: [{"lab": cell[0], "world_size": cell[1], "samples": [dataclasses.asdict(s) for s in samples]}
                     for cell, samples in group.items()] for key, group in (("done", done),
                                                                             ("references", references))}
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
