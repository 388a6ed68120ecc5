"""Baseline: ResNet-18 on CIFAR-10 on one device, CPU or one GPU.

The reference the distributed labs extend: labs/ddp/train.py and labs/horovod/train.py are this
file plus only what they need, so `diff labs/baseline/train.py labs/ddp/train.py` shows what DDP
adds. Flags, data, model, schedule, timing and checkpoints are shared (labs/common: flags.py, data.py,
models.py, optim.py, timing.py, checkpoints.py).

    python labs/baseline/train.py --smoke                       # seconds on a CPU, synthetic data
    python labs/baseline/train.py                               # CIFAR-10 staged in ./data
    python labs/baseline/train.py --dataset synthetic --train-size 4096 --test-size 1024 --stem standard
    distlab run baseline --world-size 1 -- --smoke
"""

import argparse
import time

import torch
import torch.nn.functional as F

from labs.common import checkpoints, data, flags, models, optim, timing
from labs.common.contract import add_contract_args, lab_run
from labs.common.topology import detect_topology, say


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_contract_args(parser, ["none"], default_backend="none")  # one device: nothing to communicate
    flags.add_training_args(parser)
    args = parser.parse_args(argv)
    flags.resolve_training_args(parser, args)
    return args


def train_one_epoch(model, loader, *, optimizer, schedule, precision, clock, args, device):
    """One pass over the training set; returns the mean training loss."""
    model.train()
    models.set_bn_eval(model, args.bn_eval)
    loss_sum = torch.zeros((), device=device)  # summed on the device: no GPU sync at every step
    for images, labels, _ in loader:
        images, labels = models.to_device(images, labels, device, args.channels_last)
        micro_batches = zip(images.chunk(args.accumulate), labels.chunk(args.accumulate), strict=True)
        for micro_images, micro_labels in micro_batches:
            with precision.autocast():
                loss = F.cross_entropy(model(micro_images), micro_labels) / args.accumulate
            precision.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        precision.scaler.step(optimizer)
        precision.scaler.update()
        optimizer.zero_grad()
        schedule.step()
        clock.step(len(labels))
    return loss_sum / len(loader)


def evaluate(model, loader, precision, args, device):
    correct, total = models.count_correct(model, loader, precision, args, device).tolist()
    return correct / total


def main(argv=None):
    args = parse_args(argv)
    topology = detect_topology()

    with lab_run("baseline", args, topology) as record:
        device = models.pick_device(args)
        torch.manual_seed(args.seed)
        train_set, test_set = data.load_datasets(args)
        global_batch = args.batch_size
        steps = optim.steps_per_epoch(len(train_set), global_batch)
        lr = args.lr

        model = models.build_model(args.stem).to(device)
        if args.channels_last:
            model = model.to(memory_format=torch.channels_last)
        optimizer = optim.make_optimizer(model, lr, args)
        precision = models.make_precision(args, device)
        first_epoch, step, history = 0, 0, timing.History.empty()
        if args.resume:
            first_epoch, step, history = checkpoints.load_checkpoint(args.checkpoint, model, optimizer, device,
                                                                  args, global_batch)
        schedule = optim.make_schedule(optimizer, steps, args, step)

        sampler = data.EpochShuffle(len(train_set), args.seed)
        train_batches = data.train_loader(train_set, sampler, args.batch_size, args)
        test_batches = data.test_loader(test_set, 4 * args.batch_size, args)
        say(topology, f"baseline: {args.dataset} {len(train_set)}/{len(test_set)} images, {args.stem} stem, "
                      f"{device}, {args.precision}, batch {global_batch}, lr {lr:g}, {steps} steps/epoch")

        clock = timing.TrainClock(device)
        for epoch in range(first_epoch, args.epochs):
            started = time.perf_counter()
            sampler.set_epoch(epoch)  # a new order every epoch
            clock.start_epoch()
            loss = train_one_epoch(model, train_batches, optimizer=optimizer, schedule=schedule, precision=precision,
                                   clock=clock, args=args, device=device)
            epoch_seconds = clock.end_epoch()
            accuracy = evaluate(model, test_batches, precision, args, device)
            history.add(loss.item(), accuracy, epoch_seconds, time.perf_counter() - started, args.target_accuracy)
            if args.checkpoint:
                checkpoints.save_checkpoint(args.checkpoint, model, optimizer, epoch + 1, schedule.last_epoch,
                                         history, args, global_batch)
            say(topology, timing.epoch_line(epoch, args, history))

        timing.report(record, history, clock, args, lr, global_batch, clock.img_per_sec)
        say(topology, f"baseline: {clock.img_per_sec or 0:.0f} img/s, final accuracy {history.test_accuracy[-1]:.4f}")


if __name__ == "__main__":
    main()
