"""`distlab template`: job files for the engines clusters already have (Slurm, Kubernetes).

The files under harness/templates/ are complete examples with {placeholders}; this fills
them in for a lab, a node count and GPUs per node. distlab itself starts nothing remotely.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from harness.labs import LABS

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATES = {
    "slurm-torchrun": ("slurm-torchrun.sbatch", "torchrun per node, c10d rendezvous on the first node"),
    "slurm-mpi": ("slurm-mpi.sbatch", "srun starts one task per GPU (Horovod, mpi4py, or torch via env)"),
    "k8s-pytorchjob": ("k8s-pytorchjob.yaml", "Kubeflow PyTorchJob: torchrun in every pod"),
    "k8s-mpijob": ("k8s-mpijob.yaml", "Kubeflow MPIJob: mpirun over worker pods (Horovod)"),
}
DEFAULT_IMAGE = "ghcr.io/distlab/distlab:gpu"


@dataclass(frozen=True)
class JobShape:
    lab: str
    nodes: int
    gpus_per_node: int
    backend: str
    image: str = ""
    port: int = 29400
    time_limit: str = "00:30:00"
    cpus_per_task: int = 8
    max_restarts: int = 0
    ifname: str = ""
    lab_args: tuple[str, ...] = ()

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def render(name: str, shape: JobShape) -> str:
    file, _ = TEMPLATES[name]
    exports = "\n".join(f"export {var}={shape.ifname}" for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
                        ) if shape.ifname else "# export NCCL_SOCKET_IFNAME=<the interface the nodes share>"
    values = {
        "lab": shape.lab, "lab_dns": shape.lab.replace("_", "-"), "lab_program": LABS[shape.lab].program[5:],
        "nodes": shape.nodes, "gpus_per_node": shape.gpus_per_node, "world_size": shape.world_size,
        "backend": shape.backend, "image": shape.image or ("" if name.startswith("slurm") else DEFAULT_IMAGE),
        "port": shape.port, "time_limit": shape.time_limit, "cpus_per_task": shape.cpus_per_task,
        "omp_threads": max(1, shape.cpus_per_task // max(1, shape.gpus_per_node)),
        "max_restarts": shape.max_restarts, "ifname_exports": exports,
        "lab_args": shlex.join(shape.lab_args),
        "lab_args_yaml": "".join(f", {json.dumps(arg)}" for arg in shape.lab_args),
    }
    return (TEMPLATE_DIR / file).read_text().format(**values)
