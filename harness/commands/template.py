"""`distlab template NAME`: a Slurm or Kubernetes job for a lab, printed or written (harness/run/job_templates.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.console import console
from harness.run import job_templates
from harness.run.job_templates import TEMPLATES
from harness.usage import UsageError, non_negative_int, positive_int

DESCRIPTION = "; ".join(f"{k}: {v[1]}" for k, v in TEMPLATES.items()) + ". Arguments after -- go to the lab."
EXAMPLES = """examples:
  distlab template slurm-torchrun --nodes 2 --gpus-per-node 8 > job.sbatch
  distlab template slurm-torchrun --nodes 2 --gpus-per-node 0 --cpus-per-task 16   # CPU nodes, gloo
  distlab template k8s-mpijob --lab horovod --nodes 2"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=sorted(TEMPLATES))
    parser.add_argument("--lab", default="ddp", help="lab to run (default ddp)")
    parser.add_argument("--nodes", type=positive_int, default=2, help="number of nodes (default 2)")
    parser.add_argument("--gpus-per-node", type=non_negative_int, default=8,
                        help="GPUs per node (default 8; 0: a CPU cluster, Gloo, no GPU requested)")
    parser.add_argument("--ranks-per-node", type=non_negative_int, default=0,
                        help="ranks per node (default: one per GPU; 1 on CPU nodes)")
    parser.add_argument("--backend", help="default: horovod for MPI templates, else nccl on GPUs, gloo on CPUs")
    parser.add_argument("--image", help="container image (Slurm: pyxis/enroot; default: none for Slurm)")
    parser.add_argument("--port", type=positive_int, default=29400, help="rendezvous/master port")
    parser.add_argument("--time", default="00:30:00", help="Slurm time limit")
    parser.add_argument("--cpus-per-task", type=positive_int, default=8, help="CPU nodes: CPUs per task/pod")
    parser.add_argument("--cpus-per-gpu", type=positive_int, default=8, help="GPU nodes: CPUs per GPU (its rank's)")
    parser.add_argument("--results-claim", default="distlab-results",
                        help="Kubernetes: the PersistentVolumeClaim the results go to (default distlab-results)")
    parser.add_argument("--ifname", help="network interface the nodes share (GLOO/NCCL_SOCKET_IFNAME)")
    parser.add_argument("--out", type=Path, help="write here (never overwrites) instead of stdout")


def run(args: argparse.Namespace, lab_args: list[str]) -> int:
    try:
        shape = job_templates.job_shape(args.name, args.lab, args.nodes, args.gpus_per_node, args.backend,
                                        image=args.image or "", port=args.port, time_limit=args.time,
                                        cpus_per_task=args.cpus_per_task, cpus_per_gpu=args.cpus_per_gpu,
                                        results_claim=args.results_claim, ifname=args.ifname or "",
                                        lab_args=tuple(lab_args), ranks_per_node=args.ranks_per_node)
        text = job_templates.render(args.name, shape)
    except job_templates.TemplateError as error:
        raise UsageError(str(error)) from None
    if args.out:
        if args.out.exists():
            raise UsageError(f"{args.out} exists and is never overwritten; choose another --out")
        args.out.write_text(text)
        console.print(f"wrote {args.out}", markup=False)
    else:
        sys.stdout.write(text)
    return 0
