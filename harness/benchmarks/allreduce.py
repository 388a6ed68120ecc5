"""Benchmark of the benchmark: allreduce_bench's busbw against the tightest plain loop in the same library.

allreduce_bench goes through a table, binders, checks and a record; none of that may cost bandwidth.
For each library both programs run through the real launchers on the same sizes (1 MiB and up by
default) in interleaved pairs, A B, B A, A B, ... (--pairs of them, after --warmup-pairs pairs that
are run and thrown away), and per size each pair gives one ratio, allreduce_bench's busbw over the
plain loop's. The verdict is on the median of those paired ratios: ratio >= 0.95, at every size.

Why paired and why the median: on a shared machine the spread between two runs of one program is
larger than the 5% being tested (labs/PERFORMANCE.md). Load that comes and goes over seconds
slows both runs of a pair alike and cancels in their ratio; a burst that hits only one run of a
pair makes that ratio an outlier, high or low, and the median ignores outliers as long as fewer
than half the pairs are hit. The spread of the paired ratios (quartiles, min and max) is printed
beside the median: it says how far the machine let the two sides be compared.

  mpi   mpirun   allreduce_bench --backend mpi, out-of-place  vs  mpi4py Allreduce loop (plain_allreduce.py)
  gloo  torchrun allreduce_bench --backend gloo, in-place     vs  dist.all_reduce loop (plain_allreduce.py)
  nccl  torchrun allreduce_bench --backend nccl, in-place     vs  nccl-tests all_reduce_perf, in-place
        (needs GPUs and all_reduce_perf on PATH; skipped with the reason otherwise)

Both sides use buffers from torch's allocator (plain_allreduce.py says why that matters for MPI).

    distlab bench allreduce --world-size 2 --pairs 10 --out bench.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.catalog import LABS
from harness.files import write_json
from harness.on_ranks import PLAIN_ALLREDUCE
from harness.run.launchers import find_tool
from harness.run.request import RunRequest
from harness.run.runner import run_lab
from harness.usage import UsageError
from labs.common.host import gpu_count, usable_cores
from labs.common.sizes import parse_size

TARGET = 0.95
PAIRS, WARMUP_PAIRS = 10, 1
console = Console()


@dataclass(frozen=True)
class Library:
    name: str
    launcher: str
    mode: str  # the form both sides run: torch's all_reduce exists only in place
    reference: str
    needs: Callable[[int], str | None]  # world size -> why it cannot run here, or None


def _mpi_missing(world_size: int) -> str | None:
    if not find_tool("mpirun"):
        return "no mpirun on PATH"
    probe = subprocess.run([sys.executable, "-c", "import mpi4py"], capture_output=True)
    return "mpi4py is not installed" if probe.returncode else None


def _nccl_missing(world_size: int) -> str | None:
    if gpu_count() < world_size:
        return f"needs {world_size} GPUs, {gpu_count()} visible"
    if not shutil.which("all_reduce_perf"):
        return "nccl-tests' all_reduce_perf is not on PATH (NGC PyTorch images ship it in recent tags)"
    return None


LIBRARIES = {lib.name: lib for lib in [
    Library("mpi", "mpirun", "out-of-place", "mpi4py Allreduce loop", _mpi_missing),
    Library("gloo", "torchrun", "in-place", "dist.all_reduce loop", lambda n: None),
    Library("nccl", "torchrun", "in-place", "nccl-tests all_reduce_perf", _nccl_missing),
]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--libraries", default="mpi,gloo,nccl", help="comma-separated: " + ", ".join(LIBRARIES))
    parser.add_argument("-b", "--min-bytes", type=parse_size, default=1 << 20, help="default 1M")
    parser.add_argument("-e", "--max-bytes", type=parse_size, default=16 << 20, help="default 16M")
    parser.add_argument("-w", "--warmup-iters", type=int, default=5, help="untimed calls per size in each run")
    parser.add_argument("-n", "--iters", type=int, default=50, help="timed calls per size in each run")
    parser.add_argument("--pairs", type=int, default=PAIRS,
                        help="interleaved pairs of runs (A B, B A, ...); the verdict is on the median paired ratio")
    parser.add_argument("--warmup-pairs", type=int, default=WARMUP_PAIRS,
                        help="pairs run first and not counted (page cache, CPU frequency, the first launch's costs)")
    parser.add_argument("--target", type=float, default=TARGET)
    parser.add_argument("--out", type=Path, help="write every measurement here as JSON")
    parser.add_argument("--keep", type=Path, help="keep the runs' records and logs in this folder")


def run(args: argparse.Namespace) -> int:
    libraries = [name.strip() for name in args.libraries.split(",")]
    for name in libraries:
        if name not in LIBRARIES:
            raise UsageError(f"--libraries: unknown {name!r}; choose from {', '.join(LIBRARIES)}")
    if args.min_bytes < 4 or args.min_bytes > args.max_bytes or args.min_bytes % 4 or args.max_bytes % 4:
        raise UsageError("sizes must be multiples of 4 bytes (float32) with -b <= -e")
    if args.world_size < 2 or args.iters < 1 or args.pairs < 1 or args.warmup_pairs < 0:
        raise UsageError("--world-size must be at least 2, --iters and --pairs at least 1, --warmup-pairs at least 0")
    sizes = [args.min_bytes]
    while sizes[-1] * 2 <= args.max_bytes:
        sizes.append(sizes[-1] * 2)

    workdir = args.keep or Path(tempfile.mkdtemp(prefix="distlab-bench-"))
    results: list[dict[str, Any]] = []
    failed = False
    try:
        for name in libraries:
            library = LIBRARIES[name]
            reason = library.needs(args.world_size)
            if reason:
                console.print(f"[yellow]{name}: skipped[/]: {escape(reason)}")
                results.append({"library": name, "skipped": reason})
                continue
            pairs = measure_pairs(library, sizes, args, workdir / name)
            if pairs is None:
                failed = True
                break
            results.append(compare(library, sizes, pairs, args.target))
            save(results, sizes, args)  # each library as it finishes: a long run stopped later keeps it
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)

    print_results(results, args)
    save(results, sizes, args)
    if failed:
        return 2
    rows = [row for r in results for row in r.get("rows", [])]
    return 0 if rows and all(row["passed"] for row in rows) else 1


def measure_pairs(library: Library, sizes: list[int], args: argparse.Namespace, workdir: Path
                  ) -> list[tuple[dict[int, float], dict[int, float]]] | None:
    """The bench and the reference run side by side, pair after pair, past the warm-up pairs; None
    (and why, printed) where a run failed."""
    pairs = []
    for index in range(args.warmup_pairs + args.pairs):
        # A B, then B A: which side goes first alternates, so a drifting machine favours neither.
        order = ("bench", "reference") if index % 2 == 0 else ("reference", "bench")
        pair: dict[str, dict[int, float]] = {}
        for side in order:
            measured = (run_bench if side == "bench" else run_reference)(library, sizes, args,
                                                                         workdir / f"pair{index}-{side}")
            if isinstance(measured, str):
                console.print(f"[red]{library.name}: {side} failed[/]: {escape(measured)}")
                return None
            pair[side] = measured
        if index >= args.warmup_pairs:
            pairs.append((pair["bench"], pair["reference"]))
    return pairs


def save(results: list[dict], sizes: list[int], args: argparse.Namespace) -> None:
    if args.out:
        write_json(args.out, {
            "target": args.target, "world_size": args.world_size, "sizes": sizes, "iters": args.iters,
            "warmup_iters": args.warmup_iters, "pairs": args.pairs, "warmup_pairs": args.warmup_pairs,
            "load_average": os.getloadavg(), "cores": usable_cores().count, "results": results})


def _launch(library: Library, lab: str, program: Path, lab_args: list[str], world_size: int,
            folder: Path) -> dict | str:
    """One run through the runner, as `distlab run` starts labs; the record's metrics, or why it failed."""
    request = RunRequest(lab=lab, program=program, world_size=world_size, launcher=library.launcher,
                         backend=library.name, lab_args=lab_args, threads=1, timeout_s=1800.0, results_root=folder)
    result = run_lab(request, echo=False)
    if not result.ok or result.record is None:
        return f"{result.reason} (see {result.run_dir})"
    return result.record["metrics"]


def run_bench(library: Library, sizes: list[int], args: argparse.Namespace, folder: Path) -> dict[int, float] | str:
    lab_args = ["-b", str(sizes[0]), "-e", str(sizes[-1]), "-f", "2", "-d", "float32",
                "-w", str(args.warmup_iters), "-n", str(args.iters), "--mode", library.mode]
    metrics = _launch(library, "allreduce_bench", LABS["allreduce_bench"].path, lab_args, args.world_size, folder)
    if isinstance(metrics, str):
        return metrics
    return {row["size"]: row[library.mode]["busbw_gbps"] for row in metrics["rows"]}


def run_reference(library: Library, sizes: list[int], args: argparse.Namespace,
                  folder: Path) -> dict[int, float] | str:
    if library.name == "nccl":
        return run_nccl_tests(sizes, args, folder)
    lab_args = ["--sizes", ",".join(map(str, sizes)), "--warmup", str(args.warmup_iters), "--iters", str(args.iters)]
    metrics = _launch(library, "plain_allreduce", PLAIN_ALLREDUCE, lab_args, args.world_size, folder)
    if isinstance(metrics, str):
        return metrics
    return {row["size"]: row["busbw_gbps"] for row in metrics["rows"]}


def run_nccl_tests(sizes: list[int], args: argparse.Namespace, folder: Path) -> dict[int, float] | str:
    """nccl-tests in one process driving world_size GPUs; its in-place busbw is column 12 of a data row."""
    folder.mkdir(parents=True, exist_ok=True)
    command = ["all_reduce_perf", "-b", str(sizes[0]), "-e", str(sizes[-1]), "-f", "2", "-g", str(args.world_size),
               "-w", str(args.warmup_iters), "-n", str(args.iters), "-d", "float", "-o", "sum"]
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1800)
    (folder / "launcher.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        return f"exit {done.returncode}: " + " | ".join(done.stdout.strip().splitlines()[-5:])
    return parse_nccl_tests(done.stdout)


def parse_nccl_tests(stdout: str) -> dict[int, float]:
    """size -> in-place busbw from nccl-tests' table: size count type redop root, then time algbw busbw #wrong
    out of place, then the same in place (field 11 is the in-place busbw)."""
    busbw = {}
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) >= 13 and fields[0].isdigit():
            busbw[int(fields[0])] = float(fields[11])
    return busbw


def compare(library: Library, sizes: list[int], pairs: list[tuple[dict[int, float], dict[int, float]]],
            target: float) -> dict:
    """Per size, the paired ratios (allreduce_bench's busbw / the reference's, one per pair), their
    median (the verdict: median >= target), quartiles, min and max, and each side's median busbw."""
    rows = []
    for size in sizes:
        both = [(ours[size], theirs[size]) for ours, theirs in pairs if size in ours and size in theirs]
        if not both:
            continue
        ratios = [ours / theirs for ours, theirs in both]
        median = statistics.median(ratios)
        low, high = statistics.quantiles(ratios, n=4, method="inclusive")[::2] if len(ratios) > 1 else (median,) * 2
        rows.append({"size": size, "ratio": median, "passed": median >= target,
                     "ratio_q1": low, "ratio_q3": high, "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "ratios": ratios, "pairs": len(ratios),
                     "bench_busbw_gbps": statistics.median(o for o, _ in both),
                     "reference_busbw_gbps": statistics.median(t for _, t in both),
                     "bench_runs": [o for o, _ in both], "reference_runs": [t for _, t in both]})
    return {"library": library.name, "launcher": library.launcher, "mode": library.mode,
            "reference": library.reference, "rows": rows}


def print_results(results: list[dict], args: argparse.Namespace) -> None:
    table = Table(title=f"allreduce_bench busbw / reference busbw, median of {args.pairs} interleaved pairs "
                        f"(after {args.warmup_pairs} warm-up), world size {args.world_size}, float32 sum, "
                        f"target median >= {args.target}")
    for column in ("library", "size (B)", "bench GB/s", "reference GB/s", "median ratio", "quartiles", "min-max", ""):
        table.add_column(column, justify="left" if column in ("library", "") else "right")
    for result in results:
        for row in result.get("rows", []):
            table.add_row(result["library"], str(row["size"]), f"{row['bench_busbw_gbps']:.3f}",
                          f"{row['reference_busbw_gbps']:.3f}", f"{row['ratio']:.3f}",
                          f"{row['ratio_q1']:.2f}-{row['ratio_q3']:.2f}",
                          f"{row['ratio_min']:.2f}-{row['ratio_max']:.2f}",
                          "[green]ok[/]" if row["passed"] else "[red]below target[/]")
    console.print(table)
    for result in results:
        if "rows" in result:
            console.print(f"{result['library']}: allreduce_bench {result['mode']} under {result['launcher']} "
                          f"vs {result['reference']}")
    console.print(f"load average {os.getloadavg()[0]:.2f} on {usable_cores().count} cores: the wider the quartiles, "
                  "the less the machine let the two sides be compared")

