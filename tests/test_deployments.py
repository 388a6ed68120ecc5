"""Where users run distlab, with the project's own artifacts, in the default suite.

The slow proofs (nox -s gradescope: a Gradescope-like container; nox -s k8s: the operators played
with podman; nox -s gpu-proxy; nox -s slurm; all four: nox -s verify-deploy) need an engine, root or
minutes. These run the same artifacts on this host in seconds to a minute each, so that a change to
the packaging, the sandbox, the bundle or the templates is seen by the next run of the suite:

- the Gradescope bundle as `grade-class --autograder` builds it, unpacked as its setup.sh does, its
  run_autograder run as Gradescope runs it (in the /autograder tree, as root, with the uid sandbox a
  container without namespaces gets) on one submission; results.json checked against Gradescope's
  format (tests/fixtures/gradescope/results.schema.json);
- each Kubernetes manifest `distlab template` renders: its container's command run on this host as the
  pod would run it (its argv, its env, its working folder), the operator's variables set as
  tests/k8s_operators.py sets them.

A stand-in is used only for the machine: a bubblewrap that cannot make namespaces (Gradescope's
container), the venv setup.sh makes (this environment's packages, without distlab).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import jsonschema
import k8s_operators
import pytest
from conftest import HOROVOD, MPI, python_without_distlab

from labs.common.host import free_port

REPO = Path(__file__).resolve().parent.parent
DISTLAB = str(Path(sys.executable).parent / "distlab")
RESULTS_SCHEMA = json.loads((REPO / "tests/fixtures/gradescope/results.schema.json").read_text())
LESSONS = "https://example.org/course/blob/main/"


# ------------------------------------------------------------------------------------ Gradescope

def gradescope_tree(root: Path, bundle: Path, submission: dict[str, str]) -> None:
    """/autograder as Gradescope lays it out after setup.sh: source (the bundle unzipped, distlab.tar
    unpacked as setup.sh does), run_autograder copied to the top, the venv, the submission, the metadata."""
    source = root / "source"
    zipfile.ZipFile(bundle).extractall(source)
    (source / "distlab").mkdir()
    with tarfile.open(source / "distlab.tar") as tar:  # setup.sh: tar -C "$source/distlab" -xf distlab.tar
        tar.extractall(source / "distlab", filter="data")
    shutil.copy(source / "run_autograder", root / "run_autograder")
    (root / "run_autograder").chmod(0o755)
    python_without_distlab(root / "venv")  # setup.sh's venv: torch and distlab's dependencies, no distlab
    (root / "submission").mkdir()
    for name, text in submission.items():
        (root / "submission" / name).write_text(text)
    (root / "submission_metadata.json").write_text(json.dumps(
        {"assignment": {"due_date": "2026-12-10T23:59:00.000000-08:00", "late_due_date": None}, "users": []}))


# Small: it starts as a rank would, under the sandbox's uid, and fails at once (a whole correct grade
# took 290 s here: the opt-in nox -s gradescope grades those, in the container).
SMALL_SUBMISSION = """import os, sys
print("rank", os.environ.get("RANK"), "as uid", os.getuid(), flush=True)
sys.exit(3)
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="Gradescope runs run_autograder as root, and the uid sandbox needs root and setpriv")
@pytest.mark.integration
@pytest.mark.timeout(960)  # its grade's own limit is 900 s
def test_the_bundle_grades_a_submission_in_gradescope_s_tree_with_the_uid_sandbox(tmp_path, python_others_may_run):
    made = subprocess.run([DISTLAB, "grade-class", str(tmp_path / "none"), "--autograder", str(tmp_path / "ag.zip"),
                           "--lessons", LESSONS], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    # Below folders other users may pass (pytest's are closed): the job's uid reads the harness there.
    root = Path(tempfile.mkdtemp(prefix="distlab-autograder-", dir="/var/tmp"))
    try:
        root.chmod(0o755)
        gradescope_tree(root, tmp_path / "ag.zip", {"train.py": SMALL_SUBMISSION})
        # Gradescope's container grants no namespaces: a bubblewrap that cannot make them stands in.
        no_namespaces = tmp_path / "no-namespaces"
        no_namespaces.mkdir()
        (no_namespaces / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\n"
                                             "exit 1\n")
        (no_namespaces / "bwrap").chmod(0o755)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DISTLAB_OBSERVE_DIR")}
        env.update(AUTOGRADER_ROOT=str(root), PATH=f"{no_namespaces}:{env.get('PATH', '')}")
        done = subprocess.run([str(root / "run_autograder")], cwd=root, env=env, capture_output=True, text=True,
                              timeout=900, stdin=subprocess.DEVNULL)
        results = json.loads((root / "results" / "results.json").read_text())
        jsonschema.validate(results, RESULTS_SCHEMA)
        distlab = results["extra_data"]["distlab"]
        # It ran in the sandbox, as its uid, and failed at once: not a grade, and the student is told why.
        assert distlab["status"] == "ungradable", f"{results['output'][:2000]}\n{done.stdout[-3000:]}"
        assert "rank 0 exited with code 3" in distlab["reason"] and results["tests"][0]["tags"] == ["ungradable"]
        assert distlab["sandbox"] == "uid" and "uid sandbox" in results["output"]
        config = json.loads((root / "source" / "autograder.json").read_text())
        assert results["score"] == 0.0 and 0 <= results["execution_time"] < config["timeout_s"]
        # uid mode closes the bundle's source and the results to other users (Gradescope's advice).
        assert not os.stat(root / "source" / "rubric.toml").st_mode & 0o007
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------------------------------------ Kubernetes


def on_this_host(job: k8s_operators.Job, workspace: Path, mpi_config: Path) -> list[tuple[str, list[str], dict]]:
    """Each pod that runs distlab, as the pod would run it, with what stands for the cluster mapped to
    this host: the pods' names to 127.0.0.1 (one host), the rendezvous port to a free one (each pod
    has its own network there), the image's /workspace and the MPIJob's /etc/mpi to folders here."""
    names = sorted({name for pod in job.pods for name in pod.names}, key=len, reverse=True)
    port = str(free_port())

    def here(word: str) -> str:
        for name in names:
            word = word.replace(f"{name}:", "127.0.0.1:") if f"{name}:" in word else (
                "127.0.0.1" if word == name else word)
        word = word.replace(":29400", f":{port}").replace(":29500", f":{port}")
        return word.replace("/workspace", str(workspace)).replace("/etc/mpi", str(mpi_config))

    started = []
    for pod in job.pods:
        if pod.command[:1] != ["distlab"]:
            continue  # the MPIJob's workers: sshd, which mpirun reaches (here: this host, no ssh)
        env = {key: here(value) for key, value in pod.env.items()}
        env = {**env, **{k: port for k in ("MASTER_PORT", "PET_MASTER_PORT") if k in env}}
        started.append((pod.name, [here(word) for word in pod.command], env))
    return started


@pytest.mark.integration
@pytest.mark.parametrize("name", ["k8s-pytorchjob", "k8s-trainjob", "k8s-mpijob"])
def test_each_manifest_s_command_runs_on_this_host_as_its_pods_would(name, tmp_path):
    """`distlab template` renders the manifest; each pod's container command (argv as the kubelet
    expands it, the env the operator gives, the working folder) runs here, the pods at once. The check
    lab: seconds long; the operators with podman and the CPU image: nox -s k8s."""
    if name == "k8s-mpijob" and not (HOROVOD and MPI):
        pytest.skip("the MPIJob's launcher runs Horovod over mpirun: `make setup` builds them")
    rendered = tmp_path / "job.yaml"
    made = subprocess.run([DISTLAB, "template", name, "--lab", "check", "--nodes", "2", "--gpus-per-node", "0",
                           "--out", str(rendered)], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    job = k8s_operators.plan(rendered.read_text(), key_pair=("unused", "unused"))
    workspace, mpi_config = tmp_path / "workspace", tmp_path / "etc-mpi"
    workspace.mkdir()
    mpi_config.mkdir()
    slots = sum(1 for pod in job.pods if pod.role == "worker")
    (mpi_config / "hostfile").write_text(f"localhost slots={max(slots, 2)}\n")  # the workers: this host
    pods = on_this_host(job, workspace, mpi_config)
    assert pods and all(argv[0] == "distlab" for _, argv, _ in pods)
    base = {k: v for k, v in os.environ.items() if k not in ("DISTLAB_OBSERVE_DIR",)}
    base["PATH"] = f"{Path(sys.executable).parent}:{base.get('PATH', '')}"  # the image's distlab on its PATH
    running = [(pod, subprocess.Popen(argv, cwd=workspace, env={**base, **env}, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL))
               for pod, argv, env in pods]
    outputs = {pod: process.communicate(timeout=600)[0] for pod, process in running}
    codes = {pod: process.returncode for pod, process in running}
    assert set(codes.values()) == {0}, {pod: outputs[pod][-2000:] for pod in codes if codes[pod]}
    runs = [json.loads(p.read_text()) for p in sorted(workspace.glob("results/**/run.json"))]
    assert runs and {run["status"] for run in runs} == {"ok"}, runs
    assert max(run["world_size"] for run in runs) == 2
