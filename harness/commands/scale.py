"""`distlab scale`: the scaling lab at several world sizes, repeated; speedup, efficiency, Amdahl.

    distlab scale --lab ddp --world-sizes 1,2,4 --repeats 3                  # weak: same batch per rank
    distlab scale --lab ddp --world-sizes 1,2,4 --mode strong --global-batch 128
    distlab scale --lab horovod --world-sizes 1,2 -- --fp16-allreduce --steps 50   # after --: to the lab

Every run goes through the real launcher (torchrun for ddp, horovodrun for horovod), at world
size 1 too, so that every world size pays the same start-up and runs the same code. Output goes
to a fresh folder <results>/scale/<time>-ws<largest>-<lab>-<mode>/: summary.json, throughput.png,
speedup.png, efficiency.png, compute_comm.png, report.md and report.html (the report `distlab grade`
writes, for this study; the Markdown also goes to $GITHUB_STEP_SUMMARY), and each run's own folder
(command, logs, record) under scaling/. How to read the numbers: labs/SCALING.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.catalog import DEFAULT_LAUNCHER, LABS, backend_for
from harness.console import console, fmt, print_json, run_progress
from harness.files import write_json
from harness.report import pages
from harness.report.plots import scale_plots, time_split_plot
from harness.run.request import RunRequest, build_request
from harness.run.run_dir import new_run_dir
from harness.run.runner import run_lab
from harness.usage import UsageError, absolute_path, positive_float, positive_int, world_size_list
from harness.verdict.stats import Interval, efficiency, fit_amdahl, mean_ci, speedup
from labs.common.host import gpu_count, usable_cores

LAB = "scaling"
MAX_OVERSUBSCRIPTION = 4  # ranks x threads beyond this many times the cores measure the scheduler, not scaling
SUMMARY_SCHEMA = "distlab-scale"
# Means over repeats reported per world size, besides throughput (which gets an interval).
MEAN_METRICS = ("step_seconds", "step_seconds_no_sync", "comm_seconds", "allreduce_seconds", "comm_fraction",
                "overlap")


# ------------------------------------------------------------------------------ pure computations


DESCRIPTION = ("Run labs/scaling at each world size; arguments after -- go to the lab. How to read the numbers: "
               "labs/SCALING.md.")
EXAMPLES = """examples:
  distlab scale --lab ddp --world-sizes 1,2,4 --repeats 3
  distlab scale --lab ddp --world-sizes 1,2,4 --mode strong --global-batch 128"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lab", choices=["ddp", "horovod"], default="ddp",
                        help="ddp (torch.distributed, torchrun) or horovod (horovodrun); default ddp")
    parser.add_argument("--world-sizes", type=world_size_list, required=True,
                        help="increasing, comma-separated, e.g. 1,2,4; the smallest is the baseline")
    parser.add_argument("--mode", choices=["weak", "strong"], default="weak",
                        help="weak: fixed per-rank batch (default); strong: fixed global batch split across ranks")
    parser.add_argument("--repeats", type=positive_int, default=3, help="runs per world size (default 3)")
    parser.add_argument("--batch", type=positive_int, help="weak: images per rank per step (default: the lab's)")
    parser.add_argument("--global-batch", type=positive_int, help="strong: images per step over all ranks")
    parser.add_argument("--backend", choices=["gloo", "nccl"],
                        help="--lab ddp only (default: nccl when GPUs are visible, else gloo)")
    parser.add_argument("--launcher", help="default: torchrun for ddp, horovodrun for horovod")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="OMP threads per rank, the same at every world size (default 1)")
    parser.add_argument("--timeout", type=positive_float, default=900.0, help="seconds before one run is ended")
    parser.add_argument("--results", type=absolute_path, default="results", help="results root (default ./results)")
    parser.add_argument("--json", action="store_true", help="print the study's summary as JSON on stdout")


def rank_batches(mode: str, world_sizes: list[int], batch: int | None,
                 global_batch: int | None) -> dict[int, int | None]:
    """Per-rank batch at each world size (None: the lab's default, the same at every size).

    Weak scaling keeps the per-rank batch, so the global batch grows with the ranks; strong
    scaling splits one global batch, so each rank gets less work as ranks are added.
    """
    if mode == "weak":
        if global_batch is not None:
            raise UsageError("--global-batch is for --mode strong; weak scaling fixes the per-rank batch (--batch)")
        return dict.fromkeys(world_sizes, batch)
    if batch is not None:
        raise UsageError("--batch is for --mode weak; strong scaling splits --global-batch across the ranks")
    if global_batch is None:
        raise UsageError("--mode strong needs --global-batch B, the batch split across the ranks")
    uneven = [ws for ws in world_sizes if global_batch % ws]
    if uneven:
        raise UsageError(f"global batch {global_batch} does not split evenly over world size(s) "
                         f"{', '.join(map(str, uneven))}; choose a multiple of {math.lcm(*world_sizes)}")
    return {ws: global_batch // ws for ws in world_sizes}


def oversubscribed(world_size: int, threads: int, cores: int) -> bool:
    return world_size * threads > cores


def check_capacity(world_sizes: list[int], threads: int, cores: int, gpus: int, on_gpu: bool) -> None:
    """Refuse world sizes this host cannot run meaningfully: one GPU per rank, or at most 4x the cores."""
    largest = world_sizes[-1]
    if on_gpu and largest > gpus:
        raise UsageError(f"world size {largest} needs {largest} GPU(s) and {gpus} are visible; "
                         f"use world sizes up to {gpus}")
    if not on_gpu and largest * threads > MAX_OVERSUBSCRIPTION * cores:
        raise UsageError(f"world size {largest} x {threads} thread(s) per rank needs {largest * threads} cores and "
                         f"this host has {cores}; beyond {MAX_OVERSUBSCRIPTION}x oversubscribed "
                         f"({MAX_OVERSUBSCRIPTION * cores} ranks x threads) the numbers measure the scheduler")


def interval_dict(interval: Interval, samples: list[float]) -> dict[str, Any]:
    return {"mean": interval.mean, "ci95_low": interval.low, "ci95_high": interval.high, "n": interval.n,
            "samples": samples}


def scaling_rows(metrics_by_size: dict[int, list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], float | None]:
    """Per world size: throughput with its 95% CI over repeats, speedup, efficiency and the time split;
    and the Amdahl serial fraction fitted to the speedups. The smallest world size is the baseline."""
    sizes = sorted(ws for ws, runs in metrics_by_size.items() if runs)
    if not sizes:
        return [], None
    rows = []
    for ws in sizes:
        runs = metrics_by_size[ws]
        total = [float(m["img_per_sec"]) for m in runs]
        per_rank = [float(m["img_per_sec_per_rank"]) for m in runs]
        row = {"world_size": ws, "per_rank_batch": runs[0]["per_rank_batch"], "global_batch": runs[0]["global_batch"],
               "img_per_sec": interval_dict(mean_ci(total), total),
               "img_per_sec_per_rank": interval_dict(mean_ci(per_rank), per_rank)}
        for name in MEAN_METRICS:
            values = [m.get(name) for m in runs]
            row[name] = statistics.fmean(float(v) for v in values if v is not None) if None not in values else None
        rows.append(row)
    base = rows[0]
    for row in rows:
        throughput, base_throughput = row["img_per_sec"]["mean"], base["img_per_sec"]["mean"]
        row["speedup"] = speedup(throughput, base_throughput)
        row["efficiency"] = efficiency(throughput, row["world_size"], base_throughput, base["world_size"])
    serial = None
    if len(rows) > 1:
        serial = fit_amdahl([r["world_size"] for r in rows], [r["speedup"] for r in rows], base["world_size"])
    return rows, serial


def batch_mismatches(mode: str, asked: dict[int, int | None], global_batch: int | None,
                     metrics_by_size: dict[int, list[dict[str, Any]]]) -> list[str]:
    """What the records say ran, against what was asked: the batch sizes are the experiment."""
    problems = []
    first = {ws: runs[0] for ws, runs in metrics_by_size.items() if runs}
    for ws, metrics in first.items():
        per_rank, total = metrics.get("per_rank_batch"), metrics.get("global_batch")
        if asked[ws] is not None and per_rank != asked[ws]:
            problems.append(f"world size {ws}: per-rank batch {per_rank}, asked {asked[ws]}")
        if per_rank is None or total != per_rank * ws:
            problems.append(f"world size {ws}: global batch {total} is not {ws} x per-rank batch {per_rank}")
        if mode == "strong" and total != global_batch:
            problems.append(f"world size {ws}: global batch {total}, asked {global_batch}")
    if mode == "weak" and len({m.get("per_rank_batch") for m in first.values()}) > 1:
        problems.append("weak scaling ran different per-rank batches: "
                        + ", ".join(f"{ws}: {m.get('per_rank_batch')}" for ws, m in sorted(first.items())))
    return problems


@dataclasses.dataclass
class Plan:
    lab: str
    mode: str
    backend: str
    threads: int
    repeats: int
    global_batch: int | None
    batches: dict[int, int | None]
    requests: dict[int, RunRequest]
    lab_args: list[str]
    cores: int


def plan_study(args: argparse.Namespace, lab_args: list[str]) -> Plan:
    """Check everything before the first run starts; each refusal names the fix."""
    for flag in ("--batch-size", "--backend", "--record"):
        if any(arg == flag or arg.startswith(flag + "=") for arg in lab_args):
            fix = {"--batch-size": "--batch (weak) or --global-batch (strong)",
                   "--backend": "distlab scale --backend", "--record": "nothing: each run gets its own record"}[flag]
            raise UsageError(f"{flag} after -- is set by distlab scale; use {fix}")
    gpus = gpu_count()
    if args.lab == "horovod":
        if args.backend:
            raise UsageError("--backend is for --lab ddp; Horovod picks its own transport (Gloo on CPU, NCCL on GPU)")
        backend = "horovod"
    else:
        # On a GPU host the GPUs, at every world size: too few of them is refused below.
        backend = args.backend or backend_for(LABS[LAB], 1, gpus)[0]
    world_sizes = args.world_sizes
    batches = rank_batches(args.mode, world_sizes, args.batch, args.global_batch)
    cores = usable_cores().count
    # Horovod's lab, like nccl, takes one GPU per rank whenever GPUs are visible.
    check_capacity(world_sizes, args.threads, cores, gpus, on_gpu=bool(gpus) and backend in ("nccl", "horovod"))
    requests = {}
    for ws in world_sizes:
        batch_args = [] if batches[ws] is None else ["--batch-size", str(batches[ws])]
        requests[ws] = build_request(LAB, ws, [*batch_args, *lab_args],
                                     launcher=args.launcher or DEFAULT_LAUNCHER[backend], backend=backend,
                                     threads=args.threads, timeout_s=args.timeout, results_root=args.results)
    return Plan(args.lab, args.mode, backend, args.threads, args.repeats, args.global_batch, batches, requests,
                list(lab_args), cores)


def run(args: argparse.Namespace, lab_args: list[str]) -> int:
    """`distlab scale`: plan the study, run it round-robin, summarise, plot and report."""
    plan = plan_study(args, lab_args)
    world_sizes = sorted(plan.requests)
    study_dir = new_run_dir(args.results, "scale", world_sizes[-1], f"{plan.lab}-{plan.mode}")
    started = dt.datetime.now(dt.timezone.utc).isoformat()
    load_before = os.getloadavg()
    console.print(f"distlab scale: {plan.lab} ({plan.backend}) {plan.mode} scaling, world sizes "
                  f"{','.join(map(str, world_sizes))} x {plan.repeats} repeat(s), {plan.threads} thread(s)/rank, "
                  f"{plan.cores} cores; load average {load_before[0]:.2f}")

    records: dict[int, list[dict[str, Any]]] = {ws: [] for ws in world_sizes}
    runs: dict[int, list[str]] = {ws: [] for ws in world_sizes}
    failure = None
    total = plan.repeats * len(world_sizes)
    # Round-robin over world sizes: a change in the machine's load then touches every world size
    # alike, instead of biasing whichever size ran while it lasted.
    with run_progress(total) as progress:
        for index in range(total):
            repeat, ws = divmod(index, len(world_sizes))
            ws = world_sizes[ws]
            request = dataclasses.replace(plan.requests[ws], results_root=study_dir)
            progress.started(f"world size {ws}, repeat {repeat + 1}")
            result = run_lab(request, echo=False, on_line=progress.line)
            runs[ws].append(str(result.run_dir.relative_to(study_dir)))
            if not result.ok:
                progress.ended("FAILED")
                failure = f"world size {ws}, repeat {repeat + 1}: {result.reason} (see {result.run_dir})"
                break  # a later run would most likely fail the same way; the notes below say why
            assert result.record is not None  # an ok run has its record, the harness's if not the lab's
            metrics = result.record["metrics"]
            records[ws].append(metrics)
            progress.ended(f"{metrics['img_per_sec']:.1f} img/s ({metrics['img_per_sec_per_rank']:.1f}/rank) "
                           f"in {result.wall_seconds:.0f} s")

    rows, serial = scaling_rows(records)
    problems = batch_mismatches(plan.mode, plan.batches, plan.global_batch, records)
    if problems and not failure:
        failure = "; ".join(problems)
    for row in rows:
        row["oversubscribed"] = oversubscribed(row["world_size"], plan.threads, plan.cores)
        row["runs"] = runs[row["world_size"]]
    load_after = os.getloadavg()
    summary = {
        "schema": SUMMARY_SCHEMA, "schema_version": 1,
        "status": "failed" if failure else "ok", "reason": failure,
        "lab": plan.lab, "backend": plan.backend, "launcher": plan.requests[world_sizes[0]].launcher,
        "mode": plan.mode, "world_sizes": world_sizes, "repeats": plan.repeats,
        "threads_per_rank": plan.threads, "cores": plan.cores, "global_batch": plan.global_batch,
        "lab_args": plan.lab_args, "levers": _levers(study_dir, runs),
        "baseline_world_size": rows[0]["world_size"] if rows else None,
        "amdahl_serial_fraction": serial, "rows": rows,
        "load_average": {"before": list(load_before), "after": list(load_after)},
        "start": started, "end": dt.datetime.now(dt.timezone.utc).isoformat(),
        "provenance": _provenance(study_dir, runs),
    }
    write_json(study_dir / "summary.json", summary)
    images = []
    if rows:
        # Logs and CI pages are not terminals (rich assumes 80 columns there): give the table its width.
        wide = console if console.width >= 130 else Console(highlight=False, width=130)
        wide.print(table(summary))
        images = scale_plots(summary, study_dir)
        images += [path for path in [time_split_plot(summary, study_dir)] if path]
    paths = pages.write_scale_report(study_dir, summary, images)
    pages.append_step_summary(paths["markdown"])
    for line in notes(summary):
        console.print(line)
    console.print(f"results: {study_dir}", markup=False)
    console.print(f"report: {paths['html']}", markup=False)
    if getattr(args, "json", False):
        print_json({**summary, "results": str(study_dir), "report": {kind: str(p) for kind, p in paths.items()}})
    return 1 if failure else 0


def _first_record(study_dir: Path, runs: dict[int, list[str]]) -> dict[str, Any]:
    for run_dirs in runs.values():
        for run_dir in run_dirs:
            path = study_dir / run_dir / "record.json"
            if path.exists():
                return json.loads(path.read_text())
    return {}


def _levers(study_dir: Path, runs: dict[int, list[str]]) -> dict[str, Any]:
    """The settings that change what is measured, as the lab recorded them."""
    config = _first_record(study_dir, runs).get("config", {})
    return {name: config.get(name) for name in ("precision", "bucket_cap_mb", "fp16_allreduce", "stem", "steps",
                                                "warmup_steps")}


def _provenance(study_dir: Path, runs: dict[int, list[str]]) -> dict[str, Any]:
    recorded = _first_record(study_dir, runs).get("provenance", {})
    return {key: recorded.get(key) for key in ("versions", "hardware", "hostname", "git_commit")}


# ------------------------------------------------------------------------------------------ report


def table(summary: dict[str, Any]) -> Table:
    title = (f"{summary['lab']} ({summary['backend']}), {summary['mode']} scaling, "
             f"{summary['threads_per_rank']} thread(s)/rank, {summary['repeats']} repeat(s)")
    out = Table(title=title)
    # Short headers: the whole table fits 130 columns.
    for column in ("ranks", "batch/rank", "img/s ± 95%", "per rank", "speedup", "effic.", "step ms",
                   "no-sync ms", "allred ms", "comm", "overlap"):
        out.add_column(column, justify="right", no_wrap=True)
    for row in summary["rows"]:
        throughput = row["img_per_sec"]
        spread = "" if throughput["n"] < 2 else f" ± {(throughput['ci95_high'] - throughput['ci95_low']) / 2:.1f}"
        size = f"{row['world_size']}{' *' if row['oversubscribed'] else ''}"
        out.add_row(size, str(row["per_rank_batch"]), f"{throughput['mean']:.1f}{spread}",
                    fmt(row["img_per_sec_per_rank"]["mean"], 1, ".1f"), f"{row['speedup']:.2f}",
                    f"{row['efficiency']:.2f}",
                    fmt(row["step_seconds"], 1e3, ".1f"), fmt(row["step_seconds_no_sync"], 1e3, ".1f"),
                    fmt(row["allreduce_seconds"], 1e3, ".1f"), fmt(row["comm_fraction"], 1, ".1%"),
                    fmt(row["overlap"], 1, ".0%"))
    return out


def notes(summary: dict[str, Any]) -> list[str]:
    lines = []
    crowded = [r["world_size"] for r in summary["rows"] if r["oversubscribed"]]
    if crowded:
        lines.append(f"* oversubscribed: world size(s) {', '.join(map(str, crowded))} x "
                     f"{summary['threads_per_rank']} thread(s) exceed the {summary['cores']} cores, so ranks take "
                     "turns on cores: those numbers show time-slicing, not scaling")
    if summary["amdahl_serial_fraction"] is not None:
        base = summary["baseline_world_size"]
        lines.append(f"Amdahl fit (speedup vs world size {base}): serial fraction "
                     f"{summary['amdahl_serial_fraction']:.3f}")
    load = summary["load_average"]
    lines.append(f"load average (1 min) {load['before'][0]:.2f} before, {load['after'][0]:.2f} after, on "
                 f"{summary['cores']} cores: other work on the host slows some runs and widens the intervals")
    if summary["status"] != "ok":
        lines.append(f"[red]FAILED[/red]: {escape(summary['reason'])}")
    return lines
