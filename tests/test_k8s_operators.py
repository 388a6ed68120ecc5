"""The Kubernetes manifests run for real: each operator played with podman on this machine
(tests/k8s_operators.py: the pods, environment, files and names the operator would give them, on
one podman network), in the project's CPU image, as its non-root user, with each pod's CPU limit
as its cgroup quota. What comes back is judged as the grader judges a run: the run directories
and records on the shared claim, and every rank's observations checked by the harness itself.

Opt-in (`nox -s k8s`: builds the image, sets DISTLAB_ENGINE_TESTS=1): it needs root, podman and
the image, and takes minutes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import k8s_operators
import pytest

from harness.observe import accuracy, data_parallel, observations
from harness.observe.check import Check
from harness.run import job_templates
from harness.verdict.tolerances import accuracy_claim_tolerance

ENGINE = os.environ.get("ENGINE", "podman")
IMAGE = os.environ.get("IMAGE", "localhost/distlab:cpu")
CLAIM = "distlab-results"

pytestmark = [pytest.mark.engine, pytest.mark.integration]


@pytest.fixture(autouse=True)
def _needs_the_engine_and_image():
    if os.environ.get("DISTLAB_ENGINE_TESTS") != "1":
        pytest.skip("container tests are opt-in: DISTLAB_ENGINE_TESTS=1 (nox -s k8s runs them)")
    if os.geteuid() != 0:
        pytest.skip("podman here runs as root (docs: environment)")
    missing = k8s_operators.image_present(ENGINE, IMAGE)
    if missing:
        pytest.skip(missing)


def job_for(name: str, lab: str, tmp_path: Path, lab_args: tuple[str, ...] = ("--smoke",), **options):
    shape = job_templates.job_shape(name, lab, 2, 0, None, image=IMAGE, cpus_per_task=1, lab_args=lab_args,
                                    results_claim=CLAIM, **options)
    text = job_templates.render(name, shape)
    (tmp_path / f"{name}.yaml").write_text(text)  # kept beside the results, as submitted
    keys = k8s_operators.key_pair(tmp_path) if name == "k8s-mpijob" else None
    return k8s_operators.plan(text, keys)


def ran(job, tmp_path: Path) -> k8s_operators.Outcome:
    outcome = k8s_operators.run(job, tmp_path / "cluster", engine=ENGINE)
    print(f"{job.kind} {job.name}: {'succeeded' if outcome.succeeded else 'FAILED'} in {outcome.seconds:.0f} s")
    return outcome


def logs(outcome: k8s_operators.Outcome) -> str:
    return "\n".join(f"--- {name} (exit {end.exit_code})\n{end.log[-3000:]}" for name, end in outcome.pods.items())


def judged(observe_dirs: list[Path], record: dict, world_size: int) -> dict[str, Check]:
    """The harness's own checks of the ranks' observations, as a grade computes them."""
    merged = observations.merge(observe_dirs)
    with accuracy.Evaluator() as evaluator:
        measurement = evaluator.measure(merged.directory, ["--smoke"])
    assert measurement.get("accuracy") is not None, measurement
    checks = data_parallel.checks(merged, "gloo" if record["provenance"]["backend"] == "gloo" else "horovod",
                                  world_size, train_set_size=measurement.get("train_size"))
    checks += data_parallel.compare_claims(record, checks, measurement["accuracy"],
                                           accuracy_claim_tolerance(measurement.get("total")),
                                           measured_img_per_sec=observations.throughput(merged))
    failed = [f"{c.name}: {c.detail}" for c in checks if not c.passed]
    assert not failed, failed
    return {c.name: c for c in checks}


def node_runs(results: Path, job_name: str, lab: str) -> list[Path]:
    return sorted(results.glob(f"{job_name}/node*/{lab}/*/run.json"))


@pytest.mark.parametrize(("name", "endpoint"), [("k8s-pytorchjob", "distlab-ddp-master-0:29400"),
                                                ("k8s-trainjob", "distlab-ddp-node-0-0.distlab-ddp:29500")])
def test_a_torchrun_job_runs_distlab_on_every_pod_and_its_runs_are_judged_as_one(name, endpoint, tmp_path):
    job = job_for(name, "ddp", tmp_path)
    outcome = ran(job, tmp_path)
    assert outcome.succeeded, outcome.reason + "\n" + logs(outcome)
    results = k8s_operators.results_folder(tmp_path / "cluster", CLAIM)
    runs = node_runs(results, job.name, "ddp")
    assert len(runs) == 2, logs(outcome)  # one distlab run per pod, each kept on the claim
    for node, run_json in enumerate(runs):
        run = json.loads(run_json.read_text())
        assert run["status"] == "ok" and run["launcher"] == "torchrun"
        assert run["placement"]["node_rank"] == node and run["placement"]["nnodes"] == 2
        assert run["placement"]["rdzv_endpoint"] == endpoint  # the operator's names, through $(...)
        # The pod's CPU limit (1) is its cgroup quota: distlab counted it, not the host's cores.
        assert (run["cpu"]["cores"], run["cpu"]["cgroup_quota"], run["threads_per_rank"]) == (1, 1.0, 1)
        assert run["cpu"]["cores_limited_by"].startswith("cgroup") or run["cpu"]["host_cores"] == 1
    (record_path,) = [p for p in results.rglob("record.json") if json.loads(p.read_text())["status"] == "ok"]
    record = json.loads(record_path.read_text())
    assert record["provenance"]["world_size"] == 2 and record["provenance"]["hardware"]["cores"] == 1
    assert record["provenance"]["hostname"] == job.pods[0].name  # rank 0 on node 0's pod
    checks = judged(sorted(results.glob(f"{job.name}/node*/ddp/*/observe")), record, 2)
    assert "all 2 ranks" in checks["process_group"].detail


def test_an_mpijob_runs_mpirun_over_the_workers_sshd_and_keeps_one_run(tmp_path):
    job = job_for("k8s-mpijob", "horovod", tmp_path)
    outcome = ran(job, tmp_path)
    assert outcome.succeeded, outcome.reason + "\n" + logs(outcome)
    results = k8s_operators.results_folder(tmp_path / "cluster", CLAIM)
    (run_json,) = results.glob(f"{job.name}/horovod/*/run.json")
    run = json.loads(run_json.read_text())
    assert run["status"] == "ok" and run["launcher"] == "mpirun"
    assert run["placement"]["hostfile"] == "/etc/mpi/hostfile"  # the operator's, as written
    record = json.loads((run_json.parent / "record.json").read_text())
    assert record["status"] == "ok" and record["provenance"]["world_size"] == 2
    assert record["provenance"]["hostname"] == "distlab-horovod-worker-0"  # rank 0 on a worker, not the launcher
    observe = run_json.parent / "observe"
    assert sorted(observations.load(observe).ranks) == [0, 1]  # both workers' ranks wrote into the launcher's run
    judged([observe], record, 2)


def test_a_failing_lab_ends_the_job_without_a_restart(tmp_path):
    """ExitCode: rank 1 exits 3, distlab run exits 1, the operator fails the job; only a signal
    (128 and up) would have restarted the pod."""
    job = job_for("k8s-pytorchjob", "check", tmp_path, lab_args=("--fail-rank", "1"))
    started = time.monotonic()
    outcome = ran(job, tmp_path)
    assert not outcome.succeeded
    failed = [end for end in outcome.pods.values() if end.exit_code not in (0, -1)]
    assert failed and all(0 < end.exit_code < 128 and end.attempts == 1 for end in failed), logs(outcome)
    assert time.monotonic() - started < 900
    results = k8s_operators.results_folder(tmp_path / "cluster", CLAIM)
    runs = node_runs(results, job.name, "check")
    assert len(runs) == 2  # one run per pod: none was made again
    assert [json.loads(p.read_text())["status"] for p in runs] == ["failed", "failed"]
    # Which pod fails first is a race (rank 0's consequence, "connection reset", may come first),
    # but the cause is in its node's log as the rank exits, before anything can stop that node.
    assert any("rank 1: exiting with code 3" in (p.parent / "launcher.log").read_text() for p in runs)
