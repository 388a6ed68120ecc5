"""A class's jobs as one Slurm job array (`distlab grade-class --slurm`): each submission a task.

A job starts the same way wherever it runs (`start_job`): the class's pool starts it on this host,
an array task starts it on its node in a pool of one, so each submission is graded exactly as
locally: the job process of job.py, its sandbox on that node, the grader side's deadline and
cgroup (pool.py). The class's folder must be on a filesystem the nodes share, and the installation
at the same path, as `distlab grade --slurm` assumes (grading/slurm.py). The submitting side waits
(`sbatch --wait`), then takes each task's end as the pool's (grading_loop.finish_job). A task killed,
preempted or out of time leaves its job without observations.json, so the same command grades
only those again.

    <class>/slurm/<stamp>-ws<N>-<profile>/
        jobs.txt                 one job.json a line: task i grades line i
        class-array.sbatch       the array
        task-<i>.out, task-<i>.jobid, task-<i>.json (how its job ended), sacct.json (every task's row)

    python -m harness.classgrade.cluster JOBS_FILE INDEX    # what each array task runs
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.catalog import REPO
from harness.classgrade.pool import STOP_GRACE_S, Ended, Pool, job_deadline_s
from harness.classgrade.sandbox.cgroups import Cgroup, job_cgroup_name
from harness.console import console
from harness.files import write_json
from harness.grading.plan import GradePlan
from harness.run import slurm_array
from harness.run.run_dir import new_run_dir

JOBS_FILE = "jobs.txt"
SCRIPT_FILE = "class-array.sbatch"
TASK = "task"  # the array's files: task-<i>.out, task-<i>.jobid, task-<i>.json


def start_job(pool: Pool, slot: int, job: dict[str, Any]) -> None:
    """The job's process started on `slot`: by the class's pool on this host, or by an array task on its node."""
    for name in (job_cgroup_name(job), f"{job_cgroup_name(job)}-grader"):
        Cgroup.remove_named(name)  # an earlier grade of it killed (on this host) before its clean-up
    env = dict(os.environ)
    if job["gpus"] is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, job["gpus"]))
    pool.start(slot, job["id"], Path(job["folder"]) / "job.json", env, deadline_s=job["deadline_s"],
               cgroup_name=f"{job_cgroup_name(job)}-grader")


def array_name(folder: Path) -> str:
    """The class's array by its folder: what a stopped grade-class cancels."""
    return slurm_array.array_name("class", folder)


def array_script(folder: Path, tasks: int, at_once: int, cpus: int, gpus: int, time_limit_s: float,
                 sbatch_args: list[str]) -> str:
    """The job array: task i grades the job on line i of the jobs file, on one node, with a CPU per rank
    and thread (a GPU per rank on a GPU profile), at most `at_once` tasks at a time."""
    head = slurm_array.header(array_name(folder), folder, TASK, tasks, cpus=cpus, time_limit_s=time_limit_s,
                              sbatch_args=sbatch_args, at_once=at_once, gpus=gpus)
    return f"""#!/usr/bin/env bash
# distlab grade-class on Slurm: one array task per submission, each graded on its node as on one host,
# in its sandbox (written by distlab grade-class --slurm; task i grades line i of {JOBS_FILE}).
{head}cd {shlex.quote(str(REPO))}  # where the pool starts a job: python -m harness.classgrade.job
exec {shlex.quote(sys.executable)} -m harness.classgrade.cluster {shlex.quote(str(folder / JOBS_FILE))} \\
  "$SLURM_ARRAY_TASK_ID"
"""


def run_array(class_dir: Path, job_paths: list[Path], grade_plan: GradePlan, at_once: int,
              sbatch_args: list[str]) -> list[Ended]:
    """Each job a task of one array, submitted and waited for; how each job ended, a task that brought
    nothing back (killed, preempted, out of time, never started) with its Slurm state as the reason.
    A stop (KeyboardInterrupt: Ctrl-C, or SIGTERM raised as it) cancels the array, then is raised again."""
    ranks = max(ws for _, ws in grade_plan.cells())
    folder = new_run_dir(class_dir, "slurm", ranks, grade_plan.profile.name)
    (folder / JOBS_FILE).write_text("".join(f"{path}\n" for path in job_paths))
    script = array_script(folder, len(job_paths), min(at_once, len(job_paths)),
                          cpus=ranks * (grade_plan.profile.threads_per_rank or 1),
                          gpus=ranks if grade_plan.profile.on_gpus else 0,
                          time_limit_s=job_deadline_s(grade_plan) + STOP_GRACE_S, sbatch_args=sbatch_args)
    (folder / SCRIPT_FILE).write_text(script)
    job_id, sbatch_exit = slurm_array.submit(folder / SCRIPT_FILE, array_name(folder))
    console.print(f"Slurm job array {job_id}: {len(job_paths)} task(s) ended (sbatch exit {sbatch_exit})",
                  markup=False)
    states = {index: slurm_array.task_state(folder, job_id, index, TASK) for index in range(len(job_paths))}
    write_json(folder / "sacct.json", states)
    return [_ended(folder, job_id, index, path, states[index]) for index, path in enumerate(job_paths)]


def _ended(folder: Path, job_id: str, index: int, job_path: Path, row: dict[str, str]) -> Ended:
    written = folder / f"{TASK}-{index}.json"
    if written.is_file():
        return Ended(**json.loads(written.read_text()))
    student = json.loads(job_path.read_text())["id"]
    return Ended(student, 1, f"its Slurm task {job_id}_{index} ended {row.get('State', 'without accounting')} "
                             f"(exit {row.get('ExitCode', '?')}) before its job did; see {folder}/{TASK}-{index}.out. "
                             "The same grade-class --slurm grades it again")


def run_task(jobs_file: Path, index: int) -> int:
    """One array task: the job on line `index` of `jobs_file` graded on this node by a pool of one; how it
    ended written beside the jobs file (by rename: never read half written). Stopped (scancel, preemption,
    the time limit), the job is stopped as the pool stops it and nothing is written: the job stays un-done."""
    job_path = Path(jobs_file.read_text().splitlines()[index])
    job = json.loads(job_path.read_text())
    granted = os.environ.get("SLURM_JOB_GPUS")
    if job["gpus"] is not None and granted:  # the GPUs Slurm granted this task, by the node's own indices
        job["gpus"] = [int(gpu) for gpu in granted.split(",")][:len(job["gpus"])]
        write_json(job_path, job)
    pool = Pool(1, job["sandboxed"])
    start_job(pool, 0, job)
    process = pool.running[0].process
    ended: list[Ended] = []
    try:
        while not ended:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=job["deadline_s"])  # None: until it ends
            ended = pool.finished()  # its end, or its deadline passed: ended by the pool, which says why
    except KeyboardInterrupt:
        pool.stop()
        return 128 + signal.SIGTERM
    write_json(jobs_file.parent / f"{TASK}-{index}.json", dataclasses.asdict(ended[0]))
    return 0


def _stop(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # Slurm's SIGTERM: run_task stops the job as the pool does


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m harness.classgrade.cluster JOBS_FILE INDEX (what grade-class --slurm's array "
              "tasks run)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _stop)
    return run_task(Path(argv[0]), int(argv[1]))


if __name__ == "__main__":
    sys.exit(main())
