"""The in-memory training loop: what this hardware can do with a lab's model, the yardstick of the
training labs' throughput (`distlab grade`'s ratio bands, `distlab bench train`).

Forward, backward and optimizer step on one batch that already sits on the device as float
tensors: no data loading, augmentation or conversion, no communication. For a cell of N ranks it
runs as N ranks side by side (torchrun, `--backend gloo`), because N ranks share the machine's
cores, memory bandwidth and whatever else runs there, and one process times N does not: under two
other busy processes, one loop process still got a whole core while the lab's four ranks shared
what was left. The ranks meet only to start their timed steps together and, after them, to add up
what they did: `img_per_sec` is all ranks' images over the slowest rank's time, the rate of a
synchronous job with no communication at all.

It takes the training labs' own flags (the same `--smoke`, `--stem`, `--batch-size`, `--precision`
resolve the same way), so the model, batch and precision are the lab's, and keeps the lab
contract, so the harness starts it like any lab (runner.run_lab) and reads img_per_sec from its
record.

    python harness/on_ranks/train_loop.py --smoke --batch-size 16 --steps 20 --record loop.json
    torchrun --nproc-per-node 2 harness/on_ranks/train_loop.py --backend gloo --smoke --record loop.json
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labs.common import data, flags, models, optim, timing
from labs.common.contract import add_contract_args, lab_run
from labs.common.process_group import init_torch_distributed
from labs.common.topology import detect_topology, say

TIMED_STEPS = 8  # as many as the smoke labs time, so the reference costs no more than the lab


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_contract_args(parser, ["none", "gloo"], default_backend="none")
    flags.add_training_args(parser)
    parser.add_argument("--steps", type=int, default=TIMED_STEPS, help="timed steps, after the untimed warm-up")
    args, _ = parser.parse_known_args(argv)  # a lab's other flags (faults, DDP options) mean nothing here
    flags.resolve_training_args(parser, args)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    topology = detect_topology()
    if topology.world_size > 1 and args.backend != "gloo":
        parser.error("several ranks meet over gloo (CPU tensors, outside the timed steps): add --backend gloo")
    with lab_run("train_loop", args, topology) as record:
        if topology.world_size > 1:
            init_torch_distributed("gloo", topology, args.timeout)
        device = models.pick_device(args, topology.local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        barrier: Callable[[], object] = dist.barrier if topology.world_size > 1 else (lambda: None)
        seconds = in_memory_loop(args, device, barrier)
        per_rank = [seconds]
        if topology.world_size > 1:
            per_rank = [0.0] * topology.world_size
            dist.all_gather_object(per_rank, seconds)
            dist.destroy_process_group()
        images = args.steps * args.batch_size
        record.metrics["img_per_sec"] = topology.world_size * images / max(per_rank)
        record.metrics["img_per_sec_per_rank"] = [images / s for s in per_rank]
        say(topology, f"train_loop: {record.metrics['img_per_sec']:.1f} img/s on {topology.world_size} rank(s), "
                      f"batch {args.batch_size}, {args.stem} stem, {args.device}, {torch.get_num_threads()} threads")


def in_memory_loop(args: argparse.Namespace, device: torch.device, together: Callable[[], object]) -> float:
    """Seconds of the timed steps (forward, backward and step on one resident batch, set up exactly as
    the labs set up theirs); together() is called just before they start, to line up the ranks."""
    model = models.build_model(args.stem).to(device)
    model = model.to(memory_format=torch.channels_last) if args.channels_last else model
    optimizer = optim.make_optimizer(model, args.lr, args)
    precision = models.make_precision(args, device)
    images = torch.randn(args.batch_size, 3, 32, 32, device=device)
    images = images.contiguous(memory_format=torch.channels_last) if args.channels_last else images
    labels = torch.randint(0, data.CLASSES, (args.batch_size,), device=device)
    model.train()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    started = 0.0
    for step in range(timing.TIMING_WARMUP_STEPS + args.steps):
        if step == timing.TIMING_WARMUP_STEPS:  # the labs leave their first steps out of img_per_sec too
            sync()
            together()
            started = time.perf_counter()
        with precision.autocast():
            loss = F.cross_entropy(model(images), labels)
        precision.scaler.scale(loss).backward()
        precision.scaler.step(optimizer)
        precision.scaler.update()
        optimizer.zero_grad()
    sync()
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
