"""The Slurm templates and `distlab grade --slurm` on a real Slurm: two nodes on this host.

Run with `nox -s slurm`: it installs slurm-wlm, munge and libpmix-dev where missing, starts the
cluster (tests/slurm_cluster.py) and runs this file in it. Without that cluster every test here
skips, saying so. Each job is submitted with `sbatch --wait`; what a test holds against it is the
job's exit, its state in `sacct` and what it left: the records, and for DDP what the harness's
observer saw on the ranks of both nodes, judged by harness/observe/observations.py as a grade judges a run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_rank_observation

from harness.grading import slurm
from harness.observe import accuracy, data_parallel, observations
from harness.run import job_templates
from harness.run.run_dir import RUN_DIR_PLACEHOLDER
from harness.verdict.tolerances import accuracy_claim_tolerance

REPO = Path(__file__).resolve().parents[1]
CLUSTER = os.environ.get("DISTLAB_SLURM_CLUSTER")
cluster = pytest.mark.skipif(not CLUSTER or not os.environ.get("SLURM_CONF"),
                             reason="needs the two-node Slurm cluster that `nox -s slurm` starts")
JOB_LIMIT_S = 900  # sbatch --wait's ceiling; a ddp smoke job takes about a minute here
BIN = str(Path(sys.executable).parent)  # the jobs inherit PATH: distlab, torchrun, python of this env


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
    rows = {row["JobID"]: row for row in slurm.sacct(job_id)}
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
    assert (summary["runs"], summary["reference_runs"], summary["failed"]) == (2, 2, 0), summary
    (folder,) = [p for p in (results / "grade-slurm").iterdir() if (p / "sacct.json").exists()]
    states = json.loads((folder / "sacct.json").read_text())
    assert [(states[i]["State"], states[i]["ExitCode"]) for i in ("0", "1")] == [("COMPLETED", "0:0")] * 2, states
    # The runs the tasks made, under the shared results, each observed on its node.
    assert len(list(results.glob("ddp/*/run.json"))) == 2
    assert len(list(results.glob("ddp/*-ws2-*/observe/rank.*.json"))) == 2


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


def test_grade_slurm_without_slurm_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    from harness.commands import cli

    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    monkeypatch.chdir(tmp_path)
    assert cli.main(["grade", "--profile", "cpu-smoke", "--labs", "check", "--slurm"]) == 2
    err = capsys.readouterr().err
    assert "--slurm needs Slurm's sbatch and sacct" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
