"""All-reduce bandwidth benchmark, in the spirit of nccl-tests, on gloo, nccl, MPI or Horovod.

For each message size it times the collective (warm-up first, a barrier before the clock starts,
a device synchronise before it stops), averages over iterations, and reduces the per-rank times to
avg/min/max over ranks. It prints nccl-tests' table: algbw = size / time, busbw = algbw x the
collective's bus factor (derived in labs/PERFORMANCE.md), and #wrong, the number of elements that
differ from the exact expected result after a separate, untimed call. Any wrong element fails the run.

    torchrun --standalone --nproc-per-node 2 labs/allreduce_bench/allreduce_bench.py -b 1K -e 64M -f 2
    mpirun -np 4 python labs/allreduce_bench/allreduce_bench.py --backend mpi -d half -o max
    horovodrun --gloo -np 2 -H localhost:2 python labs/allreduce_bench/allreduce_bench.py --backend horovod
    ... --collective all_gather,reduce_scatter,broadcast,reduce,all_to_all
    ... --format nccl-tests     # nccl-tests' exact columns, for scripts that parse all_reduce_perf (nccl_tests.py)

Rank 0 also writes busbw.png (busbw against size) next to the --record file. The collectives come
from the same table as labs/collectives (primitives.py), so what is timed is what that lab checks.
"""

import argparse
import time
from pathlib import Path

import torch

from labs.allreduce_bench import nccl_tests
from labs.collectives.primitives import (
    DTYPES,
    MODES,
    OPS,
    PRIMITIVES,
    ROOT,
    Primitive,
    dtype_name,
    lookup,
    prepare,
    round_count,
    unsupported,
)
from labs.common.comm import ALL_BACKENDS, Comm, connect
from labs.common.contract import add_contract_args, lab_run
from labs.common.sizes import parse_size
from labs.common.topology import detect_topology, say

MIN_BYTES, MAX_BYTES, STEP_FACTOR = "8", "64M", 2  # nccl-tests' usual sweep, cut at 64M so CPUs finish in seconds
WARMUP_ITERS, ITERS = 5, 20  # warm-up pays for connection set-up and first-touch page faults
SMOKE = {"min_bytes": 1024, "max_bytes": 64 * 1024, "step_factor": 4, "warmup_iters": 1, "iters": 2}
PLOT_NAME = "busbw.png"


def sizes_between(min_bytes: int, max_bytes: int, step_factor: int) -> list[int]:
    sizes = [min_bytes]
    while sizes[-1] * step_factor <= max_bytes and step_factor > 1:
        sizes.append(sizes[-1] * step_factor)
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_contract_args(parser, list(ALL_BACKENDS), default_backend="gloo")
    timed = [p.name for p in PRIMITIVES if p.bus_factor is not None]
    parser.add_argument("-b", "--min-bytes", type=parse_size, help=f"smallest message (default {MIN_BYTES})")
    parser.add_argument("-e", "--max-bytes", type=parse_size, help=f"largest message (default {MAX_BYTES})")
    parser.add_argument("-f", "--step-factor", type=int, help=f"size multiplier per step (default {STEP_FACTOR})")
    parser.add_argument("-w", "--warmup-iters", type=int, help=f"untimed calls per size (default {WARMUP_ITERS})")
    parser.add_argument("-n", "--iters", type=int, help=f"timed calls per size (default {ITERS})")
    parser.add_argument("-c", "--check", type=int, choices=(0, 1), default=1, help="check every element (default 1)")
    parser.add_argument("-d", "--dtype", default="float32", help=f"{', '.join(DTYPES)} (or float, half, bf16, double)")
    parser.add_argument("-o", "--op", choices=OPS, default="sum", help="reduction op of reducing collectives")
    parser.add_argument("--collective", default="all_reduce", help=f"comma-separated: {', '.join(timed)}")
    parser.add_argument("--mode", choices=("both", *MODES), default="both",
                        help="out-of-place, in-place, or both like nccl-tests (default)")
    parser.add_argument("--format", choices=("distlab", "nccl-tests"), default="distlab",
                        help="distlab: with min/max over ranks (default); nccl-tests: exactly nccl-tests' columns")
    parser.add_argument("--corrupt", action="store_true",
                        help="testing: rank 0 overwrites one element of each checked result: the run must fail")
    args = parser.parse_args()
    collectives = validate(parser, args, timed)
    topology = detect_topology()

    with lab_run("allreduce_bench", args, topology) as record:
        modes = MODES if args.mode == "both" else (args.mode,)
        sizes = sizes_between(args.min_bytes, args.max_bytes, args.step_factor)
        unavailable = {p.name: {m: unsupported(p, args.backend, m, args.dtype, op_of(p, args), topology.world_size)
                                for m in modes} for p in collectives}
        if all(reason for per_mode in unavailable.values() for reason in per_mode.values()):
            first = next(iter(next(iter(unavailable.values())).values()))
            raise SystemExit(f"error: nothing to measure on {args.backend}: {first}; pick another --collective, "
                             f"--op, --dtype or --mode")
        comm = connect(args.backend, topology, args.timeout)
        sync = torch.cuda.synchronize if comm.device.type == "cuda" else lambda: None

        rows, skipped = [], []
        nccl_layout = args.format == "nccl-tests"
        for primitive in collectives:
            if nccl_layout:
                say(topology, nccl_tests.header(primitive, args.backend, comm.size, args.dtype, args.warmup_iters,
                                                args.iters, bool(args.check), unavailable[primitive.name]))
            else:
                say(topology, header(primitive, args, comm.size, unavailable[primitive.name]))
            for size in sizes:
                count = round_count(primitive, size // DTYPES[args.dtype].itemsize, comm.size)
                if count == 0:
                    skipped.append({"collective": primitive.name, "size": size,
                                    "reason": f"fewer elements than the {comm.size} ranks it is split across"})
                    continue
                row = {"collective": primitive.name, "size": count * DTYPES[args.dtype].itemsize, "count": count,
                       "type": args.dtype, "redop": op_of(primitive, args) or "none",
                       "root": ROOT if primitive.rooted else -1}
                for mode in modes:
                    reason = unavailable[primitive.name][mode]
                    row[mode] = {"na": reason} if reason else measure(primitive, mode, count, row["size"], args,
                                                                       comm, sync)
                rows.append(row)
                say(topology, nccl_tests.line(primitive, row, comm.size) if nccl_layout else table_line(row, modes))
            if nccl_layout:  # one footer per collective, as one nccl-tests binary per collective prints
                say(topology, nccl_tests.footer([r for r in rows if r["collective"] == primitive.name],
                                                bool(args.check)))

        wrong = sum(r[m].get("wrong") or 0 for r in rows for m in modes)
        busbws = [r[m]["busbw_gbps"] for r in rows for m in modes if "busbw_gbps" in r[m]]
        avg_busbw = sum(busbws) / len(busbws) if busbws else None
        verdict = f"{wrong} {'OK' if wrong == 0 else 'FAILED'}" if args.check else "N/A (-c 0)"
        if not nccl_layout:
            say(topology, f"# Out of bounds values : {verdict}")
            say(topology, f"# Avg bus bandwidth    : {avg_busbw:.4g} GB/s" if busbws
                else "# Avg bus bandwidth    : n/a")
        for skip in skipped:
            say(topology, f"# skipped {skip['collective']} at {skip['size']} B: {skip['reason']}")
        record.metrics.update(
            world_size=comm.size, dtype=args.dtype, op=args.op, modes=list(modes),
            collectives=[p.name for p in collectives],
            bus_factors={p.name: p.bus_factor(comm.size) for p in collectives},
            not_available={name: {m: r for m, r in per_mode.items() if r} for name, per_mode in unavailable.items()},
            rows=rows, skipped=skipped, avg_busbw_gbps=avg_busbw,
            plot=plot(rows, modes, args, comm.size) if topology.is_rank0 else None,
        )
        if args.check:
            record.check("no_wrong_elements", wrong == 0, wrong_elements=wrong)
        comm.close()


def validate(parser: argparse.ArgumentParser, args: argparse.Namespace, timed: list[str]) -> list[Primitive]:
    """Bad input is a one-line error before any process group is joined. Returns the collectives to time."""
    if args.smoke:
        for name, value in SMOKE.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
    args.min_bytes = parse_size(MIN_BYTES) if args.min_bytes is None else args.min_bytes
    args.max_bytes = parse_size(MAX_BYTES) if args.max_bytes is None else args.max_bytes
    args.step_factor = STEP_FACTOR if args.step_factor is None else args.step_factor
    args.warmup_iters = WARMUP_ITERS if args.warmup_iters is None else args.warmup_iters
    args.iters = ITERS if args.iters is None else args.iters
    try:
        args.dtype = dtype_name(args.dtype)
    except KeyError:
        parser.error(f"-d/--dtype: unknown {args.dtype!r}; choose from {', '.join(DTYPES)}")
    try:
        collectives = [lookup(name.strip()) for name in args.collective.split(",")]
    except KeyError as unknown:
        parser.error(f"--collective: unknown {unknown}; choose from {', '.join(timed)}")
    if any(p.bus_factor is None for p in collectives):
        parser.error(f"--collective: a barrier moves no data, so it has no bandwidth; choose from {', '.join(timed)}")
    element = DTYPES[args.dtype].itemsize
    if args.min_bytes < 1 or args.min_bytes > args.max_bytes:
        parser.error(f"empty size range: -b {args.min_bytes} is larger than -e {args.max_bytes} (or zero)")
    for flag, value in (("-b", args.min_bytes), ("-e", args.max_bytes)):
        if value % element:
            parser.error(f"{flag} {value} is not a multiple of the {element}-byte {args.dtype} element")
    if args.step_factor < 2 and args.min_bytes < args.max_bytes:
        parser.error(f"-f {args.step_factor}: the step factor must be at least 2")
    if args.iters < 1:
        parser.error(f"-n {args.iters}: at least one timed iteration is needed")
    if args.warmup_iters < 0:
        parser.error(f"-w {args.warmup_iters}: warm-up iterations cannot be negative")
    return collectives


def op_of(primitive: Primitive, args: argparse.Namespace) -> str | None:
    return args.op if primitive.reduces else None


def measure(primitive: Primitive, mode: str, count: int, size: int, args: argparse.Namespace, comm: Comm,
            sync) -> dict:
    """Time one collective at one size on every rank, then check one fresh call; rank 0 reduces over ranks."""
    trial = prepare(primitive, args.backend, mode, args.dtype, op_of(primitive, args), count, comm.rank, comm.size,
                    comm.device)
    for _ in range(args.warmup_iters):
        trial.run()
    sync()
    comm.barrier()  # everyone starts the clock together; a late rank would show as a slow collective
    start = time.perf_counter()
    for _ in range(args.iters):
        trial.run()
    sync()  # GPU collectives return before they finish
    seconds = (time.perf_counter() - start) / args.iters

    wrong = None
    if args.check:
        trial.reset()  # timed in-place calls overwrote the inputs
        result = trial.run()
        sync()
        if args.corrupt and comm.rank == 0:
            result.reshape(-1)[0] = -1  # no expected value is negative
        wrong = trial.wrong(result)[0]
    per_rank = comm.all_gather_object((seconds, wrong))
    times = [s for s, _ in per_rank]
    avg = sum(times) / len(times)  # nccl-tests' default (-a 1): the average over ranks
    algbw = size / avg / 1e9
    return {"time_us": avg * 1e6, "time_us_min": min(times) * 1e6, "time_us_max": max(times) * 1e6,
            "algbw_gbps": algbw, "busbw_gbps": algbw * primitive.bus_factor(comm.size),
            "wrong": sum(w for _, w in per_rank) if args.check else None}


COLUMNS = "{:>12} {:>12} {:>8} {:>6} {:>5}"
MODE_COLUMNS = "  {:>9} {:>9} {:>9} {:>7} {:>7} {:>6}"


def header(primitive: Primitive, args: argparse.Namespace, size: int, unavailable: dict[str, str | None]) -> str:
    modes = list(unavailable)
    lines = [f"# {primitive.name}: backend {args.backend}, world size {size}, {args.dtype}, op "
             f"{op_of(primitive, args) or 'none'}, warm-up {args.warmup_iters}, iters {args.iters}, "
             f"check {'on' if args.check else 'off'}; busbw = algbw x {primitive.bus_factor(size):.4g} "
             f"(labs/PERFORMANCE.md); time: avg, min, max over ranks"]
    lines += [f"# {mode}: n/a: {reason}" for mode, reason in unavailable.items() if reason]
    width = len(MODE_COLUMNS.format(*[""] * 6))
    lines.append("#" + " " * (len(COLUMNS.format(*[""] * 5)) - 1) + "".join(f"{m:^{width}}" for m in modes))
    lines.append("#" + COLUMNS.format("size", "count", "type", "redop", "root")[1:]
                 + "".join(MODE_COLUMNS.format("time", "min", "max", "algbw", "busbw", "#wrong") for _ in modes))
    lines.append("#" + COLUMNS.format("(B)", "(elements)", "", "", "")[1:]
                 + "".join(MODE_COLUMNS.format("(us)", "(us)", "(us)", "(GB/s)", "(GB/s)", "") for _ in modes))
    return "\n".join(lines)


def table_line(row: dict, modes: tuple[str, ...]) -> str:
    line = COLUMNS.format(row["size"], row["count"], row["type"], row["redop"], row["root"])
    for mode in modes:
        m = row[mode]
        if "na" in m:
            line += MODE_COLUMNS.format("n/a", "", "", "", "", "")
        else:
            line += MODE_COLUMNS.format(f"{m['time_us']:.1f}", f"{m['time_us_min']:.1f}", f"{m['time_us_max']:.1f}",
                                        f"{m['algbw_gbps']:.2f}", f"{m['busbw_gbps']:.2f}",
                                        "N/A" if m["wrong"] is None else m["wrong"])
    return line


def plot(rows: list[dict], modes: tuple[str, ...], args: argparse.Namespace, world_size: int) -> str | None:
    """busbw against size, one line per collective and mode, written next to the record."""
    if args.record is None:
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display on cluster nodes and in CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, name in enumerate(dict.fromkeys(r["collective"] for r in rows)):
        colour = f"C{i}"  # one colour per collective, one line style per mode
        for mode, style in zip(modes, ("-", "--"), strict=False):
            points = [(r["size"], r[mode]["busbw_gbps"]) for r in rows
                      if r["collective"] == name and "busbw_gbps" in r[mode]]
            if points:
                sizes, busbw = zip(*points, strict=True)
                ax.plot(sizes, busbw, marker="o", color=colour, linestyle=style, label=f"{name} {mode}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(f"{args.backend}, world size {world_size}, {args.dtype}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path = Path(args.record).parent / PLOT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return PLOT_NAME


if __name__ == "__main__":
    main()
