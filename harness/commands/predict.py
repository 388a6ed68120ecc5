"""`distlab predict`: data-parallel step time, throughput and weak-scaling efficiency past this machine.

The model (the alpha-beta cost of each collective, DDP's bucket overlap, FSDP's prefetching, ranks
sharing a host's cores) is harness/planning/step_model.py's, with its formulas; this module feeds it
measurements or published figures and shows what it predicts.

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
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from harness.console import console, print_json
from harness.files import write_json
from harness.planning.step_model import BUCKET_BYTES, Host, Link, Step, ddp_step, fit_link, ring_allreduce, table_rows
from harness.usage import UsageError
from harness.verdict.profiles import tomllib  # the standard library's from 3.11, tomli before

TABLE = Path(__file__).resolve().parents[1] / "interconnects.toml"
RANKS = [2**k for k in range(11)]  # 1 .. 1024
CHECK_TOLERANCE = 0.15  # --check fails beyond this relative error of the predicted step


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


DESCRIPTION = ("DDP and FSDP past this machine, from a measured step and interconnect "
               "(harness/planning/step_model.py: the formulas; labs/SCALING.md).")
EXAMPLES = """examples:
  distlab predict --scale results/scale/STUDY --bench results/allreduce_bench/RUN --check
  distlab predict --cluster          # DGX H100 and 1024 GPUs over InfiniBand, from published figures"""


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


def run(args: argparse.Namespace, lab_args: list[str]) -> int:
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
                           "model": "alpha-beta (harness/planning/step_model.py docstring)", "predictions": []}
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
    write_json(folder / "prediction.json", out)
    console.print(f"prediction: {folder / 'prediction.json'}; plot: {out['plot']}", markup=False)
    if args.json:
        print_json(out)
    if "check" in out:
        return 0 if abs(out["check"]["error"]) <= CHECK_TOLERANCE else 1
    return 0
