"""`distlab compare`: the lecture's table of DDP, Horovod, ZeRO, FSDP and DeepSpeed, generated from runs.

    distlab compare                                  # world sizes 1 and 2, the default model
    distlab compare --smoke --world-sizes 2          # seconds-long runs
    distlab compare --from results/compare/STUDY     # the table again from a study's runs

One program per tool in labs/deepspeed/compare/, each the baseline (single.py: labs/fsdp's model
in one process) plus what the tool needs, all on the same model, the same global batch and the
same steps, each started by the tool's real launcher through runner.run_lab (torchrun, horovodrun;
plain python at world size 1). From each run's record: peak bytes of tensors alive per rank and the
step time (the programs share one meter, labs/deepspeed/compare/common.py); throughput is a ratio
to DDP's at the same world size, measured in the same study. Complexity is measured, not judged:
the lines of code (not blank, not comments) each program adds to the baseline, by difflib. Output
in a fresh folder <results>/compare/<time>-ws<largest>-<tools>/: summary.json, compare.md,
compare.html with the plot compare.png, and each run's own folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import difflib
import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.console import console, print_json, run_progress
from harness.files import write_json
from harness.report import pages
from harness.report.plots import pyplot, save
from harness.run.request import build_request
from harness.run.run_dir import new_run_dir
from harness.run.runner import run_lab
from harness.usage import UsageError, absolute_path, positive_float, positive_int, world_size_list
from labs.common.host import REPO, usable_cores

SCHEMA = "distlab-compare"
PROGRAMS = REPO / "labs" / "deepspeed" / "compare"
BASELINE = PROGRAMS / "single.py"


@dataclass(frozen=True)
class Tool:
    name: str
    label: str  # as the lecture names it
    lab: str  # the catalog row whose backends and launchers the run takes (harness/catalog.py)
    program: str  # in labs/deepspeed/compare/
    backend: str
    args: tuple[str, ...] = ()
    world_size_1_only: bool = False


TOOLS = {tool.name: tool for tool in [
    Tool("single", "one process (the baseline)", "baseline", "single.py", "none", world_size_1_only=True),
    Tool("ddp", "PyTorch DDP", "fsdp", "ddp.py", "gloo"),
    Tool("horovod", "Horovod", "horovod", "horovod_train.py", "horovod"),
    Tool("zero1", "torch ZeRO-1 (ZeroRedundancyOptimizer)", "fsdp", "zero1.py", "gloo"),
    Tool("fsdp2", "FSDP2 (fully_shard)", "fsdp", "fsdp2.py", "gloo"),
    Tool("deepspeed-zero1", "DeepSpeed ZeRO-1", "deepspeed", "deepspeed_zero.py", "gloo", ("--stage", "1")),
    Tool("deepspeed-zero2", "DeepSpeed ZeRO-2", "deepspeed", "deepspeed_zero.py", "gloo", ("--stage", "2")),
    Tool("deepspeed-zero3", "DeepSpeed ZeRO-3", "deepspeed", "deepspeed_zero.py", "gloo", ("--stage", "3")),
]}
REFERENCE = "ddp"  # throughput is relative to it, at each world size


DESCRIPTION = ("Each tool's program on the same model and batch through its launcher; memory, step time, "
               "throughput vs DDP, lines added (labs/PARALLELISM.md).")
EXAMPLES = """examples:
  distlab compare               # DDP, Horovod, ZeRO, FSDP2, DeepSpeed at world sizes 1, 2
  distlab compare --smoke --world-sizes 2 --tools ddp,fsdp2,deepspeed-zero3"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-sizes", type=world_size_list, default=[1, 2], help="e.g. 1,2 (default 1,2)")
    parser.add_argument("--tools", default=",".join(TOOLS),
                        help=f"comma-separated, of: {', '.join(TOOLS)} (default: all)")
    parser.add_argument("--smoke", action="store_true", help="the programs' seconds-long model and steps")
    parser.add_argument("--gpu", action="store_true",
                        help="one GPU per rank, NCCL (Horovod: its own) (default: the CPUs, Gloo)")
    parser.add_argument("--threads", type=positive_int, default=1, help="OMP threads per rank (default 1)")
    parser.add_argument("--timeout", type=positive_float, default=600.0, help="seconds per run (default 600)")
    parser.add_argument("--results", type=absolute_path, default="results", help="results root (default ./results)")
    parser.add_argument("--from", dest="from_study", type=Path,
                        help="write the table again from this study folder's runs (runs nothing)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")


# ------------------------------------------------------------------------------------ complexity


def code_lines(path: Path) -> list[str]:
    """The program's lines of code: blank lines, comments and the module docstring left out."""
    lines, in_docstring = [], False
    for number, raw in enumerate(path.read_text().splitlines()):
        line = raw.strip()
        if number == 0 and line.startswith('"""'):
            in_docstring = not (line.endswith('"""') and len(line) > 3)
            continue
        if in_docstring:
            in_docstring = not line.endswith('"""')
            continue
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def lines_added(program: Path, baseline: Path = BASELINE) -> dict[str, int]:
    """Lines of code the program adds to (and changes from) the baseline, by difflib."""
    diff = list(difflib.ndiff(code_lines(baseline), code_lines(program)))
    return {"added": sum(line.startswith("+ ") for line in diff),
            "removed": sum(line.startswith("- ") for line in diff), "lines": len(code_lines(program))}


# ------------------------------------------------------------------------------------ the table


def table_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per tool and world size from the runs' records; throughput over DDP's at that size."""
    rows, reference = [], {}
    for run in runs:
        metrics = run["metrics"]
        if run["tool"] == REFERENCE:
            reference[metrics["world_size"]] = metrics["samples_per_second"]
    for run in runs:
        metrics, tool = run["metrics"], TOOLS[run["tool"]]
        ddp = reference.get(metrics["world_size"])
        peaks = metrics["peak_tensor_bytes_per_rank"]
        rows.append({
            "tool": tool.name, "label": tool.label, "world_size": metrics["world_size"],
            "peak_bytes_per_rank": max(peaks), "peak_bytes_by_rank": peaks,
            "step_seconds": metrics["step_seconds"], "samples_per_second": metrics["samples_per_second"],
            "throughput_vs_ddp": metrics["samples_per_second"] / ddp if ddp else None,
            "memory_vs_ddp": None, "lines_added": run["complexity"]["added"], "run": run["run"],
        })
    ddp_memory = {r["world_size"]: r["peak_bytes_per_rank"] for r in rows if r["tool"] == REFERENCE}
    for row in rows:
        if row["world_size"] in ddp_memory:
            row["memory_vs_ddp"] = row["peak_bytes_per_rank"] / ddp_memory[row["world_size"]]
    order = list(TOOLS)
    return sorted(rows, key=lambda r: (r["world_size"], order.index(r["tool"])))


COLUMNS = ["tool", "world size", "peak MiB/rank", "vs DDP", "step ms", "samples/s", "throughput vs DDP",
           "lines added"]


def cells(row: dict[str, Any]) -> list[str]:
    def ratio(value):
        return "-" if value is None else f"{value:.2f}"

    return [row["label"], str(row["world_size"]), f"{row['peak_bytes_per_rank'] / 2**20:.2f}",
            ratio(row["memory_vs_ddp"]), f"{row['step_seconds'] * 1e3:.1f}", f"{row['samples_per_second']:.0f}",
            ratio(row["throughput_vs_ddp"]), str(row["lines_added"])]


def provenance_line(summary: dict[str, Any]) -> str:
    return (f"{summary['cpu']}, {summary['cores']} cores, {summary['backend']}, {summary['threads_per_rank']} "
            f"thread(s)/rank, model of {summary['parameters']:,} parameters, global batch {summary['global_batch']}, "
            f"{summary['steps']} steps ({summary['warmup_steps']} warm-up), {summary['start'][:16]} UTC, "
            f"{summary['seconds']:.0f} s in all")


def markdown(summary: dict[str, Any]) -> str:
    lines = [f"# distlab compare: {summary['status']}", "", provenance_line(summary), "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(pages.md_cell(c) for c in cells(row)) + " |" for row in summary["rows"]]
    lines += ["", *summary["notes"]]
    if summary["reason"]:
        lines += ["", f"**failed**: {summary['reason']}"]
    return "\n".join(lines) + "\n"


def html_page(summary: dict[str, Any], images: list[Path]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in cells(row)) + "</tr>" for row in summary["rows"])
    notes = "".join(f"<p>{e(n)}</p>" for n in summary["notes"])
    failed = f"<p class='fail'>failed: {e(summary['reason'])}</p>" if summary["reason"] else ""
    return pages.page("distlab compare", f"<h1>distlab compare: {e(summary['status'])}</h1>"
                       f"<p>{e(provenance_line(summary))}</p>{failed}<table><tr>{head}</tr>{body}</table>{notes}"
                       f"{pages.figures(images)}")


def plot(summary: dict[str, Any], out: Path) -> Path | None:
    """Peak memory per rank and throughput against DDP's, one bar per tool, per world size."""
    rows = [r for r in summary["rows"] if r["tool"] != "single"]
    if not rows:
        return None
    sizes = sorted({r["world_size"] for r in rows})
    tools = [t for t in TOOLS if any(r["tool"] == t for r in rows)]
    fig, (memory, speed) = pyplot().subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(sizes)
    for i, size in enumerate(sizes):
        by_tool = {r["tool"]: r for r in rows if r["world_size"] == size}
        xs = [t + i * width for t in range(len(tools))]
        memory.bar(xs, [by_tool[t]["peak_bytes_per_rank"] / 2**20 if t in by_tool else 0 for t in tools],
                   width, label=f"world size {size}")
        speed.bar(xs, [(by_tool[t]["throughput_vs_ddp"] or 0) if t in by_tool else 0 for t in tools], width,
                  label=f"world size {size}")
    for ax, ylabel, title in ((memory, "MiB of tensors, largest rank", "Peak memory per rank"),
                              (speed, "samples/s over DDP's", "Throughput relative to DDP")):
        ax.set_xticks([t + width * (len(sizes) - 1) / 2 for t in range(len(tools))], tools, rotation=30,
                      ha="right", fontsize="small")
        ax.set(ylabel=ylabel, title=title)
        ax.legend(fontsize="small")
    speed.axhline(1.0, color="grey", linestyle="--")
    return save(fig, out / "compare.png")


def notes(summary: dict[str, Any]) -> list[str]:
    return [
        "peak MiB/rank: the bytes of every tensor alive on the rank (parameters, gradients, optimizer state, the "
        "tool's buffers) at the end of the last backward or step, the larger; the largest rank's. Activations "
        "inside forward and backward are not in it.",
        "step ms: each program's mean step after the warm-up, timed by the same meter (labs/deepspeed/compare/"
        "common.py); throughput vs DDP: samples/s over DDP's at the same world size, in this study.",
        "lines added: lines of code (not blank, not comments) each program adds to labs/deepspeed/compare/single.py, "
        "counted by difflib.",
    ]


# ------------------------------------------------------------------------------------ the study


def plan_runs(args: argparse.Namespace) -> list[tuple[Tool, int]]:
    names = [n.strip() for n in args.tools.split(",") if n.strip()]
    unknown = [n for n in names if n not in TOOLS]
    if unknown or not names:
        raise UsageError(f"unknown tool {unknown[0] if unknown else args.tools!r}; choose from: {', '.join(TOOLS)}")
    cores = usable_cores().count
    too_many = [ws for ws in args.world_sizes if ws * args.threads > 4 * cores]
    if too_many:
        raise UsageError(f"world size {too_many[0]} x {args.threads} thread(s) is over 4x this host's {cores} cores; "
                         "choose smaller --world-sizes")
    planned = [(TOOLS[name], ws) for ws in args.world_sizes for name in names
               if not (TOOLS[name].world_size_1_only and ws > 1)]
    if not planned:
        raise UsageError(f"--tools {args.tools} runs at world size 1 only; add 1 to --world-sizes or choose more tools")
    return planned


def run(args: argparse.Namespace, lab_args: list[str]) -> int:
    if lab_args:
        raise UsageError(f"distlab compare takes no lab arguments ({' '.join(lab_args)}); use --smoke or --tools")
    if args.from_study is not None:
        return rebuild(args.from_study, args)
    planned = plan_runs(args)
    backend_for = {"gloo": "nccl" if args.gpu else "gloo"}
    requests = []
    for tool, ws in planned:  # every request checked before the first run starts
        lab_args = [*tool.args, *(["--smoke"] if args.smoke else []), *(["--device", "cuda"] if args.gpu else [])]
        backend = backend_for.get(tool.backend, tool.backend)
        requests.append((tool, build_request(tool.lab, ws, lab_args, backend=backend, threads=args.threads,
                                             timeout_s=args.timeout, results_root=args.results,
                                             program=PROGRAMS / tool.program)))
    sizes = sorted({ws for _, ws in planned})
    study = new_run_dir(args.results, "compare", sizes[-1], "tools")
    started = dt.datetime.now(dt.timezone.utc)
    console.print(f"distlab compare: {len(requests)} runs ({', '.join(dict.fromkeys(t.name for t, _ in planned))}) "
                  f"at world sizes {','.join(map(str, sizes))}")
    runs, failure = [], None
    with run_progress(len(requests)) as progress:
        for tool, request in requests:
            progress.started(f"{tool.name}, world size {request.world_size}")
            result = run_lab(dataclasses.replace(request, results_root=study), echo=False, on_line=progress.line)
            if not result.ok:
                progress.ended("FAILED")
                failure = f"{tool.name} at world size {request.world_size}: {result.reason} (see {result.run_dir})"
                break
            assert result.record is not None  # an ok run has its record, the harness's if not the lab's
            step_ms = result.record["metrics"]["step_seconds"] * 1e3
            progress.ended(f"{step_ms:.1f} ms/step in {result.wall_seconds:.0f} s")
            runs.append({"tool": tool.name, "run": str(result.run_dir.relative_to(study)),
                         "metrics": result.record["metrics"], "provenance": result.record["provenance"]})
    seconds = (dt.datetime.now(dt.timezone.utc) - started).total_seconds()
    summary = summarize(runs, failure, args, started.isoformat(), seconds)
    return finish(study, summary, args)


def summarize(runs: list[dict[str, Any]], failure: str | None, args: argparse.Namespace, start: str,
              seconds: float) -> dict[str, Any]:
    complexity = {name: lines_added(PROGRAMS / tool.program) for name, tool in TOOLS.items()}
    for run_ in runs:
        run_["complexity"] = complexity[run_["tool"]]
    first = runs[0] if runs else {"metrics": {}, "provenance": {}}
    hardware = first["provenance"].get("hardware", {})
    summary = {
        "schema": SCHEMA, "schema_version": 1, "status": "failed" if failure else "ok", "reason": failure,
        "backend": ", ".join(sorted({r["provenance"].get("backend", "-") for r in runs} - {"none"})) or "-",
        "threads_per_rank": args.threads,
        "cpu": hardware.get("cpu_model", "-"), "cores": hardware.get("cores", usable_cores().count),
        "parameters": first["metrics"].get("parameters", 0), "global_batch": first["metrics"].get("global_batch", 0),
        "steps": first["metrics"].get("steps", 0), "warmup_steps": 2, "start": start, "seconds": seconds,
        "complexity": complexity, "runs": runs, "rows": table_rows(runs),
    }
    summary["notes"] = notes(summary)
    return summary


def finish(study: Path, summary: dict[str, Any], args: argparse.Namespace) -> int:
    write_json(study / "summary.json", summary)
    image = plot(summary, study)
    (study / "compare.md").write_text(markdown(summary))
    (study / "compare.html").write_text(html_page(summary, [image] if image else []))
    console.print(markdown(summary), markup=False, highlight=False)
    console.print(f"report: {study / 'compare.html'}", markup=False)
    if args.json:
        print_json({**summary, "results": str(study)})
    return 1 if summary["status"] != "ok" else 0


def rebuild(study: Path, args: argparse.Namespace) -> int:
    """The table again from a study's summary.json (after a change to the table, say): runs nothing."""
    path = study / "summary.json"
    if not path.is_file():
        raise UsageError(f"{study} holds no summary.json; give a folder `distlab compare` wrote "
                         "(results/compare/<time>-ws<N>-tools)")
    try:
        old = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise UsageError(f"{path} is not readable JSON ({error}); run `distlab compare` again") from None
    if not isinstance(old, dict) or old.get("schema") != SCHEMA or not isinstance(old.get("runs"), list):
        raise UsageError(f"{path} is not a `distlab compare` summary (schema {SCHEMA!r}); run `distlab compare` again")
    try:
        summary = summarize(old["runs"], old.get("reason"), argparse.Namespace(threads=old.get("threads_per_rank", 1)),
                            old.get("start", "-"), old.get("seconds", 0.0))
    except (KeyError, TypeError, ZeroDivisionError) as error:
        raise UsageError(f"{path} has a run without the fields the table needs ({error}); run `distlab compare` "
                         "again") from None
    return finish(study, summary, args)

