"""`distlab acceptance` (make gpu-acceptance; offline: docker/gpu-acceptance.sh): one command for a GPU host.

On N visible GPUs, at world sizes 1..N (powers of two, and N): doctor; check, baseline, ddp and
horovod; collectives and allreduce_bench on NCCL, and nccl-tests' all_reduce_perf beside the lab
when it is on PATH (`distlab bench allreduce`); a scaling study; then a profile calibrated for the
GPU it finds (from harness/profiles/plans/gpu-acceptance.toml) and a grade against that profile.
On ONE GPU, the one-GPU plan (harness/acceptance/plan.py, ROWS) instead; `--cpu-proxy` runs it on CPUs.

This module is the command: its arguments, and what it prints. `--dry-run` checks what the real run
needs (torch importable, CUDA visible or why not, the launcher the Gloo rows use, Horovod) and
prints every phase of the estimate (harness/acceptance/estimate.py, ESTIMATE). The machinery (the
plan, the estimate, the preflight, the steps under the deadline, the outbox) is harness/acceptance/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Any

from harness.acceptance import deadline, preflight, session
from harness.acceptance.estimate import estimate
from harness.acceptance.plan import ROWS, Row, planned_rows, profile_name
from harness.acceptance.steps import Step, one_gpu_steps, steps
from harness.console import console
from harness.usage import UsageError, absolute_path, positive_int


def dry_run(rows: list[Row], planned: list[Step], facts: dict[str, Any], problems: list[str],
            deadline_s: float | None, cpu_proxy: bool = False) -> int:
    """Every check, row, step and phase with its expected seconds; nothing starts. Exit 1 when a
    check would stop the real run."""
    torch = facts["torch"]
    where = ", ".join(torch["devices"]) if torch.get("cuda_visible") else \
        f"no GPU visible ({torch.get('why_no_cuda') or torch.get('torch_error')})"
    console.print(f"python {sys.executable}; distlab from {facts['distlab_from']}", markup=False)
    console.print(f"torch {torch.get('torch') or 'NOT IMPORTABLE'} (CUDA {torch.get('cuda_build')}): {where}",
                  markup=False)
    console.print(f"torchrun for the Gloo rows: {facts['torchrun']}", markup=False)
    for row in rows:
        console.print(f"  plan row {row.name:<18} ws={row.world_size} {row.backend or '-':<5} "
                      f"{' '.join(row.cpu_args if cpu_proxy else row.gpu_args)}", markup=False)
    for step in planned:
        command = f"(not run: {step.note})" if step.argv is None else "distlab " + " ".join(step.argv)
        console.print(f"{step.name:<44} {step.estimate_s:6.0f} s  {command}", markup=False)
    phases = estimate(rows)
    for phase, seconds in phases:
        console.print(f"  {phase:<44} {seconds:6.0f} s", markup=False)
    total = sum(seconds for _, seconds in phases)
    console.print(f"expected total {total:.0f} s of a {deadline_s if deadline_s else 'no'} s deadline on one H200 "
                  "(ESTIMATED: harness/acceptance/estimate.py, ESTIMATE)", markup=False)
    for problem in problems:
        console.print(f"the real run would stop: {problem}", markup=False)
    return 1 if problems else 0


DESCRIPTION = ("Doctor, every lab at world sizes 1..N on the visible GPUs, benchmarks, a profile calibrated for "
               "this GPU and a grade against it, under a deadline; written as it goes (docs/gpu-acceptance.md).")
EXAMPLES = ("examples:\n  distlab acceptance                      # every GPU this host shows\n"
            "  distlab acceptance --out /tmp/out --dry-run    # the checks and every phase's estimate\n"
            "  CUDA_VISIBLE_DEVICES=0,1 distlab acceptance")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", type=absolute_path, default="results", help="results root")
    parser.add_argument("--dry-run", action="store_true",
                        help="print every step with its expected seconds; start nothing")
    parser.add_argument("--gpus", type=positive_int,
                        help="--dry-run on a host without GPUs: plan for this many (default 1)")
    parser.add_argument("--gpu-model", help='--dry-run on a host without GPUs: their model (default "NVIDIA H200")')
    parser.add_argument("--out", type=Path, help="also write the summary, log, profile and a small archive here, "
                                                 "after every step (default: the results folder)")
    parser.add_argument("--deadline", type=float, help="seconds for everything, counted from the start "
                                                      "(default 510 on one GPU; none on several)")
    parser.add_argument("--cpu-proxy", action="store_true",
                        help="the one-GPU plan on the CPUs (Gloo, seconds-long): the acceptance without its GPU")
    parser.add_argument("--rows", help="one GPU: only these rows of the plan (to rerun what failed), e.g. ddp,fsdp")


def run(args: argparse.Namespace, lab_args: list[str]) -> int:
    """`distlab acceptance`: preflight, then every step under the deadline, written as it goes."""
    cpu_proxy, dry = args.cpu_proxy, args.dry_run
    only = [row for row in (args.rows or "").split(",") if row]
    unknown = [row for row in only if row not in {r.name for r in ROWS}]
    if unknown:
        raise UsageError(f"--rows: no row {unknown[0]!r}; the rows: {', '.join(r.name for r in ROWS)}")
    least = deadline.RESERVE_S + 2 * deadline.MIN_STEP_S
    if args.deadline is not None and args.deadline < least:
        raise UsageError(f"--deadline {args.deadline:g} leaves no time for the steps; give at least "
                         f"{least:.0f} s ({deadline.DEADLINE_S} fits the one-GPU plan)")
    if args.out is not None and (args.out / "acceptance.json").exists():
        raise UsageError(f"{args.out} already holds an acceptance (acceptance.json); name another --out")
    clock = deadline.Clock(args.deadline if args.deadline is not None else deadline.DEADLINE_S)
    before = clock.elapsed()  # the install, in docker/gpu-acceptance.sh
    facts, problems = preflight.preflight(cpu_proxy, None)
    preflight_s = clock.elapsed() - before
    devices = facts["torch"].get("devices") or []
    gpus = 1 if cpu_proxy else len(devices) or (args.gpus or 1 if dry else 0)
    several = gpus > 1 and not cpu_proxy
    if several and args.deadline is None:
        clock.deadline_s = None  # no machine lent by the minute: no default deadline
    model = (devices or [args.gpu_model or "NVIDIA H200"])[0]
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = f"cpu-proxy-{stamp}" if cpu_proxy else profile_name(model, gpus, stamp)
    horovod = preflight.horovod_for_cpus() if cpu_proxy else preflight.horovod_with_nccl()
    folder = args.results / "acceptance" / name  # the stamp is in the name
    if dry:
        if several:
            for step_name, argv in steps(gpus, name, folder):
                console.print(f"{step_name:<44} distlab {' '.join(argv)}", markup=False)
            return 1 if problems else 0
        return dry_run(planned_rows(horovod[0], only), one_gpu_steps(name, folder, horovod, cpu_proxy, only), facts,
                       problems, clock.deadline_s, cpu_proxy)
    if problems:
        raise UsageError(problems[0])
    out = args.out or folder
    acceptance = session.begin(name, folder, out, clock, facts, horovod, gpus=gpus, cpu_proxy=cpu_proxy, only=only,
                               before=before, preflight_s=preflight_s)
    summary = acceptance.summary
    console.print(f"distlab acceptance: {summary['plan']}, profile {name}, deadline {clock.deadline_s or 'none'} s "
                  f"({clock.elapsed():.0f} s gone); results {folder}; out {out}", markup=False)
    interrupted = session.run_steps(acceptance)
    for record in summary["steps"]:
        console.print(f"{record['step']:<44} {record['status']:<12} {record.get('seconds', 0.0):7.1f} s", markup=False)
    console.print(f"results: {folder}\nout: {out} (archive {summary['archive']['bytes'] / 1e6:.2f} MB; "
                  f"{summary['total_s']:.0f} s in all)", markup=False)
    if interrupted:
        return 130
    return 1 if summary["failed"] else 0
