"""Slurm: what a job left behind, judged by the harness, and `distlab grade --slurm`.

A job of `distlab template slurm-torchrun` runs one `distlab run` per node; each keeps its own run
directory, with the observations of its own ranks. `merged_observations` puts the nodes' together
so that harness/observe/observations.py judges the run as one, across the nodes (rank 0's final weights are in
the directory of the node it ran on).

`distlab grade --slurm` runs the grade's cells as one Slurm job array, one task per cell (a lab at a
world size, its reference runs before each of its runs, on one node: a ratio holds only between
runs on the same machine). Each task runs the cell through the grade's own code (grade.execute) on
the node it got and writes what it saw as JSON; the submitting side then judges every cell
together, as a grade on one machine does (grade.run), so the verdicts across world sizes are the
same. The nodes must share the results folder and the installation (same paths), as the Slurm
templates already assume.

    distlab grade --profile cpu-smoke --slurm            # submit, wait, grade, report
    distlab grade --profile cpu-smoke --slurm --dry-run  # print the array job, submit nothing
    python -m harness.commands.slurm cell SPEC INDEX              # what each array task runs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.observe import observations
from harness.usage import UsageError

SPEC_FILE = "grade-slurm.json"
SCRIPT_FILE = "grade-array.sbatch"
SACCT_FIELDS = ("JobID", "State", "ExitCode", "NodeList", "Elapsed")


def merged_observations(observe_dirs: list[Path]) -> observations.Observations:
    """The observations of every node's run directory as one run's: each rank's from the node it
    ran on. A rank seen on two nodes is a problem (the observer check fails), never overwritten."""
    merged = observations.Observations(Path(observe_dirs[0]) if observe_dirs else Path("."))
    for directory in observe_dirs:
        part = observations.load(directory)
        merged.problems += [f"{directory}: {problem}" for problem in part.problems]
        for rank, observation in part.ranks.items():
            if rank in merged.ranks:
                merged.problems.append(f"rank {rank} observed on two nodes ({directory})")
            else:
                merged.ranks[rank] = observation
        if (Path(directory) / observations.WEIGHTS_FILE).exists():
            merged.directory = Path(directory)  # rank 0's node: the final weights the grader evaluates
    return merged


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


# ------------------------------------------------------------------------- distlab grade --slurm


def _spec(args: argparse.Namespace, grade_plan: Any, folder: Path) -> dict[str, Any]:
    """What a task needs to plan the same grade on its node: the grade's own arguments, the
    profile by its path (a node must not pick another profile for its own hardware)."""
    return {"profile": str(grade_plan.profile.path), "labs": ",".join(grade_plan.labs),
            "world_sizes": grade_plan.world_sizes, "repeats": grade_plan.repeats,
            "program": [f"{lab}={path}" for lab, path in grade_plan.programs.items()],
            "results": str(Path(args.results).resolve()), "timeout": grade_plan.timeout_s,
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
exec {shlex.quote(sys.executable)} -m harness.commands.slurm cell {shlex.quote(spec["folder"] + "/" + SPEC_FILE)} \\
  "$SLURM_ARRAY_TASK_ID"
"""


def _cell_time_s(grade_plan: Any, lab: str, ws: int) -> float:
    """A task's time limit: every run of the cell and its references at their own timeout."""
    request = grade_plan.request(lab, ws)
    runs = grade_plan.runs(lab) * (2 if grade_plan.reference(lab, ws) else 1) + 1
    return runs * request.timeout_s


def grade(args: argparse.Namespace) -> int:
    """`distlab grade --slurm`: the plan checked here, its cells run as a job array, judged here."""
    from harness.commands import grade as grading
    from harness.run.run_dir import new_run_dir

    if not all(map(_which, ("sbatch", "sacct"))):
        raise UsageError("--slurm needs Slurm's sbatch and sacct on PATH (run it on a login node of the cluster)")
    for arg in args.sbatch_arg or []:
        if not arg.startswith("-") or any(c in arg for c in "\n\r\0"):
            raise UsageError(f"--sbatch-arg {arg!r} is not one sbatch option; give it as --sbatch-arg=--partition=cpu")
    grade_plan = grading.plan(args)
    folder = new_run_dir(args.results, "grade-slurm", max(ws for _, ws in grade_plan.cells()),
                         grade_plan.profile.name)
    spec = _spec(args, grade_plan, folder)
    time_s = max(_cell_time_s(grade_plan, lab, ws) for lab, ws in grade_plan.cells())
    script = array_script(spec, grade_plan.profile.threads_per_rank or 1, time_s, list(args.sbatch_arg or []))
    (folder / SPEC_FILE).write_text(json.dumps(spec, indent=1))
    (folder / SCRIPT_FILE).write_text(script)
    if getattr(args, "dry_run", False):
        sys.stdout.write(script)
        sys.stdout.write(f"# not submitted (--dry-run); written to {folder / SCRIPT_FILE}\n")
        return 0

    def execute(plan_here: Any, done: dict, references: dict) -> None:
        submit(folder, plan_here, done, references)

    return grading.run(args, execute_cells=execute)


def submit(folder: Path, grade_plan: Any, done: dict, references: dict) -> None:
    """sbatch --wait the array, then every task's samples into `done` and `references`. A task that
    left none (killed, out of time, failed to start) counts each of its runs as failed, with the
    task's Slurm state as the reason."""
    from harness.console import console
    from harness.verdict.verdicts import Sample

    cells = [tuple(cell) for cell in json.loads((folder / SPEC_FILE).read_text())["cells"]]
    done_ = subprocess.run(["sbatch", "--parsable", "--wait", f"--chdir={os.getcwd()}", str(folder / SCRIPT_FILE)],
                           capture_output=True, text=True)
    job_id = done_.stdout.strip().split(";")[0]
    if not job_id:
        raise UsageError(f"sbatch refused the grade's array job: {done_.stderr.strip() or done_.returncode}")
    console.print(f"Slurm job array {job_id}: {len(cells)} task(s) ended (sbatch exit {done_.returncode})",
                  markup=False)
    states = {index: task_state(folder, job_id, index) for index in range(len(cells))}
    (folder / "sacct.json").write_text(json.dumps(states, indent=1))
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


def task_state(folder: Path, job_id: str, index: int) -> dict[str, str]:
    """Array task `index`'s row in sacct: as JOB_INDEX where slurmdbd keeps accounting, else by the
    task's own job id (what the task wrote first); {} where neither is known."""
    jobid_file = folder / f"cell-{index}.jobid"
    own = jobid_file.read_text().strip() if jobid_file.exists() else ""
    for wanted in filter(None, (f"{job_id}_{index}", own)):
        for row in sacct(wanted):
            if row.get("JobID") == wanted:
                return row
    return {}


def run_cell(spec_path: Path, index: int) -> int:
    """One array task: cell `index` of the grade in `spec_path`, run and observed by grade.execute
    on this node; its samples written next to the spec for the submitting side."""
    from harness.commands import grade as grading

    spec = json.loads(spec_path.read_text())
    lab, ws = spec["cells"][index]
    args = argparse.Namespace(profile=spec["profile"], labs=spec["labs"], world_sizes=spec["world_sizes"],
                              repeats=spec["repeats"], program=spec["program"], results=Path(spec["results"]),
                              timeout=spec["timeout"])
    grade_plan = dataclasses.replace(grading.plan(args), labs=[lab], world_sizes=[ws])
    if grade_plan.cells() != [(lab, ws)]:
        raise SystemExit(f"task {index}: this node plans {grade_plan.cells()} for cell {lab} at {ws}")
    done: dict = {}
    references: dict = {}
    try:
        grading.execute(grade_plan, done, references)
    finally:  # a run stopped by Slurm's SIGTERM still returns what finished
        out = {key: [{"lab": cell[0], "world_size": cell[1], "samples": [dataclasses.asdict(s) for s in samples]}
                     for cell, samples in group.items()] for key, group in (("done", done),
                                                                             ("references", references))}
        target = spec_path.parent / f"cell-{index}.json"
        partial = target.with_suffix(".partial")
        partial.write_text(json.dumps(out))
        partial.replace(target)
    return 0


def _which(tool: str) -> bool:
    from shutil import which

    return which(tool) is not None


def _stop(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # Slurm's SIGTERM at the time limit: run_cell's finally writes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGTERM, _stop)
    if len(argv) != 3 or argv[0] != "cell" or not argv[2].isdigit():
        print("usage: python -m harness.commands.slurm cell SPEC INDEX (what distlab grade --slurm's array tasks run)",
              file=sys.stderr)
        return 2
    return run_cell(Path(argv[1]), int(argv[2]))


if __name__ == "__main__":
    sys.exit(main())
