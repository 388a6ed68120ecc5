"""The tightest all-reduce loop each library allows: the yardstick allreduce_bench is measured against.

Nothing but buffers, warm-up, a barrier, and a timed loop of the bare library call; time and busbw
are computed the way nccl-tests (and allreduce_bench) do: per-rank time per call, averaged over
ranks, busbw = size / time x 2 (n - 1) / n. Rank 0 writes the rows as JSON to --out.

    mpirun -np 2 python harness/plain_allreduce.py --lib mpi --sizes 1048576,4194304 --out mpi.json
    torchrun --standalone --nproc-per-node 2 harness/plain_allreduce.py --lib torch --backend gloo --out gloo.json

mpi: Allreduce(sendbuf, recvbuf) out of place, float32 numpy buffers.
torch: dist.all_reduce(tensor), which only exists in place, on gloo (CPU) or nccl (GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", choices=("mpi", "torch"), required=True)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="torch only")
    parser.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes (multiples of 4)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    loop = mpi_loop if args.lib == "mpi" else torch_loop
    rank, world_size, rows = loop(args, sizes)
    if rank == 0:
        factor = 2 * (world_size - 1) / world_size
        out = [{"size": size, "time_us": seconds * 1e6, "busbw_gbps": size / seconds / 1e9 * factor}
               for size, seconds in rows]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"lib": args.lib, "backend": args.backend if args.lib == "torch" else "mpi",
                                        "world_size": world_size, "rows": out}, indent=2) + "\n")


def mpi_loop(args: argparse.Namespace, sizes: list[int]) -> tuple[int, int, list[tuple[int, float]]]:
    import numpy as np
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rows = []
    for size in sizes:
        send = np.ones(size // 4, dtype=np.float32)
        recv = np.empty_like(send)
        for _ in range(args.warmup):
            world.Allreduce(send, recv, op=MPI.SUM)
        world.Barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            world.Allreduce(send, recv, op=MPI.SUM)
        seconds = (time.perf_counter() - start) / args.iters
        rows.append((size, sum(world.allgather(seconds)) / world.Get_size()))
    return world.Get_rank(), world.Get_size(), rows


def torch_loop(args: argparse.Namespace, sizes: list[int]) -> tuple[int, int, list[tuple[int, float]]]:
    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, device_id=device if args.backend == "nccl" else None)
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
        rows.append((size, sum(gathered) / len(gathered)))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    return rank, world_size, rows


if __name__ == "__main__":
    main()
