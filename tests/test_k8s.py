"""The Kubernetes manifests (harness/templates/k8s-*.yaml): each rendered one valid against its
operator's CRD, pinned and made strict (an unknown field fails, not only a wrong type), and what the
operator would make of it: the pods, their environment and their commands as the kubelet expands
them (tests/k8s_operators.py), checked against the image they run in (docker/). Running them with
podman: tests/test_k8s_operators.py."""

from __future__ import annotations

import copy
import fnmatch
import json
import re
from pathlib import Path

import jsonschema
import k8s_operators
import pytest
import yaml

from harness.commands import cli
from harness.run import job_templates

ROOT = Path(__file__).resolve().parent.parent
CRDS = Path(__file__).resolve().parent / "fixtures" / "crds"
KINDS = {"k8s-pytorchjob": ["PyTorchJob"], "k8s-mpijob": ["MPIJob"], "k8s-trainjob": ["TrainingRuntime", "TrainJob"]}
LAB = {"k8s-pytorchjob": "ddp", "k8s-mpijob": "horovod", "k8s-trainjob": "ddp"}
# A DNS-1035 label, what a job's name becomes in its pods' and Services' names.
DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


def strict(schema: dict) -> dict:
    """The CRD's schema with additionalProperties: false wherever it lists an object's properties
    and neither allows other keys itself nor keeps unknown fields (x-kubernetes-preserve-unknown-fields):
    what the API server's pruning would silently drop becomes an error here."""
    schema = copy.deepcopy(schema)

    def tighten(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                tighten(value)
        elif isinstance(node, list):
            for item in node:
                tighten(item)

    tighten(schema)
    return schema


def validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(apiVersion, kind) -> a validator of the served version's schema, for every vendored CRD."""
    found = {}
    for path in sorted(CRDS.glob("*.json")):
        crd = json.loads(path.read_text())
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                schema = strict(version["schema"]["openAPIV3Schema"])
                # OpenAPI 3.0's keywords are draft 4's (exclusiveMinimum is a boolean there).
                found[f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"]] = \
                    jsonschema.Draft4Validator(schema)
    return found


VALIDATORS = validators()


def errors(document: dict) -> list[str]:
    validator = VALIDATORS[document["apiVersion"], document["kind"]]
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def render(name: str, nodes: int = 2, gpus: int = 0, **options) -> str:
    shape = job_templates.job_shape(name, LAB[name], nodes, gpus, None, **options)
    return job_templates.render(name, shape)


def documents(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


SHAPES = [dict(nodes=2, gpus=8), dict(nodes=4, gpus=1, ifname="ib0", image="registry.example/distlab:gpu"),
          dict(nodes=2, gpus=0), dict(nodes=1, gpus=0, ranks_per_node=2, cpus_per_task=4),
          dict(nodes=3, gpus=0, lab_args=("--smoke", "--epochs", "1"), results_claim="class-2026.results")]


def test_the_vendored_crds_are_pinned_and_say_where_they_came_from():
    assert {kind for _, kind in VALIDATORS} == {"PyTorchJob", "MPIJob", "TrainJob", "TrainingRuntime"}
    for path in CRDS.glob("*.json"):
        origin = json.loads(path.read_text())["x-distlab-vendored"]
        assert re.fullmatch(r"v\d+\.\d+\.\d+", origin["tag"]) and re.fullmatch(r"[0-9a-f]{40}", origin["commit"])
        assert origin["repository"].startswith("kubeflow/") and len(origin["sha256"]) == 64


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items() if k != "lab_args"))
@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_rendered_manifest_is_valid_against_its_operator_s_crd(name, shape):
    shape = dict(shape)
    text = render(name, shape.pop("nodes"), shape.pop("gpus"), **shape)
    docs = documents(text)
    assert [d["kind"] for d in docs] == KINDS[name]
    for document in docs:
        assert errors(document) == [], text
        assert DNS_LABEL.fullmatch(document["metadata"]["name"])


@pytest.mark.parametrize(("name", "edit", "message"), [
    ("k8s-pytorchjob", lambda d: d["spec"]["runPolicy"].update(backofLimit=3), "'backofLimit' was unexpected"),
    ("k8s-mpijob", lambda d: d["spec"].update(mpiImplementation="OpenMPl"), "'OpenMPl' is not one of"),
    ("k8s-mpijob", lambda d: d["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
     .update(workdir="/workspace"), "'workdir' was unexpected"),
    ("k8s-mpijob", lambda d: d["spec"].update(slotsPerWorker="two"), "'two' is not of type 'integer'"),
    ("k8s-trainjob", lambda d: d["spec"]["trainer"].update(numNodes=None) or d["spec"]["trainer"].pop("image"),
     "None is not of type 'integer'"),
    ("k8s-trainjob", lambda d: d["spec"].update(podSpecOverrides=[]), "'podSpecOverrides' was unexpected"),
], ids=["unknown-field", "bad-enum", "unknown-container-field", "wrong-type", "null", "field-of-another-release"])
def test_the_schema_refuses_what_the_operator_would_refuse_or_drop(name, edit, message):
    """The strict schema fails a misspelt or misplaced field, which the API server would prune
    without a word: that is what a test that cannot fail would miss."""
    document = documents(render(name))[-1]
    assert errors(document) == []
    edit(document)
    assert any(message in error for error in errors(document)), errors(document)


# --- What the operators make of them ------------------------------------------------------------

def test_the_pytorchjob_s_pods_meet_at_the_master_the_operator_names():
    job = k8s_operators.plan(render("k8s-pytorchjob", nodes=3, gpus=0, lab_args=("--smoke", "$(HOME)", "a$$b")))
    assert [p.name for p in job.pods] == ["distlab-ddp-master-0", "distlab-ddp-worker-0", "distlab-ddp-worker-1"]
    for rank, pod in enumerate(job.pods):
        argv = pod.command
        assert argv[:4] == ["distlab", "run", "ddp", "--world-size"] and argv[4] == "3"
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--nnodes") + 1] == "3"
        assert argv[argv.index("--rdzv-endpoint") + 1] == "distlab-ddp-master-0:29400"
        assert argv[argv.index("--results") + 1] == f"/workspace/results/distlab-ddp/node{rank}"
        assert argv[argv.index("--") + 1:] == ["--smoke", "$(HOME)", "a$$b"]  # the lab's, as given
        assert not any("$(" in word for word in argv[:argv.index("--")])  # the operator set every name used
        assert (pod.env["WORLD_SIZE"], pod.env["RANK"], pod.env["PET_NPROC_PER_NODE"]) == ("3", str(rank), "1")
        assert pod.workdir == "/workspace" and pod.user == "1000:1000" and pod.mounts == {
            "/workspace/results": ("pvc:distlab-results", False)}
    assert job.decides == ["distlab-ddp-master-0"] and job.retry_signals == job_templates.BACKOFF_LIMIT


def test_the_trainjob_s_nodes_meet_at_node_0_s_pod():
    job = k8s_operators.plan(render("k8s-trainjob", nodes=2, gpus=4))
    assert [p.name for p in job.pods] == ["distlab-ddp-node-0-0", "distlab-ddp-node-0-1"]
    for rank, pod in enumerate(job.pods):
        argv = pod.command
        assert argv[argv.index("--rdzv-endpoint") + 1] == "distlab-ddp-node-0-0.distlab-ddp:29500"
        assert argv[argv.index("--node-rank") + 1] == str(rank) and argv[argv.index("--world-size") + 1] == "8"
        assert argv[argv.index("--backend") + 1] == "nccl" and pod.cpus == 32  # 8 CPUs for each of 4 GPUs
        assert pod.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    runtime = documents(render("k8s-trainjob"))[0]["spec"]["template"]["spec"]
    (rule,) = runtime["failurePolicy"]["rules"]
    assert rule["action"] == "FailJobSet" and rule["onJobFailureReasons"] == ["PodFailurePolicy"]
    job_spec = runtime["replicatedJobs"][0]["template"]["spec"]
    assert job_spec["backoffLimit"] == 0 and job_spec["template"]["spec"]["restartPolicy"] == "Never"
    assert job_spec["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == [1, 2]  # distlab's own codes


def test_the_mpijob_s_launcher_runs_distlab_over_the_hostfile_the_operator_writes():
    job = k8s_operators.plan(render("k8s-mpijob", nodes=2, gpus=0, ranks_per_node=2, cpus_per_task=4),
                             key_pair=("PRIVATE", "ecdsa-sha2-nistp521 AAAA"))
    launcher = job.pods[-1]
    assert launcher.name == "distlab-horovod-launcher" and job.first == ["distlab-horovod-worker-0",
                                                                         "distlab-horovod-worker-1"]
    argv = launcher.command
    assert argv[:3] == ["distlab", "run", "horovod"] and argv[argv.index("--launcher") + 1] == "mpirun"
    assert argv[argv.index("--hostfile") + 1] == launcher.env["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    assert argv[argv.index("--world-size") + 1] == "4" and argv[argv.index("--threads") + 1] == "2"  # 4 CPUs, 2 ranks
    assert job.files["mpi-job-config"]["hostfile"][0] == (
        "distlab-horovod-worker-0.distlab-horovod.default.svc slots=2\n"
        "distlab-horovod-worker-1.distlab-horovod.default.svc slots=2\n")
    manifest = documents(render("k8s-mpijob"))[0]["spec"]
    assert manifest["runPolicy"]["backoffLimit"] == 0 and manifest["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert {r["restartPolicy"] for r in manifest["mpiReplicaSpecs"].values()} == {"Never"}


def test_the_mpijob_s_workers_run_the_image_s_own_sshd_where_the_key_is_mounted():
    """sshd as the lab user: the image has it (docker/sshd/), it listens where the readiness probe
    and the ssh client look (2222), the key mount is the lab user's ~/.ssh, and the names the
    operator writes into the hostfile are the ones the client config gives that port."""
    job = k8s_operators.plan(render("k8s-mpijob"), key_pair=("PRIVATE", "PUBLIC"))
    manifest = documents(render("k8s-mpijob"))[0]["spec"]
    dockerfiles = [(ROOT / f"docker/Dockerfile.{flavour}").read_text() for flavour in ("cpu", "gpu")]
    for text in dockerfiles:
        assert "openssh-server" in text and "COPY docker/sshd/sshd.sh /usr/local/bin/distlab-sshd" in text
        assert "COPY docker/sshd/ssh_config /etc/ssh/ssh_config.d/" in text
    assert re.search(r"--create-home .*distlab", (ROOT / "docker/add-user.sh").read_text())
    assert manifest["sshAuthMountPath"] == "/home/distlab/.ssh"
    sshd = (ROOT / "docker/sshd/sshd_config").read_text()
    port = int(re.search(r"^Port (\d+)$", sshd, re.M).group(1))
    assert port > 1023 and "UsePAM no" in sshd  # an unprivileged sshd
    for worker in job.pods[:-1]:
        assert worker.command == ["distlab-sshd"] and worker.ready_port == port
    client = (ROOT / "docker/sshd/ssh_config").read_text()
    patterns = re.search(r"^Host (.+)$", client, re.M).group(1).split()
    assert re.search(rf"^\s+Port {port}$", client, re.M)
    for line in job.files["mpi-job-config"]["hostfile"][0].splitlines():
        host = line.split()[0]
        assert any(fnmatch.fnmatch(host, pattern) for pattern in patterns), host
        assert any(fnmatch.fnmatch(f"{host}.cluster.local", pattern) for pattern in patterns)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_the_manifests_run_distlab_from_the_image_s_working_directory_and_keep_results_on_the_claim(name):
    """No relative path into a checkout: the images keep the labs in /opt/distlab/src and set
    WORKDIR /workspace; `distlab run` finds the labs itself. Results under the claim's mount."""
    for text in (ROOT / "docker/Dockerfile.cpu").read_text(), (ROOT / "docker/Dockerfile.gpu").read_text():
        assert re.findall(r"^WORKDIR (\S+)$", text, re.M)[-1] == "/workspace"
    job = k8s_operators.plan(render(name, results_claim="my-claim"), key_pair=("A", "B"))
    for pod in job.pods:
        assert pod.workdir == "/workspace"
        assert pod.mounts["/workspace/results"] == ("pvc:my-claim", False)
        assert not any(word.startswith("labs/") for word in pod.command)
        if pod.command[0] == "distlab":
            assert pod.command[pod.command.index("--results") + 1].startswith("/workspace/results/")


@pytest.mark.parametrize(("argv", "message"), [
    (["k8s-pytorchjob", "--gpus-per-node", "4", "--ranks-per-node", "2"], "one rank per GPU"),
    (["k8s-trainjob", "--gpus-per-node", "0", "--results-claim", "Results_1"], "is not a PersistentVolumeClaim name"),
    (["k8s-pytorchjob", "--gpus-per-node", "0", "--backend", "nccl"], "--backend nccl needs GPUs"),
])
def test_a_manifest_that_cannot_run_is_refused_in_one_line(argv, message, capsys, tmp_path):
    out = tmp_path / "job.yaml"
    assert cli.main(["template", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_cpu_pods_ask_for_cpus_only_and_run_the_cpu_image(capsys):
    assert cli.main(["template", "k8s-pytorchjob", "--gpus-per-node", "0", "--cpus-per-task", "4"]) == 0
    (manifest,) = documents(capsys.readouterr().out)
    container = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "4"} and container["image"].endswith(":cpu")
    assert container["command"][container["command"].index("--backend") + 1] == "gloo"


def test_the_kubelet_s_expansion_as_the_simulation_plays_it():
    env = {"A": "1", "B": "x y"}
    assert k8s_operators.expand("$(A)-$(B)", env) == "1-x y"
    assert k8s_operators.expand("$(C)", env) == "$(C)"  # unset: as written
    assert k8s_operators.expand("$$(A)", env) == "$(A)" and k8s_operators.expand("a$$b", env) == "a$b"
    assert k8s_operators.expand("$", env) == "$" and k8s_operators.expand("$(A", env) == "$(A"
