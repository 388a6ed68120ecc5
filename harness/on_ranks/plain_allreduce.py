"""The tightest all-reduce loop each library allows: the yardstick allreduce_bench is measured against.

Nothing but buffers, warm-up, a barrier, and a timed loop of the bare library call; time and busbw
are computed the way nccl-tests (and allreduce_bench) do: per-rank time per call, averaged over
ranks, busbw = size / time x 2 (n - 1) / n. It keeps the lab contract (labs/README.md), so the
harness starts it like any lab (runner.run_lab); rank 0 writes the rows into its record's metrics.

    mpirun -np 2 python harness/on_ranks/plain_allreduce.py --backend mpi --sizes 1048576,4194304 --record mpi.json
    torchrun --standalone --nproc-per-node 2 harness/on_ranks/plain_allreduce.py --backend gloo --record gloo.json

mpi: Allreduce(sendbuf, recvbuf) out of place, on float32 buffers that torch allocated (as numpy views).
torch: dist.all_reduce(tensor), which only exists in place, on gloo (CPU) or nccl (GPU).

The buffers come from the allocator allreduce_bench's (and every training program's) tensors come
from. numpy's own arrays would not do for MPI: from 4 MiB up numpy asks Linux for transparent huge
pages (madvise), torch's CPU allocator does not (unless THP_MEM_ALLOC_ENABLE=1), and shared-memory
MPI copies faster through 2 MiB pages than through 4 KiB ones; the loop would then be measuring the
page size, not the cost of the benchmark's code (labs/PERFORMANCE.md, "Benchmark of the benchmark").
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import time

from labs.common.contract import add_contract_args, lab_run
from labs.common.sizes import parse_size
from labs.common.topology import detect_topology


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_contract_args(parser, ["mpi", "gloo", "nccl"], default_backend="gloo")
    parser.add_argument("--sizes", help="comma-separated message sizes in bytes (multiples of 4); else -b/-e/-f")
    # nccl-tests' and allreduce_bench's sweep flags, same defaults, so a grade can pass the lab's own.
    parser.add_argument("-b", "--min-bytes", type=parse_size, default=8)
    parser.add_argument("-e", "--max-bytes", type=parse_size, default=64 << 20)
    parser.add_argument("-f", "--step-factor", type=int, default=2)
    parser.add_argument("-w", "--warmup", "--warmup-iters", dest="warmup", type=int, default=5)
    parser.add_argument("-n", "--iters", type=int, default=20)
    args, _ = parser.parse_known_args()  # allreduce_bench's other flags (-d, -c, --mode) change nothing here
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else sweep(args)
    with lab_run("plain_allreduce", args, detect_topology()) as record:
        loop = mpi_loop if args.backend == "mpi" else torch_loop
        world_size, rows = loop(args, sizes)
        factor = 2 * (world_size - 1) / world_size
        record.metrics["rows"] = [{"size": size, "time_us": seconds * 1e6,
                                   "busbw_gbps": size / seconds / 1e9 * factor} for size, seconds in rows]
        # The same average allreduce_bench reports (its in-place rows on torch backends).
        record.metrics["avg_busbw_gbps"] = sum(r["busbw_gbps"] for r in record.metrics["rows"]) / len(rows)


def sweep(args: argparse.Namespace) -> list[int]:
    """-b, -b*f, ... up to -e, in whole float32 elements, as nccl-tests sweeps."""
    sizes, size = [], max(4, args.min_bytes // 4 * 4)
    while size <= args.max_bytes:
        sizes.append(size)
        if args.step_factor < 2:
            break
        size *= args.step_factor
    return sizes


def mpi_loop(args: argparse.Namespace, sizes: list[int]) -> tuple[int, list[tuple[int, float]]]:
    import torch
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rows = []
    for size in sizes:
        send = torch.ones(size // 4, dtype=torch.float32).numpy()  # not np.ones: see the module docstring
        recv = torch.empty(size // 4, dtype=torch.float32).numpy()
        for _ in range(args.warmup):
            world.Allreduce(send, recv, op=MPI.SUM)
        world.Barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            world.Allreduce(send, recv, op=MPI.SUM)
        seconds = (time.perf_counter() - start) / args.iters
        rows.append((size, sum(world.allgather(seconds)) / world.Get_size()))
    return world.Get_size(), rows


def torch_loop(args: argparse.Namespace, sizes: list[int]) -> tuple[int, list[tuple[int, float]]]:
    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, device_id=device if args.backend == "nccl" else None,
                            timeout=dt.timedelta(seconds=args.timeout))
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    rows = []
    for size in sizes:
        tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(tensor)
        sync()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(tensor)
        sync()
        seconds = (time.perf_counter() - start) / args.iters
        gathered: list[float | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, seconds)
        rows.append((size, sum(s for s in gathered if s is not None) / len(gathered)))  # every rank gave one
    world_size = dist.get_world_size()
    dist.destroy_process_group()
    return world_size, rows


if __name__ == "__main__":
    main()
