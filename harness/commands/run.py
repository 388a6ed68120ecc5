"""`distlab run LAB -n N`: one lab at one world size through its real launcher."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.markup import escape

from harness.catalog import LABS
from harness.console import console, print_json
from harness.run import request as requests
from harness.run.launch import dry_run
from harness.run.launchers import LAUNCHERS
from harness.run.notes import run_notes
from harness.run.output import tail
from harness.run.runner import run_lab
from harness.run.state import RunResult
from harness.usage import absolute_path, positive_float, positive_int

DESCRIPTION = "Run LAB with N ranks; arguments after -- go to the lab."
EXAMPLES = """examples:
  distlab run check -n 2                           # 2 ranks, torchrun, gloo
  distlab run ddp -np 2 -- --smoke                 # after --: the lab's own arguments
  distlab run ddp -n 2 --backend nccl              # 2 GPUs
  distlab run check -n 2 --backend horovod -H localhost:2"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lab", choices=list(LABS), help="the lab to run")
    # -np is mpirun's and horovodrun's spelling, --nproc-per-node torchrun's: people type them from habit.
    parser.add_argument("--world-size", "-n", "-np", "--nproc-per-node", dest="world_size", type=positive_int,
                        required=True, help="number of ranks")
    parser.add_argument("--launcher", choices=sorted(LAUNCHERS),
                        help="default: by backend (gloo/nccl torchrun, mpi mpirun, horovod horovodrun); python for 1")
    parser.add_argument("--backend", help="communication backend (default: the lab's)")
    parser.add_argument("--threads", type=positive_int, help="OMP threads per rank (default: cores / world size)")
    parser.add_argument("--timeout", type=positive_float, default=900.0, help="seconds before the run is ended")
    parser.add_argument("--results", type=absolute_path, default="results", help="results root (default ./results)")
    parser.add_argument("--program", type=Path, help="run this program instead of the lab's own (same contract)")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="torchrun: restart all ranks this often after a failure (elastic)")
    nodes = parser.add_argument_group("several nodes (docs/multinode.md)")
    nodes.add_argument("--nnodes", type=positive_int, default=1, help="torchrun: number of nodes")
    nodes.add_argument("--node-rank", type=int, default=0, help="torchrun: this node's rank, 0..nnodes-1")
    nodes.add_argument("--rdzv-endpoint", help="torchrun: HOST:PORT of the c10d rendezvous (served by node 0)")
    nodes.add_argument("--rdzv-id", default="distlab", help="torchrun: job id shared by all nodes")
    nodes.add_argument("--rdzv-timeout", type=positive_float, default=60.0,
                       help="seconds to wait for the endpoint and the other nodes (default 60)")
    nodes.add_argument("--local-addr", help="torchrun: this node's address as the others reach it "
                       "(default: the source address of the route to the endpoint)")
    nodes.add_argument("--hosts", "-H", help="mpirun/horovodrun: host:slots,... (e.g. node0:2,node1:2)")
    nodes.add_argument("--hostfile", type=Path, help="mpirun/horovodrun: a hostfile (host slots=N per line)")
    nodes.add_argument("--gloo-ifname", help="network interface for Gloo (sets GLOO_SOCKET_IFNAME)")
    nodes.add_argument("--nccl-ifname", help="network interface for NCCL (sets NCCL_SOCKET_IFNAME)")
    parser.add_argument("--json", action="store_true", help="print the run's summary as JSON on stdout")
    parser.add_argument("--dry-run", action="store_true", help="print the launcher command and start nothing")


def print_summary(result: RunResult, notes: list[str] | None = None) -> None:
    """A run's outcome for people: metrics or the reason, the failing rank's last lines, what the
    figures do not say by themselves (notes.run_notes), where it all is. Everything from the lab is
    printed as text, never as rich markup."""
    if result.ok:
        metrics = (result.record or {}).get("metrics", {})
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in list(metrics.items())[:6] if isinstance(v, (int, float, str)))
        console.print(f"[green]ok[/green] in {result.wall_seconds:.1f} s  {escape(shown)}")
    else:
        console.print(f"[red]FAILED[/red] after {result.wall_seconds:.1f} s: {escape(result.reason or '')}")
        if result.hang_suspected:  # a hang: every rank's last words, and where py-spy saw each stack
            for log in sorted(result.run_dir.glob("rank.*.log")):
                console.print(f"--- last lines of {log.stem} ({log}) ---", markup=False)
                console.print(tail(log, 5), markup=False)
            if (result.run_dir / "stacks.txt").exists():
                console.print(f"stacks of the hung ranks: {result.run_dir / 'stacks.txt'}", markup=False)
        else:
            rank = result.failure.rank if result.failure and result.failure.rank is not None else 0
            log = result.run_dir / f"rank.{rank}.log"
            if log.exists():
                console.print(f"--- last lines of rank {rank} ({log}) ---", markup=False)
                console.print(tail(log), markup=False)
    for note in notes or []:
        console.print(f"note: {note}", markup=False)
    console.print(f"run directory: {result.run_dir}", markup=False)


def run(args: argparse.Namespace, lab_args: list[str]) -> int:
    request = requests.from_args(args.lab, args.world_size, args, lab_args)
    if args.dry_run:  # the exact command, nothing started: check a cluster command before spending GPU hours
        sys.stdout.write(dry_run(request) + "\n")
        return 0
    console.print(f"distlab run: {request.lab} world_size={request.world_size} launcher={request.launcher} "
                  f"backend={request.backend} ({request.backend_reason}) threads/rank={request.threads}", markup=False)
    result = run_lab(request, echo=not args.json)  # with --json, stdout carries the summary alone
    notes = run_notes(request.lab, request.lab_args, result)
    print_summary(result, notes)
    if args.json:
        print_json({"run_dir": str(result.run_dir), "status": result.status, "reason": result.reason,
                    "wall_seconds": result.wall_seconds, "hang_suspected": result.hang_suspected,
                    "metrics": (result.record or {}).get("metrics", {}), "notes": notes})
    return 0 if result.ok else 1
