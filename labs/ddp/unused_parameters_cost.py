"""What find_unused_parameters costs per step: the lesson's measurement (labs/TRAINING.md, "Unused parameters").

    torchrun --nproc-per-node 2 labs/ddp/unused_parameters_cost.py [--steps 30] [--rounds 3] [--stem cifar]

The labs' model (models.build_model; the smoke runs' standard stem by default) with a second
head that only even steps use, a branch some steps do not take; DDP over gloo, batch 32 per rank.
Each setting is timed in rounds, A B C A B C ..., so that the machine's load falls on all of them
alike; rank 0 prints the median ms per step of each:

    plain            DDP as the labs wrap it: the head unused on odd steps crashes it at the next step
    find_unused      find_unused_parameters=True: after each forward DDP walks the autograd graph to
                     mark what was not used, and all-reduces those gradients as zeros
    static_graph     static_graph=True: DDP learns the graph in the first step and reuses it; allowed
                     only when the set of used parameters is the same every step (so not here: the
                     model is run with the head every step for this one, its cost beside plain)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from labs.common import models


class TwoHeads(torch.nn.Module):
    def __init__(self, stem: str) -> None:
        super().__init__()
        self.body = models.build_model(stem)
        self.aux = torch.nn.Linear(10, 10)  # used on even steps only

    def forward(self, images: torch.Tensor, use_aux: bool) -> torch.Tensor:
        logits = self.body(images)
        return logits + self.aux(logits) if use_aux else logits


def timed(model: torch.nn.Module, steps: int, every_step_aux: bool) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    images, labels = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    times = []
    for step in range(steps):
        started = time.perf_counter()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images, every_step_aux or step % 2 == 0), labels)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - started)
    return statistics.median(times[3:]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stem", default="standard", help="the model's stem: standard (the smoke runs') or cifar")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    results: dict[str, list[float]] = {"plain (head every step)": [], "find_unused_parameters=True": [],
                                       "static_graph=True (head every step)": []}
    for _ in range(args.rounds):
        results["plain (head every step)"].append(timed(DDP(TwoHeads(args.stem)), args.steps, True))
        results["find_unused_parameters=True"].append(
            timed(DDP(TwoHeads(args.stem), find_unused_parameters=True), args.steps, False))
        results["static_graph=True (head every step)"].append(
            timed(DDP(TwoHeads(args.stem), static_graph=True), args.steps, True))
    try:  # the mistake itself: the head unused on step 1, and DDP stops at step 2
        timed(DDP(TwoHeads(args.stem)), 3, False)
        crash = "no error"
    except RuntimeError as error:
        crash = str(error).splitlines()[0]
    if dist.get_rank() == 0:
        base = statistics.median(results["plain (head every step)"])
        for name, values in results.items():
            print(f"{name:40} {statistics.median(values):7.2f} ms/step  x{statistics.median(values) / base:.3f}")
        print(f"plain DDP, head unused on odd steps: {crash}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
