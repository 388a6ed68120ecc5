"""`distlab template`: job files for the engines clusters already have (Slurm, Kubernetes).

The files under harness/templates/ are complete examples with {placeholders}; this fills
them in for a lab, a node count and GPUs per node. distlab itself starts nothing remotely:
every job runs `distlab run` where it can (torchrun per node, mpirun on the MPIJob's launcher),
so each keeps its run directories, observations and records as a run on one machine does.
`--gpus-per-node 0` is a CPU cluster: no GPU is requested, the torch labs use Gloo, and each
rank gets its CPUs' worth of threads. tests/test_slurm.py submits both Slurm files to a real
Slurm (`nox -s slurm`); tests/test_k8s.py validates every manifest against its operator's CRD
and tests/test_k8s_operators.py runs them with podman as the operators would (`nox -s k8s`).

Every value is checked (TemplateError names the option and the form expected) and quoted for
where it lands: shell words with shlex.quote (twice inside `bash -c '...'`), YAML strings as JSON.
No value may hold a newline, so none can add a line (an #SBATCH directive, a command) to a job.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from harness.catalog import LABS, find_lab
from harness.usage import UsageError

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "templates"
TEMPLATES = {
    "slurm-torchrun": ("slurm-torchrun.sbatch", "torchrun per node, c10d rendezvous on the first node"),
    "slurm-mpi": ("slurm-mpi.sbatch", "srun starts one task per rank (Horovod, mpi4py, or torch via env)"),
    "k8s-pytorchjob": ("k8s-pytorchjob.yaml", "Kubeflow PyTorchJob (training operator v1): torchrun in every pod"),
    "k8s-trainjob": ("k8s-trainjob.yaml", "Kubeflow Trainer v2 TrainJob: torchrun in every node"),
    "k8s-mpijob": ("k8s-mpijob.yaml", "Kubeflow MPIJob: mpirun over worker pods (Horovod)"),
}
# The published images (docker/README.md); the CPU one for pods that ask for no GPU.
DEFAULT_IMAGE = {True: "ghcr.io/distlab/distlab:gpu", False: "ghcr.io/distlab/distlab:cpu"}
# Kubernetes: restarts of a job whose pod a signal ended (evicted, preempted), never of a lab that
# failed; and how long a node waits for node 0's name and rendezvous (pods start minutes apart
# while a node pulls the image).
BACKOFF_LIMIT = 3
K8S_RDZV_TIMEOUT_S = 600
# What each free-text option may hold: an interface name (Linux: at most 15 characters), a Slurm
# time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS), an image reference (registry/name:tag,
# @digest, enroot's registry#image).
FORMS = {
    "ifname": (re.compile(r"[A-Za-z0-9_.:-]{1,15}"), "an interface name like eth0 or ib0"),
    "time_limit": (re.compile(r"(?:[0-9]{1,4}-)?[0-9]{1,4}(?::[0-9]{1,2}){0,2}"), "a Slurm time like 00:30:00 or 1-12"),
    "image": (re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@#+-]{0,254}"), "an image like registry/name:tag"),
    "results_claim": (re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?"),
                      "a PersistentVolumeClaim name (lowercase letters, digits, '-', '.')"),
}


class TemplateError(ValueError):
    """A value that cannot go into a job file; the message names the option and the form expected."""


def default_backend(name: str, lab: str, gpus_per_node: int) -> str:
    """The backend a job uses when none is asked for: Horovod for the MPI files where the lab has
    it, else the lab's GPU backend on GPU nodes and its CPU backend (Gloo) on CPU nodes."""
    spec = LABS[lab]
    if name in ("slurm-mpi", "k8s-mpijob") and "horovod" in spec.backends:
        return "horovod"
    return spec.gpu_backend if gpus_per_node and spec.gpu_backend else spec.default_backend


def job_shape(name: str, lab: str, nodes: int, gpus_per_node: int, backend: str | None, **options: object
              ) -> JobShape:
    """The job `distlab template NAME` asks for: the lab's, on the backend asked for or its default
    one (default_backend), which the lab must use; TemplateError naming the fix otherwise."""
    try:
        spec = find_lab(lab)
        backend = backend or default_backend(name, lab, gpus_per_node)
        spec.check_backend(backend)
    except UsageError as error:
        raise TemplateError(str(error)) from None
    return JobShape(lab, nodes, gpus_per_node, backend, **options)  # type: ignore[arg-type]


def _check(name: str, shape: JobShape) -> None:
    for key, (form, expected) in FORMS.items():
        value = getattr(shape, key)
        if value and not form.fullmatch(value):
            raise TemplateError(f"--{_OPTION.get(key, key)} {value!r} is not {expected}")
    try:
        find_lab(shape.lab)
    except UsageError as error:
        raise TemplateError(str(error)) from None
    if not re.fullmatch(r"[a-z0-9_]{1,32}", shape.backend):
        raise TemplateError(f"backend {shape.backend!r} is not a backend name")
    if shape.gpus_per_node < 0 or shape.ranks_per_node < 0 or shape.nodes < 1:
        raise TemplateError("--nodes must be at least 1, --gpus-per-node and --ranks-per-node at least 0")
    if shape.backend == "nccl" and not shape.gpus_per_node:
        raise TemplateError("--backend nccl needs GPUs and --gpus-per-node 0 asks for none; "
                            "use --backend gloo on CPU nodes, or --gpus-per-node N")
    if shape.gpus_per_node and shape.ranks_per_node > shape.gpus_per_node and shape.backend == "nccl":
        raise TemplateError(f"--ranks-per-node {shape.ranks_per_node} is more than --gpus-per-node "
                            f"{shape.gpus_per_node}: NCCL needs a GPU per rank")
    if name.startswith("k8s") and shape.gpus_per_node and shape.ranks_per_node not in (0, shape.gpus_per_node):
        raise TemplateError(f"{name} starts one rank per GPU; leave out --ranks-per-node")
    from harness.run.launchers import harness_flag

    for arg in shape.lab_args:
        if "\n" in arg or "\r" in arg or "\0" in arg:
            raise TemplateError(f"lab argument {arg!r} holds a line break or NUL, which a job file cannot carry")
        if harness_flag(arg):
            raise TemplateError(f"lab argument {arg!r} would override {harness_flag(arg)}, which the job sets")


_OPTION = {"time_limit": "time", "results_claim": "results-claim"}


def _in_single_quotes(words: str) -> str:
    """Shell words as they must appear inside a single-quoted `bash -c '...'` string."""
    return words.replace("'", "'\"'\"'")


@dataclass(frozen=True)
class JobShape:
    lab: str
    nodes: int
    gpus_per_node: int  # 0: a CPU cluster, no GPU requested
    backend: str
    image: str = ""
    port: int = 29400
    time_limit: str = "00:30:00"
    cpus_per_task: int = 8  # CPU nodes: the CPUs of each task (a node's, or a rank's) or pod
    cpus_per_gpu: int = 8  # GPU nodes: the CPUs of each GPU's rank
    max_restarts: int = 0
    results_claim: str = "distlab-results"  # Kubernetes: the PersistentVolumeClaim the results go to
    ifname: str = ""
    lab_args: tuple[str, ...] = ()
    ranks_per_node: int = 0  # 0: one per GPU, or one on a CPU node

    @property
    def ranks(self) -> int:
        """Ranks on each node."""
        return self.ranks_per_node or self.gpus_per_node or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks

    def gpu_request(self) -> str:
        """The #SBATCH line that asks for GPUs, or a comment saying why there is none."""
        if self.gpus_per_node:
            return f"#SBATCH --gpus-per-node={self.gpus_per_node}"
        return "# No GPU requested (--gpus-per-node 0): the ranks run on the nodes' CPUs."

    def cpu_request(self, gpus_per_task: int) -> str:
        """The #SBATCH line that asks for CPUs: per GPU on GPU nodes (--cpus-per-task over 8 GPU ranks
        would give each one CPU's worth), with the line to use instead where Slurm has no
        --cpus-per-gpu (before 19.05, or GPUs not configured as a GRES); per task on CPU nodes."""
        if not self.gpus_per_node:
            return f"#SBATCH --cpus-per-task={self.cpus_per_task}"
        return (f"#SBATCH --cpus-per-gpu={self.cpus_per_gpu}\n"
                "# A cluster without --cpus-per-gpu refuses the line above: put the task's CPUs instead,\n"
                f"# #SBATCH --cpus-per-task={self.cpus_per_gpu * gpus_per_task}")

    def pod_cpus(self) -> int:
        """A Kubernetes pod's CPU limit: the CPUs of its GPUs' ranks, or of the CPU pod."""
        return self.cpus_per_gpu * self.gpus_per_node if self.gpus_per_node else self.cpus_per_task

    def pod_limits(self, indent: int) -> str:
        """A pod's resources.limits entries as YAML lines: its GPUs (nvidia.com/gpu) and CPUs."""
        pad = " " * indent
        gpu = f"{pad}nvidia.com/gpu: {self.gpus_per_node}\n" if self.gpus_per_node else ""
        return f'{gpu}{pad}cpu: "{self.pod_cpus()}"\n'


def render(name: str, shape: JobShape) -> str:
    """The job file `name` for `shape`; TemplateError for a value that cannot go into it."""
    file, _ = TEMPLATES[name]
    _check(name, shape)
    exports = "\n".join(f"export {var}={shlex.quote(shape.ifname)}" for var in ("GLOO_SOCKET_IFNAME",
                                                                                "NCCL_SOCKET_IFNAME")
                        ) if shape.ifname else "# export GLOO_SOCKET_IFNAME=<the interface the nodes share> (and NCCL_)"
    image = shape.image or ("" if name.startswith("slurm") else DEFAULT_IMAGE[bool(shape.gpus_per_node)])
    job_name = f"distlab-{shape.lab.replace('_', '-')}"
    ifname_args = "".join(f'"{flag}", {json.dumps(shape.ifname)}, ' for flag in ("--gloo-ifname", "--nccl-ifname")
                          ) if shape.ifname else ""
    values = {
        "lab": shape.lab, "job_name": job_name, "lab_program": LABS[shape.lab].program[5:],
        "nodes": shape.nodes, "gpus_per_node": shape.gpus_per_node, "world_size": shape.world_size,
        "ranks_per_node": shape.ranks, "gpu_request": shape.gpu_request(),
        # One task per node (slurm-torchrun) holds all the node's GPUs; one per rank (slurm-mpi), one.
        "cpu_request": shape.cpu_request(1 if name == "slurm-mpi" else shape.gpus_per_node),
        "backend": shape.backend, "image": shlex.quote(image), "image_yaml": json.dumps(image),
        "port": shape.port, "time_limit": shape.time_limit,
        # Threads per rank where the job must say them (the MPIJob's launcher is not where its ranks
        # run): the worker pod's CPUs over its ranks. Slurm's jobs count theirs at run time.
        "omp_threads": max(1, shape.pod_cpus() // shape.ranks),
        "max_restarts": shape.max_restarts, "ifname_exports": exports,
        "backoff_limit": BACKOFF_LIMIT, "rdzv_timeout": K8S_RDZV_TIMEOUT_S,
        "results_claim_yaml": json.dumps(shape.results_claim),
        "pod_limits_yaml": shape.pod_limits(18), "trainer_limits_yaml": shape.pod_limits(8).rstrip("\n"),
        "ifname_args": ifname_args,
        "worker_replicas_yaml": (f"    Worker:\n      replicas: {shape.nodes - 1}\n      restartPolicy: ExitCode\n"
                                 "      template: *pod\n") if shape.nodes > 1 else "",
        "lab_args": shlex.join(shape.lab_args),
        "lab_args_in_single_quotes": _in_single_quotes(shlex.join(shape.lab_args)),
        # The kubelet expands $(NAME) in a command and turns $$ into $: every $ doubled, so that an
        # argument reaches the lab as given.
        "lab_args_yaml": "".join(f", {json.dumps(arg.replace('$', '$$'))}" for arg in shape.lab_args),
    }
    return (TEMPLATE_DIR / file).read_text().format(**values)
