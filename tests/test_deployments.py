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
import pytest
from conftest import python_without_distlab

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
