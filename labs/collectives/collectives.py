"""Collective primitives: what each one does, run on your backend and checked element by element.

Every rank fills a small tensor with values it can recognise (rank r holds 100 (r + 1) + i at
position i), calls one primitive, and compares every element it gets back with the exact expected
value. With a few ranks and small tensors, rank 0 prints what every rank held before and after,
so you see what broadcast, reduce, all-reduce, all-gather, reduce-scatter, barrier, all-to-all
and send/recv do. What a backend cannot do is listed as n/a with the reason.

    torchrun --standalone --nproc-per-node 4 labs/collectives/collectives.py --backend gloo
    mpirun -np 4 python labs/collectives/collectives.py --backend mpi
    horovodrun --gloo -np 2 -H localhost:2 python labs/collectives/collectives.py --backend horovod
    ... --dtype all --op all          every dtype and reduction op: dozens of combinations in seconds

It takes seconds whatever the flags, so --smoke changes nothing.

The table of primitives (calls, expected values, bus-bandwidth factors) is primitives.py next to
this file; labs/allreduce_bench times the same calls.
"""

import argparse

from rich.console import Console
from rich.table import Table

from labs.collectives.primitives import (
    DTYPES,
    OPS,
    PRIMITIVES,
    Primitive,
    dtype_name,
    lookup,
    prepare,
    round_count,
    unsupported,
)
from labs.common.comm import ALL_BACKENDS, Comm, connect
from labs.common.contract import add_contract_args, lab_run
from labs.common.topology import Topology, detect_topology, say

SHOW_MAX_WORLD = 4  # teaching mode is on by default up to this many ranks...
SHOW_MAX_COUNT = 16  # ...and tensors of up to this many elements: beyond that the printout stops being readable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_contract_args(parser, list(ALL_BACKENDS), default_backend="gloo")
    parser.add_argument("--primitives", default="all", help="comma-separated primitives, or all")
    parser.add_argument("--count", type=int, help="elements in the larger buffer (default: 2 x world size, at least 4)")
    parser.add_argument("--dtype", default="float32", help=f"comma-separated, or all: {', '.join(DTYPES)}")
    parser.add_argument("--op", default="sum", help=f"reduction ops, comma-separated, or all: {', '.join(OPS)}")
    parser.add_argument("--show", action=argparse.BooleanOptionalAction,
                        help=f"print every rank's tensor before and after (default: on up to {SHOW_MAX_WORLD} ranks "
                             f"and {SHOW_MAX_COUNT} elements)")
    parser.add_argument("--corrupt", metavar="PRIMITIVE",
                        help="testing: rank 0 overwrites one element of this primitive's result: the check must fail")
    args = parser.parse_args()
    names = [p.name for p in PRIMITIVES]
    primitives = pick(parser, "--primitives", args.primitives, names, lookup)
    dtypes = pick(parser, "--dtype", args.dtype, list(DTYPES), dtype_name)
    ops = pick(parser, "--op", args.op, list(OPS))
    corrupt = pick(parser, "--corrupt", args.corrupt, names, lookup)[0].name if args.corrupt else None
    if args.count is not None and args.count < 1:
        parser.error("--count must be at least 1")
    topology = detect_topology()

    with lab_run("collectives", args, topology) as record:
        comm = connect(args.backend, topology, args.timeout)
        count = args.count or max(4, 2 * comm.size)
        show = args.show if args.show is not None else comm.size <= SHOW_MAX_WORLD and count <= SHOW_MAX_COUNT
        say(topology, f"collectives: backend={args.backend} launcher={topology.launcher} world_size={comm.size} "
                      f"count={count} device={comm.device}")

        # One loop over every combination; what a primitive does lives in its table row.
        combinations = [(p, dtype, op, mode) for p in primitives for dtype in (dtypes if p.layout != "none" else [None])
                        for op in (ops if p.reduces else [None]) for mode in p.modes]
        rows, shown = [], set()
        for primitive, dtype, op, mode in combinations:
            row = {"primitive": primitive.name, "mode": mode, "dtype": dtype, "op": op}
            reason = unsupported(primitive, args.backend, mode, dtype, op, comm.size)
            if reason:
                rows.append({**row, "status": "n/a", "reason": reason})
                continue
            trial = prepare(primitive, args.backend, mode, dtype, op, round_count(primitive, count, comm.size),
                            comm.rank, comm.size, comm.device)
            before = trial.send.tolist() if show and primitive.name not in shown else None
            result = trial.run()
            if primitive.name == corrupt and comm.rank == 0:
                result.reshape(-1)[0] = -1  # no expected value is negative
            wrong, checked = trial.wrong(result)
            rows.append({**row, "status": "ran", "wrong": wrong, "elements": checked})
            if before is not None:
                shown.add(primitive.name)
                teach(topology, comm, primitive, ", ".join(x for x in (dtype, op, mode) if x and x != "-"), before,
                      result.tolist() if checked else None)

        # Each rank checked its own result; every rank adds them all up, so all agree on the verdict and exit code.
        per_rank = comm.all_gather_object([(r.get("wrong", 0), r.get("elements", 0)) for r in rows])
        for i, row in enumerate(rows):
            if row["status"] == "ran":
                row["wrong"] = sum(mine[i][0] for mine in per_rank)
                row["elements"] = sum(mine[i][1] for mine in per_rank)
                row["status"] = "ok" if row["wrong"] == 0 else "wrong"
        record.ranks = [{"rank": rank, "wrong_elements": sum(w for w, _ in mine),
                         "checked_elements": sum(e for _, e in mine)} for rank, mine in enumerate(per_rank)]
        record.metrics.update(world_size=comm.size, count=count, results=rows,
                              primitives=summarise(rows, primitives, record),
                              wrong_elements=sum(r.get("wrong", 0) for r in rows),
                              not_available=sum(r["status"] == "n/a" for r in rows))
        if topology.is_rank0:
            print_table(rows)
        comm.close()


def pick(parser: argparse.ArgumentParser, flag: str, text: str, choices: list[str], resolve=None) -> list:
    """A comma-separated list (or `all`) of names, each checked: a typo is a one-line error, not a crash."""
    resolve = resolve or {name: name for name in choices}.__getitem__
    picked = []
    for name in (choices if text == "all" else text.split(",")):
        try:
            picked.append(resolve(name.strip()))
        except (KeyError, ValueError):
            parser.error(f"{flag}: unknown {name.strip()!r}; choose from {', '.join(choices)} or all")
    return picked


def teach(topology: Topology, comm: Comm, primitive: Primitive, what: str, before: list, after: list | None) -> None:
    """Gather every rank's tensor before and after to rank 0 and print them there, in rank order."""
    held = comm.all_gather_object((before, after))
    say(topology, f"\n{primitive.name}" + (f" ({what})" if what else "") + f": {primitive.after}")
    shown = [(fmt(b) if b else "(no data)", fmt(a) if a is not None else "(unspecified)") for b, a in held]
    width = max(len(b) for b, _ in shown)
    for rank, (b, a) in enumerate(shown):
        say(topology, f"  rank {rank}: {b:<{width}}  ->  {a}")


def fmt(values: list) -> str:
    return "[" + " ".join(f"{v:g}" for v in values) + "]"


def summarise(rows: list[dict], primitives: list[Primitive], record) -> dict:
    """Wrong elements per primitive; a primitive with anything run gets a check, which fails on any wrong element."""
    summary = {}
    for primitive in primitives:
        mine = [r for r in rows if r["primitive"] == primitive.name]
        ran = [r for r in mine if r["status"] != "n/a"]
        summary[primitive.name] = {
            "wrong_elements": sum(r["wrong"] for r in ran),
            "checked_elements": sum(r["elements"] for r in ran),
            "ran": len(ran),
            "not_available": len(mine) - len(ran),
        }
        if ran:
            record.check(primitive.name, summary[primitive.name]["wrong_elements"] == 0, **summary[primitive.name])
    return summary


def print_table(rows: list[dict]) -> None:
    table = Table(title="every element checked against its exact expected value")
    for column in ("primitive", "mode", "dtype", "op", "result"):
        table.add_column(column)
    for r in rows:
        result = {"ok": f"ok ({r.get('elements')} elements)", "n/a": f"n/a: {r.get('reason')}",
                  "wrong": f"WRONG: {r.get('wrong')} of {r.get('elements')} elements"}[r["status"]]
        table.add_row(r["primitive"], r["mode"], r["dtype"] or "-", r["op"] or "-", result)
    # Launchers hand ranks a pseudo-terminal or a pipe: plain text keeps the per-rank logs readable.
    Console(width=140, force_terminal=False).print(table)


if __name__ == "__main__":
    main()
