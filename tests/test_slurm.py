"""The Slurm templates and `distlab grade --slurm` on a real Slurm: two nodes on this host.

Run with `nox -s slurm`: it installs slurm-wlm, munge and libpmix-dev where missing, starts the
cluster (tests/slurm_cluster.py) and runs this file in it. Without that cluster every test here
skips, saying so. Each job is submitted with `sbatch --wait`; what a test holds against it is the
job's exit, its state in `sacct` and what it left: the records, and for DDP what the harness's
observer saw on the ranks of both nodes, judged by harness/observe/observations.py as a grade judges a run.
`distlab grade-class --slurm` grades a class there, each submission an array task in its sandbox on
its node, one task killed mid-run and graded again by the same command.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import write_rank_observation
from test_grade_mutations import MUTANTS, mutant

from harness.classgrade import cluster as class_cluster
from harness.classgrade import rubric
from harness.classgrade.sandbox.bubblewrap import available
from harness.classgrade.sandbox.uid import processes_left
from harness.commands import cli
from harness.files import write_json
from harness.grading import slurm, stored
from harness.observe import accuracy, data_parallel, observations
from harness.run import job_templates, slurm_array
from harness.run.run_dir import RUN_DIR_PLACEHOLDER
from harness.verdict.tolerances import accuracy_claim_tolerance
from harness.verdict.verdicts import Sample

REPO = Path(__file__).resolve().parents[1]
CLUSTER = os.environ.get("DISTLAB_SLURM_CLUSTER")
cluster = pytest.mark.skipif(not CLUSTER or not os.environ.get("SLURM_CONF"),
                             reason="needs the two-node Slurm cluster that `nox -s slurm` starts")
JOB_LIMIT_S = 900  # sbatch --wait's ceiling; a ddp smoke job takes about a minute here
BIN = str(Path(sys.executable).parent)  # the jobs inherit PATH: distlab, torchrun, python of this env
CORRECT = REPO / "tests/programs/ddp_program.py"  # the correct program test_grade_class.py grades


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def submit(script: str, folder: Path) -> tuple[str, int, str]:
    """sbatch --wait the job from `folder` (labs/ linked there: slurm-mpi runs labs/<lab>/... from its
    working directory); its id, sbatch's exit (the job's) and its output."""
    (folder / "labs").symlink_to(REPO / "labs")
    (folder / "job.sbatch").write_text(script)
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    done = subprocess.run(["sbatch", "--parsable", "--wait", f"--chdir={folder}", "--output=job-%j.out",
                           str(folder / "job.sbatch")], capture_output=True, text=True, env=env, timeout=JOB_LIMIT_S)
    job_id = done.stdout.strip().split(";")[0]
    assert job_id, done.stderr
    output = folder / f"job-{job_id}.out"
    return job_id, done.returncode, output.read_text() if output.exists() else ""


def accounted(job_id: str) -> dict[str, str]:
    """The job's own row in sacct (not its steps)."""
    rows = {row["JobID"]: row for row in slurm_array.sacct(job_id)}
    assert job_id in rows, f"sacct has no row for job {job_id}: {rows}"
    return rows[job_id]


@pytest.mark.integration
@cluster
def test_a_failing_rank_fails_the_job_in_sacct(tmp_path):
    """The checks below read success from sbatch and sacct: a job whose rank fails must read as failed."""
    shape = job_templates.JobShape("check", nodes=2, gpus_per_node=0, backend="gloo", cpus_per_task=1, port=_port(),
                               lab_args=("--fail-rank", "1"))
    job_id, code, output = submit(job_templates.render("slurm-torchrun", shape), tmp_path)
    assert code != 0, output
    row = accounted(job_id)
    assert row["State"] == "FAILED" and row["ExitCode"] != "0:0", row


@pytest.mark.integration
@cluster
def test_check_lab_through_slurm_torchrun_on_cpu_nodes(tmp_path):
    shape = job_templates.JobShape("check", nodes=2, gpus_per_node=0, backend="gloo", cpus_per_task=1, port=_port())
    script = job_templates.render("slurm-torchrun", shape)
    assert "--gpus-per-node" not in script.replace("(--gpus-per-node 0)", "")  # no GPU asked of a CPU cluster
    job_id, code, output = submit(script, tmp_path)
    assert code == 0, output
    row = accounted(job_id)
    assert (row["State"], row["ExitCode"], row["NodeList"]) == ("COMPLETED", "0:0", "n[1-2]")
    runs = sorted((tmp_path / "results" / f"slurm-{job_id}").glob("node*/check/*/run.json"))
    assert [run.parts[-4] for run in runs] == ["node0", "node1"]  # one distlab run per node, each kept
    assert all(json.loads(run.read_text())["status"] == "ok" for run in runs)
    records = [json.loads(p.read_text()) for p in (tmp_path / "results").rglob("record.json")]
    ok = [r for r in records if r["status"] == "ok"]
    assert len(ok) == 1 and ok[0]["provenance"]["world_size"] == 2  # rank 0's, on whichever node it ran


@pytest.mark.integration
@cluster
def test_ddp_through_slurm_torchrun_is_graded_across_both_nodes(tmp_path):
    """The observed checks hold over the ranks of both nodes, one rank wrote each checkpoint, and
    the record's claims (accuracy included, measured from rank 0's weights) are not contradicted."""
    lab_args = ("--smoke", "--checkpoint", f"{RUN_DIR_PLACEHOLDER}/checkpoint.pt")  # each node's own run dir
    shape = job_templates.JobShape("ddp", nodes=2, gpus_per_node=0, backend="gloo", cpus_per_task=1, port=_port(),
                               lab_args=lab_args)
    job_id, code, output = submit(job_templates.render("slurm-torchrun", shape), tmp_path)
    assert code == 0, output
    assert accounted(job_id)["State"] == "COMPLETED"
    job = tmp_path / "results" / f"slurm-{job_id}"
    observe_dirs = sorted(job.glob("node*/ddp/*/observe"))
    assert len(observe_dirs) == 2, observe_dirs  # both nodes' records kept
    per_node = [set(observations.load(d).ranks) for d in observe_dirs]
    assert per_node in ([{0}, {1}], [{1}, {0}])  # each node saw its own rank, and only it
    merged = observations.merge(observe_dirs)
    (record_path,) = [p for p in job.rglob("record.json") if json.loads(p.read_text())["status"] == "ok"]
    record = json.loads(record_path.read_text())
    with accuracy.Evaluator() as evaluator:
        measurement = evaluator.measure(merged.directory, ["--smoke"])  # the test set of the lab's arguments
    assert measurement.get("accuracy") is not None, measurement
    checks = data_parallel.checks(merged, "gloo", 2, train_set_size=measurement.get("train_size"))
    checks += data_parallel.compare_claims(record, checks, measurement["accuracy"],
                                      accuracy_claim_tolerance(measurement.get("total")),
                                      measured_img_per_sec=observations.throughput(merged))
    failed = [f"{c.name}: {c.detail}" for c in checks if not c.passed]
    assert not failed, failed
    by_name = {c.name: c for c in checks}
    assert "all 2 ranks" in by_name["process_group"].detail
    writers = {rank for rank, seen in merged.ranks.items() for save in seen.saves
               if save["path"].endswith("checkpoint.pt")}
    assert writers == {0}, by_name["one_writer_per_checkpoint"].detail  # the checkpoint, by rank 0 alone


@pytest.mark.integration
@cluster
@pytest.mark.parametrize(("lab", "backend", "lab_args"), [("check", "mpi", ()), ("horovod", "horovod", ("--smoke",))],
                         ids=["mpi4py", "horovod"])
def test_slurm_mpi_starts_the_ranks_with_srun_and_pmix(tmp_path, lab, backend, lab_args):
    shape = job_templates.JobShape(lab, nodes=2, gpus_per_node=0, backend=backend, cpus_per_task=1, port=_port(),
                               lab_args=lab_args)
    job_id, code, output = submit(job_templates.render("slurm-mpi", shape), tmp_path)
    assert code == 0, output
    row = accounted(job_id)
    assert (row["State"], row["ExitCode"], row["NodeList"]) == ("COMPLETED", "0:0", "n[1-2]")
    record = json.loads((tmp_path / "results" / f"slurm-{job_id}" / "record.json").read_text())
    # One world of two ranks, one per node: PMI2 or no PMI would make two worlds of one, each rank 0.
    assert record["status"] == "ok" and record["provenance"]["world_size"] == 2, record


@pytest.mark.integration
@cluster
def test_distlab_grade_runs_its_cells_as_a_slurm_job_array(tmp_path):
    """cpu-smoke's ddp at 1 and 2 ranks: two cells, each an array task that runs the plain loop
    before the lab and observes the lab's ranks; judged together (accuracy and speed-up across the
    world sizes) where the grade was submitted."""
    results = tmp_path / "results"
    argv = [str(Path(BIN) / "distlab"), "grade", "--profile", "cpu-smoke", "--labs", "ddp", "--world-sizes", "1,2",
            "--results", str(results), "--slurm", "--json"]
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    dry = subprocess.run([*argv, "--dry-run"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH --array=0-1" in dry.stdout and "task 1: ddp at world size 2" in dry.stdout
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=JOB_LIMIT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout)
    # A run and its reference per cell, and more pairs where a speed row's interval reached its floor (#48).
    assert summary["failed"] == 0 and summary["runs"] >= 2 and summary["reference_runs"] == summary["runs"], summary
    (folder,) = [p for p in (results / "grade-slurm").iterdir() if (p / "sacct.json").exists()]
    states = json.loads((folder / "sacct.json").read_text())
    assert [(states[i]["State"], states[i]["ExitCode"]) for i in ("0", "1")] == [("COMPLETED", "0:0")] * 2, states
    # The runs the tasks made, under the shared results, each observed on its node.
    assert len(list(results.glob("ddp/*/run.json"))) == summary["runs"]
    at_2 = list(results.glob("ddp/*-ws2-*/run.json"))
    assert at_2 and len(list(results.glob("ddp/*-ws2-*/observe/rank.*.json"))) == 2 * len(at_2)


def _gradebook(class_dir: Path) -> dict[str, dict[str, str]]:
    return {row["id"]: row for row in csv.DictReader((class_dir / "gradebook.csv").open(newline=""))}


def _appears(grader: subprocess.Popen[str], folder: Path, pattern: str, since: float) -> list[Path]:
    """What matches `pattern` in `folder` once something does, while the grader runs: a job's folder set
    aside, a job's run started on its node (its launcher's log)."""
    while not (found := list(folder.glob(pattern))):
        assert grader.poll() is None and time.monotonic() - since < JOB_LIMIT_S, grader.communicate()[0]
        time.sleep(0.2)  # a file appearing in the shared folder: no event reaches this process from a node
    return found


def _array_tasks(array: Path, env: dict[str, str]) -> dict[str, str]:
    """The array's tasks in squeue: each one's own job id -> <array>_<index>, the name scancel takes
    (Slurm 22.05 answers "invalid job id" to a task's own id)."""
    listed = subprocess.run(["squeue", "-h", "-n", class_cluster.array_name(array), "-o", "%A %i"],
                            capture_output=True, text=True, env=env, timeout=60, check=True).stdout
    return dict(line.split() for line in listed.splitlines())


@pytest.mark.integration
@cluster
@pytest.mark.skipif(available() is not None or os.geteuid() != 0,
                    reason=f"the class's sandbox needs root and bubblewrap ({available() or 'not root'})")
@pytest.mark.timeout(2 * JOB_LIMIT_S)
def test_grade_class_on_slurm_grades_again_only_the_task_killed_mid_run(tmp_path):
    """A correct program, a wrong one (no-sampler: every rank trains on the whole set) and a hostile one
    (it reads a classmate's program) as three array tasks over both nodes, two at once, each in its
    sandbox on its node (cpu-smoke's ddp at world size 2, the plain loop before each run). The correct
    one's task is cancelled once its run has started: the first grade says so and scores it nothing;
    the same command then grades that one alone, and the gradebook holds every student with the
    scores due. Last, a grader stopped mid-array cancels its array."""
    submissions = tmp_path / "week4"
    submissions.mkdir()
    shutil.copy(CORRECT, submissions / "alice.py")
    shutil.copy(mutant(tmp_path, "no-sampler", MUTANTS["no-sampler"][0]), submissions / "bob.py")
    shutil.copy(REPO / "tests/submissions/reads_other.py", submissions / "reads-other.py")
    results = tmp_path / "results"
    argv = [str(Path(BIN) / "distlab"), "grade-class", str(submissions), "--lab", "ddp", "--profile", "cpu-smoke",
            "--world-sizes", "2", "--jobs", "2", "--results", str(results), "--slurm", "--lessons", "local"]
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    class_dir = results.resolve() / "class" / "week4"  # as the jobs file names it
    started = time.monotonic()
    grader = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                              cwd=tmp_path, stdin=subprocess.DEVNULL)
    _appears(grader, class_dir, "jobs/alice/runs/*/*/launcher.log", started)  # alice's first run is on its node
    (array,) = class_dir.glob("slurm/*")
    index = (array / class_cluster.JOBS_FILE).read_text().splitlines().index(str(class_dir / "jobs/alice/job.json"))
    task = _array_tasks(array, env)[(array / f"task-{index}.jobid").read_text().strip()]
    subprocess.run(["scancel", task], check=True, env=env, timeout=60)
    first = grader.communicate(timeout=JOB_LIMIT_S)[0]
    assert grader.returncode == 0 and "3 to grade" in first, first[-3000:]
    states = json.loads((array / "sacct.json").read_text())
    assert states[str(index)]["State"].startswith("CANCELLED"), states
    assert [states[str(i)]["State"] for i in range(3) if i != index] == ["COMPLETED"] * 2, states
    assert {states[str(i)]["NodeList"] for i in range(3)} == {"n1", "n2"}, states  # across both nodes
    book = _gradebook(class_dir)
    assert book["alice"]["status"] == "error" and book["alice"]["score"] == "", book["alice"]  # never a silent 0
    assert "Slurm task" in book["alice"]["reason"] and "CANCELLED" in book["alice"]["reason"], book["alice"]
    # The cancelled task left nothing running as its job's uid (None: another job holds the uid now).
    uid = json.loads((class_dir / "jobs/alice/sandbox.json").read_text())["uid"]
    assert not processes_left(uid), uid
    first_s = time.monotonic() - started

    again = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=JOB_LIMIT_S,
                           stdin=subprocess.DEVNULL)
    assert again.returncode == 0 and "1 to grade" in again.stdout, again.stdout[-3000:] + again.stderr[-3000:]
    (second,) = [folder for folder in class_dir.glob("slurm/*") if folder != array]
    assert (second / class_cluster.JOBS_FILE).read_text().splitlines() == [str(class_dir / "jobs/alice/job.json")]
    book = _gradebook(class_dir)
    assert book["alice"]["status"] == "graded", book["alice"]
    for item in rubric.load(rubric.DEFAULT).items:
        if item.name != "speed":  # timed beside the other task on a 2-core host: not asserted
            assert (float(book["alice"][item.name]) == item.points if item.points else  # a lesson: taught or not
                    book["alice"][item.name] in ("ok", "lesson")), (item.name, book["alice"])
    assert book["bob"]["status"] == "graded" and book["bob"]["each rank its own shard"] == "1.5", book["bob"]
    assert float(book["bob"]["score"]) < float(book["bob"]["max"]), book["bob"]  # shards_disjoint fails
    assert book["reads-other"]["status"] == "ungradable", book["reads-other"]
    assert "tried to reach" in book["reads-other"]["reason"], book["reads-other"]  # its sandbox on its node
    assert all((class_dir / "jobs" / key / "sandbox.json").is_file() for key in ("alice", "bob", "reads-other"))
    print(f"first grade {first_s:.0f} s; the cancelled task again {time.monotonic() - started - first_s:.0f} s")

    # A grader stopped (SIGTERM) while its array runs cancels the array: nothing of it runs on.
    grader = subprocess.Popen([*argv, "--rerun", "bob"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env, cwd=tmp_path, stdin=subprocess.DEVNULL)
    since = time.monotonic()
    _appears(grader, class_dir, "jobs/bob.before-1", since)  # bob's grade set aside: jobs/bob is the new job
    _appears(grader, class_dir, "jobs/bob/runs/*/*/launcher.log", since)
    (third,) = [folder for folder in class_dir.glob("slurm/*") if folder not in (array, second)]
    grader.send_signal(signal.SIGTERM)
    stopped = grader.communicate(timeout=120)[0]
    assert grader.returncode in (130, 143), stopped[-3000:]
    assert "cancelled the Slurm job array distlab-class-" in stopped, stopped[-3000:]
    cancelled = time.monotonic()
    while _array_tasks(third, env):  # cancelled: Slurm ends the task (SIGTERM, SIGKILL after KillWait)
        assert time.monotonic() - cancelled < 120, _array_tasks(third, env)
        time.sleep(0.2)  # squeue is the one place the task's end shows
    assert not (class_dir / "jobs/bob/observations.json").exists()
    assert not processes_left(json.loads((class_dir / "jobs/bob/sandbox.json").read_text())["uid"])


# --- without a cluster ----------------------------------------------------------------------------

def _observation(folder: Path, rank: int) -> None:
    write_rank_observation(folder, rank)


def test_the_nodes_observations_are_judged_as_one_run(tmp_path):
    node0, node1 = tmp_path / "node0" / "observe", tmp_path / "node1" / "observe"
    _observation(node0, 1)
    _observation(node1, 0)
    (node1 / observations.WEIGHTS_FILE).write_bytes(b"")
    merged = observations.merge([node0, node1])
    assert sorted(merged.ranks) == [0, 1] and not merged.problems
    assert merged.directory == node1  # rank 0's node: the weights the grader evaluates
    _observation(tmp_path / "node2" / "observe", 1)  # a rank claimed by two nodes is never merged away
    merged = observations.merge([node0, node1, tmp_path / "node2" / "observe"])
    assert any("rank 1 observed on two nodes" in problem for problem in merged.problems)
    assert not data_parallel.check_observer(merged).passed


def test_the_grade_array_has_one_task_per_cell():
    spec = {"cells": [["check", 1], ["check", 2], ["ddp", 4]], "folder": "/shared/results/grade-slurm/x y"}
    script = slurm.array_script(spec, threads=2, time_limit_s=600, sbatch_args=["--partition=cpu"])
    assert "#SBATCH --array=0-2" in script and "#SBATCH --cpus-per-task=8" in script  # 4 ranks x 2 threads
    assert "#SBATCH --time=11" in script and "#SBATCH --partition=cpu" in script
    assert "#   task 2: ddp at world size 4" in script
    assert "'/shared/results/grade-slurm/x y/grade-slurm.json'" in script  # one word, quoted


def test_a_cell_s_runs_are_read_back_as_stored_even_from_a_later_distlab(tmp_path):
    """A Slurm task's cell-<i>.json (and a class job's observations.json: one format, grading/stored.py):
    every Sample read back as it was written; a field only a later Sample has is left out, where the
    cell's own reader raised a TypeError on it."""
    sample = Sample("runs/ddp/20261206-032059-ws2-torchrun", "ok", None, 12.5, {"metrics": {"img_per_sec": 3.0}},
                    observed=[{"name": "clock", "passed": True}], measured={"final_accuracy": 0.5}, reference=2.0,
                    cpu={"ranks": 2})
    runs = {("ddp", 2): [sample], ("check", 1): []}
    write_json(tmp_path / "cell-0.json", {"done": stored.runs_to_json(runs)})
    done = json.loads((tmp_path / "cell-0.json").read_text())["done"]
    assert stored.runs_from_json(done) == runs
    done["ddp@2"][0]["a_later_field"] = [1]
    assert stored.runs_from_json(done) == runs


def test_grade_slurm_without_slurm_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    monkeypatch.chdir(tmp_path)
    assert cli.main(["grade", "--profile", "cpu-smoke", "--labs", "check", "--slurm"]) == 2
    err = capsys.readouterr().err
    assert "--slurm needs Slurm's sbatch and sacct" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_the_class_array_grades_one_job_per_task_at_most_jobs_at_once():
    folder = Path("/shared/results/class/week 4/slurm/20261204-101500-ws2-class-smoke")
    script = class_cluster.array_script(folder, tasks=5, at_once=2, cpus=2, gpus=0, time_limit_s=900,
                                        sbatch_args=["--partition=cpu"])
    lines = script.splitlines()
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    directives = [i for i, line in enumerate(lines) if line.startswith("#SBATCH ")]
    assert directives and max(directives) < first_command  # sbatch reads none after the first command
    options = dict(shlex.split(lines[i])[1].split("=", 1) for i in directives)
    assert options["--array"] == "0-4%2"  # one task per job, at most --jobs of them at once
    assert (options["--nodes"], options["--ntasks"], options["--cpus-per-task"]) == ("1", "1", "2")
    assert options["--time"] == "16" and options["--partition"] == "cpu" and "--gres" not in options
    assert options["--output"] == f"{folder}/task-%a.out"
    assert options["--job-name"] == class_cluster.array_name(folder)
    command = shlex.split(script.split("\nexec ", 1)[1].replace("\\\n", " "))
    assert command == [sys.executable, "-m", "harness.classgrade.cluster", f"{folder}/{class_cluster.JOBS_FILE}",
                       "$SLURM_ARRAY_TASK_ID"]  # task i grades line i of the jobs file
    on_gpus = class_cluster.array_script(folder, tasks=1, at_once=1, cpus=16, gpus=2, time_limit_s=60, sbatch_args=[])
    assert "#SBATCH --array=0-0%1\n" in on_gpus and "#SBATCH --gres=gpu:2\n" in on_gpus


def test_grade_class_slurm_without_slurm_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    submissions = tmp_path / "week4"
    submissions.mkdir()
    shutil.copy(CORRECT, submissions / "alice.py")
    results = tmp_path / "results"
    before = sorted(tmp_path.rglob("*"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no sbatch there
    monkeypatch.chdir(tmp_path)
    assert cli.main(["grade-class", str(submissions), "--slurm", "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert "--slurm needs Slurm's sbatch and sacct on PATH (run it on a login node" in err, err
    assert err.count("\n") == 1, err
    assert sorted(tmp_path.rglob("*")) == before and not results.exists()


# Without a cluster, Slurm's commands are stood in for by scripts (the machine, not distlab's code):
# sbatch says it started and then waits as `sbatch --wait` does, scancel writes what it was asked.
FAKE_SLURM = {
    "sbatch": '#!/bin/sh\ncp "$(eval echo \\${$#})" "$FAKE_SLURM_LOG/submitted.sbatch"\n'
              'touch "$FAKE_SLURM_LOG/waiting"\nexec sleep 600\n',
    "sacct": "#!/bin/sh\nexit 0\n",
    "scancel": '#!/bin/sh\necho "$@" >> "$FAKE_SLURM_LOG/scancel.log"\n',
}


def _stand_in_slurm(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    bin_dir, log = tmp_path / "fake-slurm", tmp_path / "slurm-log"
    bin_dir.mkdir()
    log.mkdir()
    for name, script in FAKE_SLURM.items():
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{BIN}:{os.environ['PATH']}", "FAKE_SLURM_LOG": str(log),
           "PYTHONPATH": str(REPO)}
    return log, env


@pytest.mark.parametrize("command", ["grade", "grade-class"])
def test_a_grader_stopped_while_its_array_waits_cancels_the_array(tmp_path, command):
    """Both --slurm paths share one array module: a grade stopped (SIGTERM) while sbatch --wait waits
    cancels its array by the name the script gave it. `grade --slurm` once left its array queued."""
    log, env = _stand_in_slurm(tmp_path)
    results = tmp_path / "results"
    if command == "grade":
        args = ["grade", "--profile", "cpu-smoke", "--labs", "check", "--world-sizes", "1"]
    else:
        submissions = tmp_path / "week4"
        submissions.mkdir()
        shutil.copy(CORRECT, submissions / "alice.py")
        args = ["grade-class", str(submissions), "--world-sizes", "2", "--lessons", "local"]
    grader = subprocess.Popen([sys.executable, "-m", "harness.commands.cli", *args, "--slurm",
                               "--results", str(results)], env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (log / "waiting").exists():  # the event: sbatch has the array and waits on it
            assert grader.poll() is None, grader.communicate()[0]
            assert time.monotonic() < deadline, "sbatch was never called"
            time.sleep(0.1)
        grader.send_signal(signal.SIGTERM)
        output, _ = grader.communicate(timeout=120)
    finally:
        grader.kill()
    assert grader.returncode != 0, output
    name = next(line.split("=", 1)[1] for line in (log / "submitted.sbatch").read_text().splitlines()
                if line.startswith("#SBATCH --job-name="))
    assert (log / "scancel.log").read_text().split()[0] == f"--name={name}", output
    assert name.startswith("distlab-grade-" if command == "grade" else "distlab-class-")


@pytest.mark.parametrize("command", [["grade", "--profile", "cpu-smoke", "--labs", "check"], ["grade-class"]])
def test_an_sbatch_option_without_slurm_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys, command):
    submissions = tmp_path / "week4"
    submissions.mkdir()
    if command == ["grade-class"]:
        command = ["grade-class", str(submissions)]
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert cli.main([*command, "--sbatch-arg=--partition=cpu", "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert "--sbatch-arg '--partition=cpu' is given without --slurm; add --slurm or drop it" in err, err
    assert err.count("\n") == 1 and sorted(tmp_path.rglob("*")) == before
