"""Benchmark of the benchmark: allreduce_bench's busbw against the tightest plain loop in the same library.

allreduce_bench goes through a table, binders, checks and a record; none of that may cost bandwidth.
For each library both programs run through the real launchers, alternately, --repeats times, on the
same sizes (1 MiB and up by default), and per size the best busbw of each is compared:
ratio = allreduce_bench / reference, target >= 0.95 (the ratio of medians is shown too).

  mpi   mpirun   allreduce_bench --backend mpi, out-of-place  vs  mpi4py Allreduce loop (plain_allreduce.py)
  gloo  torchrun allreduce_bench --backend gloo, in-place     vs  dist.all_reduce loop (plain_allreduce.py)
  nccl  torchrun allreduce_bench --backend nccl, in-place     vs  nccl-tests all_reduce_perf, in-place
        (needs GPUs and all_reduce_perf on PATH; skipped with the reason otherwise)

    distlab bench allreduce -- --world-size 2 --repeats 3 --out bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.catalog import LABS
from harness.launchers import find_tool
from harness.runner import RunRequest, run_lab
from labs.common.host import gpu_count
from labs.common.sizes import parse_size

PLAIN_LOOP = Path(__file__).with_name("plain_allreduce.py")
TARGET = 0.95
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="distlab bench allreduce", description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--libraries", default="mpi,gloo,nccl", help="comma-separated: " + ", ".join(LIBRARIES))
    parser.add_argument("-b", "--min-bytes", type=parse_size, default=1 << 20, help="default 1M")
    parser.add_argument("-e", "--max-bytes", type=parse_size, default=16 << 20, help="default 16M")
    parser.add_argument("-w", "--warmup-iters", type=int, default=5)
    parser.add_argument("-n", "--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each side; the best are compared")
    parser.add_argument("--target", type=float, default=TARGET)
    parser.add_argument("--out", type=Path, help="write every measurement here as JSON")
    parser.add_argument("--keep", type=Path, help="keep the runs' records and logs in this folder")
    args = parser.parse_args(argv)
    libraries = [name.strip() for name in args.libraries.split(",")]
    for name in libraries:
        if name not in LIBRARIES:
            parser.error(f"--libraries: unknown {name!r}; choose from {', '.join(LIBRARIES)}")
    if args.min_bytes < 4 or args.min_bytes > args.max_bytes or args.min_bytes % 4 or args.max_bytes % 4:
        parser.error("sizes must be multiples of 4 bytes (float32) with -b <= -e")
    if args.world_size < 2 or args.iters < 1 or args.repeats < 1:
        parser.error("--world-size must be at least 2, --iters and --repeats at least 1")
    sizes = [args.min_bytes]
    while sizes[-1] * 2 <= args.max_bytes:
        sizes.append(sizes[-1] * 2)

    workdir = args.keep or Path(tempfile.mkdtemp(prefix="distlab-bench-"))
    results, failed = [], False
    try:
        for name in libraries:
            library = LIBRARIES[name]
            reason = library.needs(args.world_size)
            if reason:
                console.print(f"[yellow]{name}: skipped[/]: {escape(reason)}")
                results.append({"library": name, "skipped": reason})
                continue
            bench, reference = [], []
            for repeat in range(args.repeats):
                # Alternate which side goes first, so a drifting machine favours neither.
                order = [("bench", bench), ("reference", reference)]
                for side, into in order if repeat % 2 == 0 else order[::-1]:
                    folder = workdir / name / f"{side}-{repeat}"
                    measured = (run_bench if side == "bench" else run_reference)(library, sizes, args, folder)
                    if isinstance(measured, str):
                        console.print(f"[red]{name}: {side} failed[/]: {escape(measured)}")
                        failed = True
                        break
                    into.append(measured)
                if failed:
                    break
            if failed:
                break
            results.append(compare(library, sizes, bench, reference, args.target))
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)

    print_results(results, args)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "target": args.target, "world_size": args.world_size, "sizes": sizes, "iters": args.iters,
            "warmup_iters": args.warmup_iters, "repeats": args.repeats, "load_average": os.getloadavg(),
            "cores": os.cpu_count(), "results": results}, indent=2) + "\n")
    if failed:
        return 2
    measured = [row for r in results for row in r.get("rows", [])]
    return 0 if measured and all(row["ratio"] >= args.target for row in measured) else 1


def _launch(library: Library, lab: str, program: Path, lab_args: list[str], world_size: int,
            folder: Path) -> dict | str:
    """One run through the runner, as `distlab run` starts labs; the record's metrics, or why it failed."""
    request = RunRequest(lab=lab, program=program, world_size=world_size, launcher=library.launcher,
                         backend=library.name, lab_args=lab_args, threads=1, timeout_s=1800.0, results_root=folder)
    result = run_lab(request, echo=False)
    if not result.ok:
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
    metrics = _launch(library, "plain_allreduce", PLAIN_LOOP, lab_args, args.world_size, folder)
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


def compare(library: Library, sizes: list[int], bench: list[dict[int, float]], reference: list[dict[int, float]],
            target: float) -> dict:
    """Per size, the best and the median busbw of each side's runs, and their ratios.

    The target is judged on the best runs: other work on the machine can only slow a run down, so the
    fastest of several is the closest to what the program itself costs (the reason timeit reports a
    minimum). The median ratio is kept to show how much the machine moved between runs.
    """
    rows = []
    for size in sizes:
        ours = [run[size] for run in bench if size in run]
        theirs = [run[size] for run in reference if size in run]
        if not ours or not theirs:
            continue
        ratio = max(ours) / max(theirs)
        rows.append({"size": size, "bench_busbw_gbps": max(ours), "reference_busbw_gbps": max(theirs),
                     "ratio": ratio, "passed": ratio >= target,
                     "median_ratio": statistics.median(ours) / statistics.median(theirs),
                     "bench_runs": ours, "reference_runs": theirs})
    return {"library": library.name, "launcher": library.launcher, "mode": library.mode,
            "reference": library.reference, "rows": rows}


def print_results(results: list[dict], args: argparse.Namespace) -> None:
    table = Table(title=f"allreduce_bench busbw / reference busbw (GB/s), best of {args.repeats} alternating runs, "
                        f"world size {args.world_size}, float32 sum, target >= {args.target}")
    for column in ("library", "size (B)", "bench", "reference", "ratio", "median ratio", ""):
        table.add_column(column, justify="left" if column in ("library", "") else "right")
    for result in results:
        for row in result.get("rows", []):
            table.add_row(result["library"], str(row["size"]), f"{row['bench_busbw_gbps']:.3f}",
                          f"{row['reference_busbw_gbps']:.3f}", f"{row['ratio']:.3f}", f"{row['median_ratio']:.3f}",
                          "[green]ok[/]" if row["passed"] else "[red]below target[/]")
    console.print(table)
    for result in results:
        if "rows" in result:
            console.print(f"{result['library']}: allreduce_bench {result['mode']} under {result['launcher']} "
                          f"vs {result['reference']}")
    console.print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores: a busy machine blurs both sides")


if __name__ == "__main__":
    sys.exit(main())
