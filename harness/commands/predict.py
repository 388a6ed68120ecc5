"""`distlab predict`: data-parallel step time, throughput and weak-scaling efficiency past this machine.

A prediction from two measurements, with the alpha-beta model of collectives:

- a step: compute seconds per sample c (forward, backward and optimizer of one rank, no gradient
  sync), gradient bytes G and the per-rank batch b: from a `distlab scale` study (--scale DIR: its
  world-size-1 row, step_seconds_no_sync / per_rank_batch, and the records' allreduce_bytes), or
  from the workloads of harness/interconnects.toml (FLOPs per sample / (peak x utilisation));
- an interconnect: latency alpha (seconds per message step) and bus bandwidth B (beta = 1 / B,
  seconds per byte): fitted to an allreduce_bench record's per-size times (--bench RECORD), or the
  published nccl-tests figures of harness/interconnects.toml (--cluster), each with its source.

The cost of one collective of n bytes among p ranks (nothing at p = 1):

    ring all-reduce            2 (p-1) alpha + 2 (p-1)/p n beta     reduce-scatter, then all-gather: p-1 steps each
    tree all-reduce            2 log2(p) alpha + 2 n beta           NCCL's double binary tree: a pipelined reduce up
                                                                    and broadcast down; every rank sends and receives
                                                                    about n in each half, in log2(p) hops
    ring all-gather            (p-1) alpha + (p-1)/p n beta         n: the gathered (whole) size
    ring reduce-scatter        (p-1) alpha + (p-1)/p n beta         n: the size before scattering

(log2 rounded up.) The all-reduce of a bucket costs the cheaper of ring and tree, as NCCL's tuner
picks per size: the ring wins on bandwidth at a few ranks, the tree on latency at many.

DDP (weak scaling: b samples per rank at every p). Compute t = b c, a third forward and optimizer,
two thirds backward (the backward costs about twice the forward's FLOPs). The gradients become
ready evenly through the backward and go out in k = ceil(G / bucket) buckets (bucket: DDP's
bucket_cap_mb, 25 MiB); bucket i (of G_i bytes) is ready at t/3 + (2t/3) i/k, and is all-reduced
when it is ready and the previous bucket is done (one communication stream):

    end_0 = 0,   end_i = max(ready_i, end_{i-1}) + T_allreduce(G_i, p),   step = max(t, end_k)

which is the bucket overlap: only what is still being sent when the backward ends is waited for,
at least the last bucket's all-reduce. Without overlap (every bucket waits for the backward:
what a CPU host gives, whose cores are all busy computing, labs/SCALING.md) step = t + sum_i T(G_i).
A host can give part of it: with overlap h in [0, 1],
    step = t + h x exposed_with_overlap + (1 - h) x exposed_without
h = 1 on GPUs (NCCL runs beside the compute kernels); on a CPU host it is calibrated (below).

FSDP (FULL_SHARD, U units, prefetching the next unit's parameters): per step every rank
all-gathers each unit's parameters for the forward, again for the backward, and reduce-scatters
its gradients: 3 collectives of (p-1)/p P bytes each (P = the parameters' bytes, taken = G), 1.5x
DDP's 2 (p-1)/p. With a unit's collective overlapping the neighbouring unit's compute:

    forward  = T_ag + (U-1) max(T_ag, f) + f                   f = forward / U, T_ag = all-gather(P/U)
    backward = T_ag + (U-1) max(T_ag + T_rs, g) + g + T_rs     g = backward / U, T_rs = reduce-scatter(P/U)

and the host's overlap h weighs that against no overlap at all (compute + U (2 T_ag + T_rs)), as for DDP.

Ranks that share a host's cores (a CPU host, ranks x threads > cores) take turns: compute and
communication both slow by s = max(1, p threads / cores); two or more ranks side by side also
share memory bandwidth and caches, which slows compute by r (measured: the no-sync step at 2 ranks
over 1). On a cluster every rank has its own device: s = r = 1.
Throughput = p b / step; weak-scaling efficiency = step(1) / step(p).

Checked on this machine (--check): calibrated on a scale study's world sizes 1 and 2 (c from the
step at 1, r and h from the steps at 2) with the interconnect
fitted to the bench, the prediction for the study's largest world size is compared with the step
measured there (labs/SCALING.md has the figures).

    distlab predict --scale results/scale/<study> --bench results/allreduce_bench/<run>/record.json --check
    distlab predict --cluster                    # the DGX and 1024-GPU tables: ResNet-18 and a 7B transformer
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from harness.console import console, print_json
from harness.usage import UsageError
from harness.verdict.profiles import tomllib  # the standard library's from 3.11, tomli before

TABLE = Path(__file__).resolve().parents[1] / "interconnects.toml"
BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb default, 25 MiB
FORWARD_SHARE = 1 / 3  # forward (and optimizer) of a step's compute; the backward is the other two thirds
RANKS = [2**k for k in range(11)]  # 1 .. 1024
CHECK_TOLERANCE = 0.15  # --check fails beyond this relative error of the predicted step


@dataclass(frozen=True)
class Link:
    """An interconnect in the alpha-beta model: alpha seconds per message step, beta seconds per byte."""

    name: str
    alpha: float
    beta: float
    source: str = ""

    @property
    def busbw_gbps(self) -> float:
        return 1 / self.beta / 1e9 if self.beta else math.inf


@dataclass(frozen=True)
class Step:
    """One rank's step: compute seconds per sample, gradient bytes, samples per rank per step."""

    name: str
    compute_per_sample: float
    grad_bytes: float
    per_rank_batch: int
    units: int = 4  # FSDP units
    source: str = ""


@dataclass
class Host:
    """How the ranks of a prediction sit: sharing `cores` of one host (CPU), or each on its own device."""

    cores: int | None = None  # None: one device per rank, no sharing
    threads: int = 1
    overlap: float = 1.0  # h: the share of DDP's bucket overlap the host gives (1 on GPUs)
    side_by_side: float = 1.0  # compute of 2+ ranks on one host over one rank's alone (memory bandwidth, caches)

    def contention(self, p: int) -> float:
        return 1.0 if self.cores is None else max(1.0, p * self.threads / self.cores)

    def compute_factor(self, p: int) -> float:
        return self.contention(p) * (self.side_by_side if p > 1 else 1.0)


# ------------------------------------------------------------------------------------- cost models


def log2_ceil(p: int) -> int:
    return max(0, math.ceil(math.log2(p)))


def ring_allreduce(n: float, p: int, link: Link) -> float:
    return 0.0 if p == 1 else 2 * (p - 1) * link.alpha + 2 * (p - 1) / p * n * link.beta


def tree_allreduce(n: float, p: int, link: Link) -> float:
    return 0.0 if p == 1 else 2 * log2_ceil(p) * link.alpha + 2 * n * link.beta


def ring_allgather(n: float, p: int, link: Link) -> float:
    return 0.0 if p == 1 else (p - 1) * link.alpha + (p - 1) / p * n * link.beta


ring_reduce_scatter = ring_allgather  # the same volume and steps, run the other way


ALGORITHMS = {"ring": ring_allreduce, "tree": tree_allreduce}


def allreduce(n: float, p: int, link: Link, algorithm: str = "best") -> float:
    if algorithm == "best":
        return min(ring_allreduce(n, p, link), tree_allreduce(n, p, link))
    return ALGORITHMS[algorithm](n, p, link)


def buckets(grad_bytes: float, bucket_bytes: float) -> list[float]:
    full, rest = divmod(grad_bytes, bucket_bytes)
    return [bucket_bytes] * int(full) + ([rest] if rest else [])


def ddp_step(step: Step, p: int, link: Link, host: Host, algorithm: str = "best",
             bucket_bytes: float = BUCKET_BYTES) -> dict[str, float]:
    """Seconds of one DDP step at p ranks, the compute in it and the communication waited for."""
    s = host.contention(p)
    compute = step.compute_per_sample * step.per_rank_batch * host.compute_factor(p)
    forward, backward = compute * FORWARD_SHARE, compute * (1 - FORWARD_SHARE)
    parts = buckets(step.grad_bytes, bucket_bytes)
    costs = [allreduce(n, p, link, algorithm) * s for n in parts]
    end = 0.0
    for i, cost in enumerate(costs, start=1):
        end = max(forward + backward * i / len(parts), end) + cost
    overlapped = max(compute, end) - compute
    serial = sum(costs)
    exposed = host.overlap * overlapped + (1 - host.overlap) * serial
    return {"step": compute + exposed, "compute": compute, "comm_exposed": exposed, "comm_total": serial}


def fsdp_step(step: Step, p: int, link: Link, host: Host) -> dict[str, float]:
    """Seconds of one FSDP (FULL_SHARD, prefetch) step at p ranks; P = the gradient bytes."""
    s = host.contention(p)
    compute = step.compute_per_sample * step.per_rank_batch * host.compute_factor(p)
    units = step.units
    f, g = compute * FORWARD_SHARE / units, compute * (1 - FORWARD_SHARE) / units
    gather = ring_allgather(step.grad_bytes / units, p, link) * s
    scatter = ring_reduce_scatter(step.grad_bytes / units, p, link) * s
    forward = gather + (units - 1) * max(gather, f) + f
    backward = gather + (units - 1) * max(gather + scatter, g) + g + scatter
    serial = units * (2 * gather + scatter)
    exposed = host.overlap * (forward + backward - compute) + (1 - host.overlap) * serial  # h as for DDP
    return {"step": compute + exposed, "compute": compute, "comm_exposed": exposed, "comm_total": serial}


def table_rows(step: Step, links: dict[int, Link] | Link, host: Host, ranks: list[int]) -> list[dict[str, Any]]:
    """Per rank count: DDP (ring, tree, the better) and FSDP step seconds, img/s and efficiency."""
    def link_at(p: int) -> Link:
        if isinstance(links, Link):
            return links
        return links[min(k for k in links if k >= p)] if any(k >= p for k in links) else links[max(links)]

    base = {"ddp": ddp_step(step, 1, link_at(1), host)["step"], "fsdp": fsdp_step(step, 1, link_at(1), host)["step"]}
    rows = []
    for p in ranks:
        link = link_at(p)
        ring, tree = (ddp_step(step, p, link, host, a)["step"] for a in ("ring", "tree"))
        ddp, fsdp = ddp_step(step, p, link, host), fsdp_step(step, p, link, host)
        rows.append({
            "ranks": p, "link": link.name, "ddp_ring_step_s": ring, "ddp_tree_step_s": tree,
            "ddp_step_s": ddp["step"], "ddp_comm_exposed_s": ddp["comm_exposed"],
            "ddp_samples_per_s": p * step.per_rank_batch / ddp["step"], "ddp_efficiency": base["ddp"] / ddp["step"],
            "fsdp_step_s": fsdp["step"], "fsdp_samples_per_s": p * step.per_rank_batch / fsdp["step"],
            "fsdp_efficiency": base["fsdp"] / fsdp["step"],
        })
    return rows


# --------------------------------------------------------------------------------- measured inputs


def fit_link(rows: list[tuple[int, float]], p: int, name: str = "measured") -> Link:
    """alpha and beta of the ring all-reduce model fitted to (bytes, seconds) measured at p ranks.

    t = a + b n with a = 2 (p-1) alpha and b = 2 (p-1)/p beta, by least squares on relative error
    (weights 1/t^2): the small sizes, all latency, fix a; the large ones, all bandwidth, fix b;
    neither drowns the other, as an unweighted fit lets the largest times decide everything.
    """
    if p < 2:
        raise UsageError(f"the bench ran at world size {p}: one rank measures no communication; run it at 2 or more")
    if len(rows) < 2:
        raise UsageError("the bench record has fewer than 2 sizes: a line needs two points; run it over a sweep")
    weighted = [(1 / t**2, n, t) for n, t in rows]
    sw = sum(w for w, _, _ in weighted)
    sx, sy = sum(w * n for w, n, _ in weighted), sum(w * t for w, _, t in weighted)
    sxx, sxy = sum(w * n * n for w, n, _ in weighted), sum(w * n * t for w, n, t in weighted)
    slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    intercept = (sy - slope * sx) / sw
    return Link(name, alpha=max(0.0, intercept) / (2 * (p - 1)), beta=slope * p / (2 * (p - 1)))


def load_bench(path: Path) -> tuple[Link, dict[str, Any]]:
    """The interconnect fitted to an allreduce_bench record (record.json, or its run folder)."""
    path = path / "record.json" if path.is_dir() else path
    try:
        record = json.loads(path.read_text())
        metrics = record["metrics"]
        p = int(metrics["world_size"])
        points = []
        for row in metrics["rows"]:
            if row["collective"] != "all_reduce":
                continue
            timed = next((row[m] for m in ("in-place", "out-of-place") if "time_us" in row.get(m, {})), None)
            if timed:
                points.append((row["size"], timed["time_us"] * 1e-6))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UsageError(f"--bench {path}: not an allreduce_bench record ({error}); give the record.json of "
                         "`distlab run allreduce_bench -n 2 -- -b 1K -e 16M`") from None
    link = fit_link(points, p, name=f"{record.get('config', {}).get('backend', '?')} bench, {p} ranks")
    fitted = {"alpha_us": link.alpha * 1e6, "busbw_gbps": link.busbw_gbps, "world_size": p,
              "points": [{"bytes": n, "seconds": t, "fitted_seconds": ring_allreduce(n, p, link)} for n, t in points],
              "record": str(path)}
    return link, fitted


@dataclass
class Study:
    """What a `distlab scale` study measured, per world size: the median over its repeats of each run's
    step_seconds, step_seconds_no_sync and img_per_sec (a repeat slowed by other work on the host
    moves a median less than a mean)."""

    path: Path
    rows: dict[int, dict[str, Any]]
    grad_bytes: float
    threads: int
    cores: int


def load_study(path: Path) -> Study:
    summary_path = path / "summary.json" if path.is_dir() else path
    rows: dict[int, dict[str, Any]] = {}
    try:
        summary = json.loads(summary_path.read_text())
        for row in summary["rows"]:
            runs = [json.loads((summary_path.parent / run / "record.json").read_text())["metrics"]
                    for run in row["runs"]]
            rows[int(row["world_size"])] = {
                "world_size": int(row["world_size"]), "per_rank_batch": int(row["per_rank_batch"]),
                "repeats": len(runs), **{name: statistics.median(float(m[name]) for m in runs)
                                         for name in ("step_seconds", "step_seconds_no_sync", "img_per_sec")},
                "img_per_sec_samples": [m["img_per_sec"] for m in runs]}
        grad_bytes = float(runs[0]["allreduce_bytes"])
        threads, cores = int(summary["threads_per_rank"]), int(summary["cores"])
    except (OSError, ValueError, KeyError, TypeError, IndexError, statistics.StatisticsError) as error:
        raise UsageError(f"--scale {path}: not a distlab scale study ({error}); give the folder "
                         "`distlab scale --lab ddp --world-sizes 1,2,4` printed after 'results:'") from None
    if 1 not in rows:
        raise UsageError(f"--scale {path}: the study has no world size 1, whose step is the compute alone; "
                         "run it with --world-sizes 1,2,...")
    return Study(summary_path.parent, rows, grad_bytes, threads, cores)


def measured_step(study: Study) -> Step:
    one = study.rows[1]
    return Step("measured", one["step_seconds_no_sync"] / one["per_rank_batch"], study.grad_bytes,
                int(one["per_rank_batch"]), source=f"distlab scale {study.path}, world size 1")


def calibrate_host(study: Study, step: Step, link: Link, bucket_bytes: float = BUCKET_BYTES) -> Host:
    """The host as the study's world sizes 1 and 2 measured it: its cores and threads; the compute
    slowdown of two ranks side by side (step_seconds_no_sync at 2 over 1); and h, the share of the
    bucket overlap that makes the model's 2-rank DDP step the one measured there (clipped to [0, 1])."""
    host = Host(study.cores, study.threads, overlap=0.0)
    if 2 not in study.rows:
        return host
    host.side_by_side = study.rows[2]["step_seconds_no_sync"] / study.rows[1]["step_seconds_no_sync"]
    measured = study.rows[2]["step_seconds"]
    without = ddp_step(step, 2, link, host, bucket_bytes=bucket_bytes)["step"]
    full = ddp_step(step, 2, link, dataclasses.replace(host, overlap=1.0), bucket_bytes=bucket_bytes)["step"]
    host.overlap = 1.0 if without == full else min(1.0, max(0.0, (without - measured) / (without - full)))
    return host


def check(study: Study, link: Link) -> dict[str, Any]:
    """Calibrated on world sizes 1 and 2, the predicted step at the study's largest world size against
    the one measured there."""
    target = max(study.rows)
    if target <= 2 or 2 not in study.rows:
        raise UsageError("--check needs a study with world sizes 1, 2 and a larger one (e.g. --world-sizes 1,2,4)")
    step = measured_step(study)
    host = calibrate_host(study, step, link)
    predicted = ddp_step(step, target, link, host)
    measured = study.rows[target]
    measured_rate = measured["img_per_sec"]
    predicted_rate = target * step.per_rank_batch / predicted["step"]
    return {"world_size": target, "calibrated_on": [1, 2], "overlap": host.overlap,
            "side_by_side": host.side_by_side, "contention": host.contention(target),
            "predicted_step_s": predicted["step"], "measured_step_s": measured["step_seconds"],
            "predicted_img_per_sec": predicted_rate, "measured_img_per_sec": measured_rate,
            "error": predicted["step"] / measured["step_seconds"] - 1,
            "img_per_sec_samples": measured["img_per_sec_samples"]}


# -------------------------------------------------------------------------------- published inputs


def load_table(path: Path = TABLE) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise UsageError(f"{path}: {error}") from None


def published_links(table: dict[str, Any], alpha_us: float | None) -> dict[int, Link]:
    """Rank count -> the tier that carries it: NVLink up to one node's ranks, then InfiniBand.
    The low end of each published busbw range (a prediction should not promise the best day)."""
    tiers = {}
    for name, row in table["interconnects"].items():
        alpha = (row["latency_us"] if alpha_us is None else alpha_us) * 1e-6
        tiers[int(row["ranks"])] = Link(name, alpha, 1 / (min(row["busbw_gbps"]) * 1e9), row["busbw_source"])
    return tiers


def published_step(table: dict[str, Any], name: str) -> Step:
    w = table["workloads"][name]
    seconds = w["flops_per_sample"] / (w["peak_tflops"] * 1e12 * w["mfu"])
    return Step(name, seconds, w["grad_bytes"], int(w["per_rank_batch"]), int(w["units"]),
                source=f"{w['flops_per_sample']:.4g} FLOPs / ({w['peak_tflops']} TFLOPS x MFU {w['mfu']}): "
                       f"{w['mfu_source']}")


# ------------------------------------------------------------------------------------------ output


def wide() -> Console:
    """The console, or one wide enough for the table where the terminal is narrow (logs, CI)."""
    return console if console.width >= 130 else Console(highlight=False, width=130, file=console.file)


def rows_table(title: str, rows: list[dict[str, Any]], unit: str) -> Table:
    out = Table(title=title)
    for column in ("ranks", "link", "DDP ring ms", "DDP tree ms", f"DDP {unit}/s", "DDP eff.", "FSDP ms",
                   f"FSDP {unit}/s", "FSDP eff."):
        out.add_column(column, justify="left" if column == "link" else "right", no_wrap=True)
    for r in rows:
        out.add_row(str(r["ranks"]), r["link"], f"{r['ddp_ring_step_s'] * 1e3:.1f}",
                    f"{r['ddp_tree_step_s'] * 1e3:.1f}",
                    f"{r['ddp_samples_per_s']:,.0f}", f"{r['ddp_efficiency']:.2f}", f"{r['fsdp_step_s'] * 1e3:.1f}",
                    f"{r['fsdp_samples_per_s']:,.0f}", f"{r['fsdp_efficiency']:.2f}")
    return out


def plot(predictions: list[dict[str, Any]], path: Path) -> Path:
    """Weak-scaling efficiency against ranks, DDP and FSDP, one line per prediction."""
    from harness.report.plots import pyplot, save

    fig, ax = pyplot().subplots(figsize=(7, 4.5))
    for i, prediction in enumerate(predictions):
        ranks = [r["ranks"] for r in prediction["rows"]]
        ax.plot(ranks, [r["ddp_efficiency"] for r in prediction["rows"]], marker="o", color=f"C{i}",
                label=f"{prediction['name']}: DDP")
        ax.plot(ranks, [r["fsdp_efficiency"] for r in prediction["rows"]], marker="s", linestyle="--",
                color=f"C{i}", label=f"{prediction['name']}: FSDP")
    measured = [m for prediction in predictions for m in prediction.get("measured", [])]
    for m in measured:
        ax.scatter([m["ranks"]], [m["efficiency"]], marker="x", color="black", zorder=3)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="ranks", ylabel="weak-scaling efficiency step(1) / step(p)", ylim=(0, 1.05),
           title="Predicted weak-scaling efficiency" + (" (x: measured)" if measured else ""))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    return save(fig, path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scale", type=Path, help="a distlab scale study folder: the measured step")
    parser.add_argument("--bench", type=Path, help="an allreduce_bench record.json (or its run folder): the "
                                                    "measured interconnect")
    parser.add_argument("--check", action="store_true",
                        help="calibrated on the study's world sizes 1 and 2, compare with its largest one")
    parser.add_argument("--cluster", action="store_true",
                        help="the DGX (NVLink) and 1024-GPU (InfiniBand) tables from harness/interconnects.toml")
    parser.add_argument("--alpha-us", type=float, help="--cluster: latency per message step (default: the table's)")
    parser.add_argument("--max-ranks", type=int, default=1024, help="predict up to this many ranks (a power of 2)")
    parser.add_argument("--output", type=Path, default=Path("results/predict"),
                        help="folder for prediction.json and efficiency.png (a fresh subfolder per call)")
    parser.add_argument("--json", action="store_true", help="print the prediction as JSON on stdout")


def cmd_predict(args: argparse.Namespace, lab_args: list[str]) -> int:
    if lab_args:
        raise UsageError("distlab predict takes no arguments after --")
    if not args.cluster and not (args.scale and args.bench):
        raise UsageError("give --scale STUDY and --bench RECORD (this machine, measured), or --cluster "
                         "(published figures)")
    if args.check and not (args.scale and args.bench):
        raise UsageError("--check needs --scale STUDY (world sizes 1, 2 and more) and --bench RECORD")
    if args.max_ranks < 1 or args.max_ranks & (args.max_ranks - 1):
        raise UsageError(f"--max-ranks {args.max_ranks}: give a power of 2, e.g. 1024")
    ranks = [p for p in RANKS + [2**k for k in range(11, 21)] if p <= args.max_ranks]
    out: dict[str, Any] = {"kind": "prediction", "made": dt.datetime.now(dt.timezone.utc).isoformat(),
                           "model": "alpha-beta (harness/commands/predict.py docstring)", "predictions": []}
    if args.scale and args.bench:
        study, (link, fitted) = load_study(args.scale), load_bench(args.bench)
        step = measured_step(study)
        host = calibrate_host(study, step, link)
        rows = table_rows(step, link, host, ranks)
        base = study.rows[1]["img_per_sec"]
        measured = [{"ranks": ws, "efficiency": r["img_per_sec"] / (ws * base)} for ws, r in study.rows.items()]
        out["predictions"].append({"name": "this host", "step": asdict(step), "link": asdict(link), "fit": fitted,
                                   "host": asdict(host), "rows": rows, "measured": measured})
        console.print(f"PREDICTION for this host, {study.cores} cores shared, {study.threads} thread(s) per rank: "
                      f"compute {step.compute_per_sample * 1e3:.2f} ms/sample x {step.per_rank_batch}, gradients "
                      f"{step.grad_bytes / 1e6:.1f} MB; link alpha {link.alpha * 1e6:.1f} us, busbw "
                      f"{link.busbw_gbps:.2f} GB/s (fitted to {args.bench}); calibrated at 2 ranks: overlap h = "
                      f"{host.overlap:.2f}, compute side by side x{host.side_by_side:.2f}", markup=False)
        wide().print(rows_table("this host, predicted", rows, "img"))
        if args.check:
            result = check(study, link)
            out["check"] = result
            console.print(f"check: predicted {result['predicted_step_s'] * 1e3:.0f} ms per step at world size "
                          f"{result['world_size']}, measured {result['measured_step_s'] * 1e3:.0f} ms: error "
                          f"{result['error']:+.1%} (calibrated on world sizes 1 and 2)", markup=False)
    if args.cluster:
        table = load_table()
        links = published_links(table, args.alpha_us)
        for name in table["workloads"]:
            step = published_step(table, name)
            rows = table_rows(step, links, Host(), ranks)
            out["predictions"].append({"name": name, "step": asdict(step), "links": {str(k): asdict(v)
                                                                                     for k, v in links.items()},
                                       "host": asdict(Host()), "rows": rows})
            console.print(f"PREDICTION (not measured) for {table['workloads'][name]['what']}: compute "
                          f"{step.compute_per_sample * 1e3:.3f} ms/sample x {step.per_rank_batch} per rank "
                          f"({step.source}); "
                          f"gradients {step.grad_bytes / 1e9:.3g} GB", markup=False)
            for link in links.values():
                console.print(f"  {link.name}: busbw {link.busbw_gbps:.0f} GB/s, alpha {link.alpha * 1e6:.1f} us; "
                              f"{link.source}", markup=False)
            wide().print(rows_table(f"{name}, predicted (1..{ranks[-1]} ranks)", rows, "sample"))
    folder = args.output / dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    folder.mkdir(parents=True, exist_ok=False)
    out["plot"] = str(plot(out["predictions"], folder / "efficiency.png"))
    (folder / "prediction.json").write_text(json.dumps(out, indent=2) + "\n")
    console.print(f"prediction: {folder / 'prediction.json'}; plot: {out['plot']}", markup=False)
    if args.json:
        print_json(out)
    if "check" in out:
        return 0 if abs(out["check"]["error"]) <= CHECK_TOLERANCE else 1
    return 0

