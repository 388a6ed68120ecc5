"""The Kubeflow operators, played on one machine: the pods each would create for a rendered manifest,
with exactly the environment, files, names and commands the operator gives them, run with podman.

What an operator adds, read from its source at the release the templates are pinned to:

- training-operator v1.9.0 (pkg/controller.v1/pytorch/envvar.go, master.go): every container gets
  PYTHONUNBUFFERED=1; with a Master replica, MASTER_PORT and PET_MASTER_PORT (the Master
  container's port named pytorchjob-port), MASTER_ADDR and PET_MASTER_ADDR (<job>-master-0),
  WORLD_SIZE (replicas x nprocPerNode), RANK and PET_NODE_RANK (the Master 0, worker i i + 1),
  PET_NPROC_PER_NODE (spec.nprocPerNode), and without an elasticPolicy PET_NNODES (the replicas).
  Pods are <job>-master-0 and <job>-worker-<i>, each behind a Service of its own name. With the
  ExitCode restart policy (pkg/controller.v1/common/pod.go), a pod that ended with 128 or more is
  restarted, up to runPolicy.backoffLimit, and any other failure fails the job; the job succeeds
  when the Master does.
- mpi-operator v0.8.0 (pkg/controller/mpi_job_controller.go): workers <job>-worker-<i> in the
  subdomain <job>, reached as <job>-worker-<i>.<job>.<namespace>.svc, env K_MPI_JOB_ROLE=worker;
  the launcher <job>-launcher, env K_MPI_JOB_ROLE=launcher, OMPI_MCA_orte_keep_fqdn_hostnames=true,
  OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile, OMPI_MCA_plm_rsh_args="-o ConnectionAttempts=10",
  OMPI_MCA_orte_set_default_slots=<slotsPerWorker>, NVIDIA_VISIBLE_DEVICES and
  NVIDIA_DRIVER_CAPABILITIES empty; /etc/mpi holds hostfile ("<worker> slots=<n>" per worker, mode
  0444) and discover_hosts.sh (0555); an ECDSA P-521 key pair (a Secret: id_rsa, id_rsa.pub,
  authorized_keys) is mounted at sshAuthMountPath in every pod (mode 0600 only at /root/.ssh). With
  launcherCreationPolicy WaitForWorkersReady the launcher starts once every worker is ready. The
  launcher is a batch Job with backoffLimit runPolicy.backoffLimit; the job ends with it.
- Trainer v2.3.0 (pkg/runtime/framework/plugins/torch/torch.go, pkg/constants): the TrainJob's
  trainer.env, then PET_NNODES (numNodes), PET_NPROC_PER_NODE (numProcPerNode), PET_NODE_RANK (the
  pod's completion index), PET_MASTER_ADDR (<job>-node-0-0.<job>) and PET_MASTER_PORT (29500) on the
  container named node; the Indexed Job adds JOB_COMPLETION_INDEX. Pods <job>-node-0-<i> in the
  subdomain <job>. The job set succeeds when every node does; the runtime's failure policy decides
  the rest (here: a lab's exit code 1 or 2 fails it, tests/test_k8s.py checks the rules).

Kubernetes itself: the kubelet expands $(NAME) in a container's command from its environment and
turns $$ into $; runAsUser/runAsGroup/fsGroup become the user and groups; a CPU limit becomes the
cgroup's CPU quota (podman --cpus); a memory-backed emptyDir at /dev/shm, its size; a
PersistentVolumeClaim, a folder shared by every pod. Names resolve as cluster DNS would resolve
them: every pod's names are given to every pod (podman --add-host) on one podman network, the
only network used, with addresses from 198.18.0.0/15 (never routed anywhere).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

NAMESPACE = "default"
RESULTS_MOUNT = "/workspace/results"


@dataclass
class Pod:
    """One pod as an operator would create it: what podman needs to run its one container."""

    name: str  # also its hostname
    role: str
    image: str
    command: list[str]  # expanded as the kubelet would
    env: dict[str, str]
    names: list[str]  # what other pods call it (its Service's or subdomain's DNS names)
    workdir: str | None = None
    user: str | None = None  # uid:gid
    groups: list[str] = field(default_factory=list)
    cpus: float | None = None
    shm_size: str | None = None
    mounts: dict[str, tuple[str, bool]] = field(default_factory=dict)  # container path -> (volume, read-only)
    ready_port: int | None = None


@dataclass
class Job:
    """A job's pods, which start first, and how the operator decides it is over."""

    kind: str
    name: str
    pods: list[Pod]
    first: list[str]  # pods that must be ready before the others are created (MPIJob: the workers)
    decides: list[str]  # pods whose end decides the job (PyTorchJob: Master; MPIJob: launcher; TrainJob: all)
    retry_signals: int = 0  # restarts allowed of a pod ended by a signal (exit code >= 128)
    files: dict[str, dict[str, tuple[str, int]]] = field(default_factory=dict)  # volume -> name -> (text, mode)


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's $(NAME) expansion (k8s.io/kubernetes third_party/forked/golang/expansion):
    $(NAME) becomes its value where NAME is set, stays as written where not; $$ becomes $."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            if text[i + 1] == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2:end]
                    out.append(env[name] if name in env else text[i:end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _container_env(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in container.get("env", []) if "value" in item}


def _pod(name: str, role: str, template: dict[str, Any], injected: dict[str, str], names: list[str],
         container_name: str | None = None) -> Pod:
    spec = template["spec"]
    containers = spec["containers"]
    container = next(c for c in containers if container_name in (None, c["name"]))
    env = {**_container_env(container), **injected}  # the operator appends; the later entry wins
    security = spec.get("securityContext", {})
    user = f"{security['runAsUser']}:{security.get('runAsGroup', security['runAsUser'])}" \
        if "runAsUser" in security else None
    cpus = container.get("resources", {}).get("limits", {}).get("cpu")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts: dict[str, tuple[str, bool]] = {}
    shm = None
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "emptyDir" in volume and mount["mountPath"] == "/dev/shm":
            shm = volume["emptyDir"].get("sizeLimit", "64Mi").replace("Gi", "g").replace("Mi", "m")
        elif "persistentVolumeClaim" in volume:
            mounts[mount["mountPath"]] = (f"pvc:{volume['persistentVolumeClaim']['claimName']}", False)
    probe = container.get("readinessProbe", {}).get("tcpSocket", {}).get("port")
    return Pod(name=name, role=role, image=container["image"],
               command=[expand(word, env) for word in [*container.get("command", []), *container.get("args", [])]],
               env=env, names=names, workdir=container.get("workingDir"), user=user,
               groups=[str(security["fsGroup"])] if "fsGroup" in security else [],
               cpus=float(cpus) if cpus is not None else None, shm_size=shm, mounts=mounts, ready_port=probe)


def pytorchjob(manifest: dict[str, Any]) -> Job:
    """The pods of a kubeflow.org/v1 PyTorchJob (training-operator v1.9.0), without an elasticPolicy."""
    name, spec = manifest["metadata"]["name"], manifest["spec"]
    assert "elasticPolicy" not in spec, "the simulation plays the operator without an elastic policy"
    replicas = spec["pytorchReplicaSpecs"]
    total = sum(r.get("replicas", 1) for r in replicas.values())
    nproc = spec.get("nprocPerNode")
    master = replicas["Master"]["template"]
    port = next(p["containerPort"] for c in master["spec"]["containers"] if c["name"] == "pytorch"
                for p in c.get("ports", []) if p["name"] == "pytorchjob-port")
    pods = []
    for rtype, replica in replicas.items():
        for index in range(replica.get("replicas", 1)):
            rank = index + (1 if rtype == "Worker" else 0)
            injected = {"PYTHONUNBUFFERED": "1", "MASTER_PORT": str(port), "PET_MASTER_PORT": str(port),
                        "MASTER_ADDR": f"{name}-master-0", "PET_MASTER_ADDR": f"{name}-master-0",
                        "WORLD_SIZE": str(total * (int(nproc) if nproc and nproc.isdigit() else 1)),
                        "RANK": str(rank), "PET_NODE_RANK": str(rank),
                        **({"PET_NPROC_PER_NODE": nproc} if nproc is not None else {}), "PET_NNODES": str(total)}
            pod_name = f"{name}-{rtype.lower()}-{index}"
            pods.append(_pod(pod_name, rtype.lower(), replica["template"], injected, [pod_name], "pytorch"))
    assert {r["restartPolicy"] for r in replicas.values()} == {"ExitCode"}
    return Job("PyTorchJob", name, pods, first=[], decides=[f"{name}-master-0"],
               retry_signals=spec["runPolicy"].get("backoffLimit", 0))


def mpijob(manifest: dict[str, Any], key_pair: tuple[str, str]) -> Job:
    """The pods and files of a kubeflow.org/v2beta1 MPIJob (mpi-operator v0.8.0), Open MPI.
    `key_pair`: the Secret's private key (PEM) and public key (authorized_keys line)."""
    name, spec = manifest["metadata"]["name"], manifest["spec"]
    slots = spec.get("slotsPerWorker", 1)
    replicas = spec["mpiReplicaSpecs"]
    workers = replicas["Worker"].get("replicas", 0)
    domain = f"{name}.{NAMESPACE}.svc"
    worker_names = [f"{name}-worker-{i}" for i in range(workers)]
    hostfile = "".join(f"{w}.{domain} slots={slots}\n" for w in worker_names)
    discover = "#!/bin/sh\n" + "".join(f"echo {w}.{domain}\n" for w in worker_names)
    ssh_path = spec.get("sshAuthMountPath", "/root/.ssh")
    key_mode = 0o600 if ssh_path == "/root/.ssh" else 0o644
    private, public = key_pair
    files = {"ssh-auth": {"id_rsa": (private, key_mode), "id_rsa.pub": (public, key_mode),
                          "authorized_keys": (public, key_mode)},
             "mpi-job-config": {"hostfile": (hostfile, 0o444), "discover_hosts.sh": (discover, 0o555)}}
    pods = []
    for worker in worker_names:
        pod = _pod(worker, "worker", replicas["Worker"]["template"], {"K_MPI_JOB_ROLE": "worker"},
                   [worker, f"{worker}.{domain}", f"{worker}.{domain}.cluster.local"])
        if not pod.command:
            pod.command = ["/usr/sbin/sshd", "-De"]
        pod.mounts[ssh_path] = ("ssh-auth", True)
        pods.append(pod)
    launcher_env = {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                    "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                    "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
                    "OMPI_MCA_orte_set_default_slots": str(slots),
                    "NVIDIA_VISIBLE_DEVICES": "", "NVIDIA_DRIVER_CAPABILITIES": ""}
    launcher = _pod(f"{name}-launcher", "launcher", replicas["Launcher"]["template"], launcher_env,
                    [f"{name}-launcher", f"{name}-launcher.{domain}"])
    launcher.mounts[ssh_path] = ("ssh-auth", True)
    launcher.mounts["/etc/mpi"] = ("mpi-job-config", True)
    pods.append(launcher)
    wait = spec.get("launcherCreationPolicy") == "WaitForWorkersReady"
    return Job("MPIJob", name, pods, first=worker_names if wait else [], decides=[launcher.name],
               retry_signals=spec.get("runPolicy", {}).get("backoffLimit", 0), files=files)


TRAINER_PORT = 29500  # Trainer v2.3.0 pkg/constants ContainerTrainerPort


def trainjob(documents: list[dict[str, Any]]) -> Job:
    """The pods of a trainer.kubeflow.org/v1alpha1 TrainJob on the TrainingRuntime beside it (Trainer v2.3.0)."""
    runtime = next(d for d in documents if d["kind"] == "TrainingRuntime")
    train = next(d for d in documents if d["kind"] == "TrainJob")
    name, trainer = train["metadata"]["name"], train["spec"]["trainer"]
    assert train["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    (node_job,) = [j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "node"]
    template = json.loads(json.dumps(node_job["template"]["spec"]["template"]))  # the runtime's, with the job's
    container = next(c for c in template["spec"]["containers"] if c["name"] == "node")
    container.update(image=trainer["image"], command=trainer["command"], env=trainer.get("env", []),
                     resources=trainer.get("resourcesPerNode", {}))
    nodes = trainer.get("numNodes", runtime["spec"]["mlPolicy"].get("numNodes", 1))
    pods = []
    for index in range(nodes):
        injected = {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(trainer.get("numProcPerNode", "auto")),
                    "PET_NODE_RANK": str(index), "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
                    "PET_MASTER_PORT": str(TRAINER_PORT), "JOB_COMPLETION_INDEX": str(index)}
        pod_name = f"{name}-node-0-{index}"
        pods.append(_pod(pod_name, "node", template, injected,
                         [pod_name, f"{pod_name}.{name}", f"{pod_name}.{name}.{NAMESPACE}.svc"], "node"))
    return Job("TrainJob", name, pods, first=[], decides=[p.name for p in pods])


def plan(text: str, key_pair: tuple[str, str] | None = None) -> Job:
    """The job a rendered manifest asks its operator for."""
    documents = [d for d in yaml.safe_load_all(text) if d]
    kinds = {d["kind"] for d in documents}
    if "PyTorchJob" in kinds:
        return pytorchjob(documents[0])
    if "MPIJob" in kinds:
        return mpijob(documents[0], key_pair or ("", ""))
    return trainjob(documents)


# ------------------------------------------------------------------------------ run with podman

@dataclass
class Ended:
    """A pod's end: its exit code and its log (what `kubectl logs` would show)."""

    exit_code: int
    log: str
    attempts: int = 1


@dataclass
class Outcome:
    job: str
    succeeded: bool
    pods: dict[str, Ended]
    seconds: float
    reason: str = ""


class Podman:
    """The podman commands the simulation uses: one network, containers by name, all removed after."""

    def __init__(self, engine: str = "podman") -> None:
        self.engine = engine
        self.tag = uuid.uuid4().hex[:8]
        self.network = f"distlab-sim-{self.tag}"
        self.subnet_octet = int(self.tag[:2], 16) % 250 + 1
        self.containers: list[str] = []

    def __call__(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([self.engine, *args], capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{self.engine} {' '.join(args[:3])}: {done.stderr.strip()[-2000:]}")
        return done

    def address(self, index: int) -> str:
        return f"198.18.{self.subnet_octet}.{index + 10}"

    def create_network(self) -> None:
        self("network", "create", "--subnet", f"198.18.{self.subnet_octet}.0/24", self.network)

    def remove_all(self) -> None:
        for name in self.containers:
            self("rm", "--force", "--time", "5", name, check=False, timeout=120)
        self("network", "rm", "--force", self.network, check=False, timeout=120)


def key_pair(folder: Path) -> tuple[str, str]:
    """An ECDSA P-521 key pair in PEM, as the MPI operator makes for each job's Secret."""
    key = folder / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-m", "PEM", "-N", "", "-f", str(key),
                    "-C", ""], check=True, capture_output=True, timeout=60)
    return key.read_text(), key.with_suffix(".pub").read_text()


def run(job: Job, workspace: Path, timeout_s: float = 1200, engine: str = "podman") -> Outcome:
    """Run the job's pods with podman as its operator would, until the operator would call it done.
    `workspace`: where the volumes live (the claim's folder is workspace/pvc-<claim>). Every
    container and the network are removed, whatever happens."""
    podman = Podman(engine)
    started = time.monotonic()
    volumes: dict[str, Path] = {}
    for volume, files in job.files.items():
        folder = workspace / volume
        folder.mkdir(parents=True)
        for file, (text, mode) in files.items():
            (folder / file).write_text(text)
            (folder / file).chmod(mode)
            os.chown(folder / file, 0, 1000)  # the kubelet: root-owned, the fsGroup's group
        volumes[volume] = folder
    for pod in job.pods:
        for volume, _ in pod.mounts.values():
            if volume.startswith("pvc:") and volume not in volumes:
                folder = workspace / volume.replace(":", "-")
                folder.mkdir(parents=True)
                os.chown(folder, 0, 1000)  # fsGroup: the group owns the volume, setgid keeps it so
                folder.chmod(0o2775)
                volumes[volume] = folder
    hosts = [f"{name}:{podman.address(i)}" for i, pod in enumerate(job.pods) for name in pod.names]
    ended: dict[str, Ended] = {}
    attempts = {pod.name: 0 for pod in job.pods}

    def start(index: int, pod: Pod) -> str:
        attempts[pod.name] += 1
        container = f"{pod.name}-{podman.tag}-{attempts[pod.name]}"
        args = ["run", "--detach", "--name", container, "--hostname", pod.name, "--network", podman.network,
                "--ip", podman.address(index)]
        for host in hosts:
            args += ["--add-host", host]
        for name, value in pod.env.items():
            args += ["--env", f"{name}={value}"]
        if pod.workdir:
            args += ["--workdir", pod.workdir]
        if pod.user:
            args += ["--user", pod.user]
        for group in pod.groups:
            args += ["--group-add", group]
        if pod.cpus:
            args += ["--cpus", f"{pod.cpus:g}"]
        if pod.shm_size:
            args += ["--shm-size", pod.shm_size]
        for path, (volume, read_only) in pod.mounts.items():
            args += ["--volume", f"{volumes[volume]}:{path}:{'ro' if read_only else 'rw'}"]
        podman.containers.append(container)
        podman(*args, pod.image, *pod.command)
        return container

    def ready(pod: Pod, container: str) -> bool:
        if podman("inspect", "--format", "{{.State.Running}}", container).stdout.strip() != "true":
            return False
        if pod.ready_port is None:
            return True
        with contextlib.suppress(OSError), socket.create_connection(
                (podman.address(job.pods.index(pod)), pod.ready_port), timeout=2):
            return True
        return False

    outcome = None
    try:
        podman.create_network()
        running: dict[str, str] = {}
        later = [(i, p) for i, p in enumerate(job.pods) if job.first and p.name not in job.first]
        for index, pod in enumerate(job.pods):
            if not (job.first and pod.name not in job.first):
                running[pod.name] = start(index, pod)
        deadline = time.monotonic() + timeout_s
        while later and time.monotonic() < deadline:  # WaitForWorkersReady
            if all(ready(p, running[p.name]) for p in job.pods if p.name in job.first):
                for index, pod in later:
                    running[pod.name] = start(index, pod)
                later = []
            else:
                time.sleep(1)
        retries_left = job.retry_signals
        while outcome is None:
            if time.monotonic() > deadline:
                outcome = Outcome(job.name, False, ended, time.monotonic() - started, f"timed out after {timeout_s} s")
                break
            for pod in job.pods:
                container = running.get(pod.name)
                if container is None or pod.name in ended:
                    continue
                state = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", container).stdout.split()
                if state[0] != "exited":
                    continue
                code = int(state[1])
                log = podman("logs", container, check=False).stdout
                if code >= 128 and retries_left > 0:  # a signal: the operator makes the pod again
                    retries_left -= 1
                    running[pod.name] = start(job.pods.index(pod), pod)
                    continue
                ended[pod.name] = Ended(code, log, attempts[pod.name])
                if code != 0:
                    outcome = Outcome(job.name, False, ended, time.monotonic() - started,
                                      f"{pod.name} failed with exit code {code}")
                    break
            if outcome is None and all(name in ended for name in job.decides):
                outcome = Outcome(job.name, True, ended, time.monotonic() - started)
            if outcome is None:
                time.sleep(1)
        for pod in job.pods:  # cleanPodPolicy Running: what still runs is stopped, its log kept
            if pod.name in running and pod.name not in ended:
                podman("stop", "--time", "30", running[pod.name], check=False)  # the default grace period
                ended[pod.name] = Ended(-1, podman("logs", running[pod.name], check=False).stdout, attempts[pod.name])
    finally:
        podman.remove_all()
    outcome.seconds = time.monotonic() - started
    return outcome


def image_present(engine: str, image: str) -> str | None:
    """None where the engine has the image, else why the simulation cannot run."""
    if not shutil.which(engine):
        return f"{engine} is not installed (`nox -s k8s` installs it on Debian)"
    if subprocess.run([engine, "image", "exists", image], capture_output=True, timeout=120).returncode != 0:
        return f"{engine} has no image {image}; `nox -s k8s` builds it (docker/build-image.sh cpu)"
    return None


def results_folder(workspace: Path, claim: str) -> Path:
    return workspace / f"pvc-{claim}"

