"""What each `distlab` subcommand does with its parsed arguments: one function per verb, handing them
to the stage or command that does the work (cli.py builds the parser and calls these)."""

from __future__ import annotations

import argparse
import sys

from rich.markup import escape

from harness.console import console, print_json
from harness.run import request as requests
from harness.run.launch import dry_run
from harness.run.output import tail
from harness.run.runner import run_lab
from harness.run.state import RunResult
from harness.usage import UsageError


def print_summary(result: RunResult) -> None:
    """A run's outcome for people: metrics or the reason, the failing rank's last lines, where it all is.
    Everything from the lab is printed as text, never as rich markup."""
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
    console.print(f"run directory: {result.run_dir}", markup=False)


def cmd_run(args: argparse.Namespace, lab_args: list[str]) -> int:
    request = requests.from_args(args.lab, args.world_size, args, lab_args)
    if args.dry_run:  # the exact command, nothing started: check a cluster command before spending GPU hours
        sys.stdout.write(dry_run(request) + "\n")
        return 0
    console.print(f"distlab run: {request.lab} world_size={request.world_size} launcher={request.launcher} "
                  f"backend={request.backend} ({request.backend_reason}) threads/rank={request.threads}", markup=False)
    result = run_lab(request, echo=not args.json)  # with --json, stdout carries the summary alone
    print_summary(result)
    if args.json:
        print_json({"run_dir": str(result.run_dir), "status": result.status, "reason": result.reason,
                    "wall_seconds": result.wall_seconds, "hang_suspected": result.hang_suspected,
                    "metrics": (result.record or {}).get("metrics", {})})
    return 0 if result.ok else 1


def cmd_grade(args: argparse.Namespace, lab_args: list[str]) -> int:
    from harness.commands import grade

    if args.slurm:  # the cells as a Slurm job array (harness/commands/slurm.py)
        from harness.commands import slurm

        return slurm.grade(args)
    return grade.run(args)


def cmd_grade_class(args: argparse.Namespace, lab_args: list[str]) -> int:
    from harness.classgrade import classroom

    return classroom.run(args)


def cmd_calibrate(args: argparse.Namespace, lab_args: list[str]) -> int:
    from harness.commands import calibrate

    return calibrate.run(args)


def cmd_scale(args: argparse.Namespace, lab_args: list[str]) -> int:
    from harness.commands import scale

    return scale.run(args, lab_args)


def cmd_template(args: argparse.Namespace, lab_args: list[str]) -> int:
    from harness.run import job_templates

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


def cmd_doctor(args: argparse.Namespace, lab_args: list[str]) -> int:
    from harness.commands import doctor

    return doctor.main(as_json=args.json)


def cmd_data(args: argparse.Namespace, lab_args: list[str]) -> int:
    from labs.common.data import fetch_cifar10

    path = fetch_cifar10(args.data_dir)
    console.print(f"CIFAR-10 ready in {path}", markup=False)
    return 0


def cmd_bench(args: argparse.Namespace, lab_args: list[str]) -> int:
    if args.what == "train":
        from harness.commands.bench_train import main as bench
    elif args.what == "verdict":
        from harness.commands.bench_verdict import main as bench
    else:
        from harness.commands.bench_collectives import main as bench
    return bench(lab_args)
