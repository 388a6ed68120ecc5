"""Connectivity check: the first program to run on a new machine or cluster.

Every rank joins the backend, all-reduces a tensor whose sum is known exactly, checks it,
passes a barrier, and tells rank 0 who it is. Rank 0 prints one line per rank and writes
the result record.

    torchrun --standalone --nproc-per-node 2 labs/check/check.py --backend gloo
    horovodrun --gloo -np 2 -H localhost:2 python labs/check/check.py --backend horovod
    mpirun -np 2 python labs/check/check.py --backend mpi
    python labs/check/check.py                      # one process, world size 1
"""

import argparse
import os
import socket
import time

import torch

from labs.common import timing
from labs.common.comm import ALL_BACKENDS, connect
from labs.common.contract import add_contract_args, lab_run
from labs.common.topology import detect_topology, say

ELEMENTS = 1 << 20  # 4 MiB of float32: large enough to cross several network packets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_contract_args(parser, list(ALL_BACKENDS), default_backend="gloo")
    parser.add_argument("--elements", type=int, default=ELEMENTS, help="all-reduce length (float32 elements)")
    parser.add_argument("--device", choices=["auto", "cuda"], default="auto",
                        help="auto: the backend's (NCCL the rank's GPU, Gloo and MPI the CPU); cuda with gloo: CUDA "
                             "tensors over Gloo, ranks sharing the GPUs (two ranks on one GPU, which NCCL refuses)")
    parser.add_argument("--fail-rank", type=int, help="teaching/testing aid: this rank exits with code 3 after init")
    parser.add_argument("--hang-rank", type=int, help="teaching/testing aid: this rank stops answering after init")
    args = parser.parse_args()
    if args.elements < 1:
        parser.error("--elements must be at least 1")
    topology = detect_topology()

    with lab_run("check", args, topology) as record:
        started = time.perf_counter()
        comm = connect(args.backend, topology, args.timeout, args.device)
        record.metrics["init_seconds"] = time.perf_counter() - started
        if args.fail_rank == comm.rank:
            print(f"rank {comm.rank}: exiting with code 3 as asked by --fail-rank", flush=True)
            os._exit(3)  # no clean-up, like a crashed process: the launcher must notice
        if args.hang_rank == comm.rank:
            print(f"rank {comm.rank}: hanging as asked by --hang-rank", flush=True)
            while True:  # like a deadlock: alive, silent, never reaching the all-reduce
                time.sleep(1)

        # Rank r contributes r + 1 everywhere, so every element must sum to n(n+1)/2:
        # small integers are exact in float32, so the check is equality, not a tolerance.
        tensor = torch.full((args.elements,), float(comm.rank + 1), device=comm.device)
        started = timing.now(comm.device)
        summed = comm.all_reduce_sum(tensor)
        record.metrics["allreduce_seconds"] = timing.now(comm.device) - started  # NCCL's call returns when queued
        expected = comm.size * (comm.size + 1) / 2
        wrong = int((summed != expected).sum())
        record.check("allreduce_value", wrong == 0, expected=expected, wrong_elements=wrong)

        comm.barrier()
        me = {
            "host": socket.gethostname(),
            "rank": comm.rank,
            "local_rank": topology.local_rank,
            "pid": os.getpid(),
            "device": str(comm.device),
            "torch": torch.__version__,
            "allreduce_wrong": wrong,
        }
        record.ranks = sorted(comm.all_gather_object(me), key=lambda r: r["rank"])
        record.check("all_ranks_reported", len(record.ranks) == comm.size,
                     reported=len(record.ranks), world_size=comm.size)
        record.metrics["world_size"] = comm.size

        say(topology, f"check: backend={args.backend} launcher={topology.launcher} world_size={comm.size}")
        for r in record.ranks:
            status = "ok" if r["allreduce_wrong"] == 0 else f"WRONG ({r['allreduce_wrong']} elements)"
            say(topology, f"  rank {r['rank']} (local {r['local_rank']}) on {r['host']} pid {r['pid']} "
                          f"device {r['device']}: all-reduce {status}")
        comm.close()


if __name__ == "__main__":
    main()
