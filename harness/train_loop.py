"""The in-memory training loop: what this hardware can do with a lab's model, the yardstick of the
training labs' throughput (`distlab grade`'s ratio bands, `distlab bench train`).

Forward, backward and optimizer step on one batch that already sits on the device as float
tensors: no data loading, augmentation or conversion, no communication. It takes the training
labs' own flags (the same `--smoke`, `--stem`, `--batch-size`, `--precision` resolve the same
way), so the model, batch and precision are the lab's, and keeps the lab contract, so the harness
starts it like any lab (runner.run_lab) and reads img_per_sec from its record.

    python harness/train_loop.py --smoke --batch-size 16 --steps 20 --record loop.json
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from labs.common import training
from labs.common.contract import add_contract_args, lab_run
from labs.common.topology import detect_topology, say

TIMED_STEPS = 8  # as many as the smoke labs time, so the reference costs no more than the lab


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_contract_args(parser, ["none"], default_backend="none")
    training.add_training_args(parser)
    parser.add_argument("--steps", type=int, default=TIMED_STEPS, help="timed steps, after the untimed warm-up")
    args, _ = parser.parse_known_args(argv)  # a lab's other flags (faults, DDP options) mean nothing here
    training.resolve_training_args(parser, args)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    with lab_run("train_loop", args, detect_topology()) as record:
        record.metrics["img_per_sec"] = in_memory_loop(args)
        say(detect_topology(), f"train_loop: {record.metrics['img_per_sec']:.1f} img/s, batch {args.batch_size}, "
                               f"{args.stem} stem, {args.device}, {torch.get_num_threads()} threads")


def in_memory_loop(args: argparse.Namespace) -> float:
    """img/s of forward, backward and step on one resident batch, set up exactly as the labs set up theirs."""
    device = training.pick_device(args)
    model = training.build_model(args.stem).to(device)
    model = model.to(memory_format=torch.channels_last) if args.channels_last else model
    optimizer = training.make_optimizer(model, args.lr, args)
    precision = training.make_precision(args, device)
    images = torch.randn(args.batch_size, 3, 32, 32, device=device)
    images = images.contiguous(memory_format=torch.channels_last) if args.channels_last else images
    labels = torch.randint(0, training.CLASSES, (args.batch_size,), device=device)
    model.train()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    started = 0.0
    for step in range(training.TIMING_WARMUP_STEPS + args.steps):
        if step == training.TIMING_WARMUP_STEPS:  # the labs leave their first steps out of img_per_sec too
            sync()
            started = time.perf_counter()
        with precision.autocast():
            loss = F.cross_entropy(model(images), labels)
        precision.scaler.scale(loss).backward()
        precision.scaler.step(optimizer)
        precision.scaler.update()
        optimizer.zero_grad()
    sync()
    return args.steps * args.batch_size / (time.perf_counter() - started)


if __name__ == "__main__":
    main()
