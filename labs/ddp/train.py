"""DDP: the baseline on several processes with PyTorch DistributedDataParallel, launched by torchrun.

This is labs/baseline/train.py plus only what DDP needs, each addition commented with why:
`diff labs/baseline/train.py labs/ddp/train.py` shows them all. One process per device; each
holds a full replica of the model, trains on its own shard of every epoch, and DDP averages the
gradients across processes during backward, so all replicas take the same step.

    torchrun --standalone --nproc-per-node 2 labs/ddp/train.py --smoke                 # 2 CPU processes, gloo
    torchrun --standalone --nproc-per-node 8 labs/ddp/train.py --backend nccl          # 8 GPUs, CIFAR-10
    distlab run ddp --world-size 2 -- --smoke
"""

import argparse
import os
import time
from contextlib import nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from labs.common import checkpoints, data, faults, flags, models, optim, process_group, replicas, timing
from labs.common.batchnorm import convert_to_global_batchnorm
from labs.common.contract import add_contract_args, lab_run
from labs.common.topology import detect_topology, say


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # nccl: GPU to GPU over NVLink/InfiniBand; gloo: CPUs (and a fallback for GPUs)
    add_contract_args(parser, ["gloo", "nccl"], default_backend="nccl" if torch.cuda.is_available() else "gloo")
    flags.add_training_args(parser)
    ddp = parser.add_argument_group("DDP")
    ddp.add_argument("--bucket-cap-mb", type=float, default=25.0,
                     help="DDP all-reduces gradients in buckets of about this size as backward fills them: "
                          "smaller starts communication sooner, larger makes fewer, more efficient calls")
    ddp.add_argument("--sync-bn", action="store_true",
                     help="BatchNorm statistics over the global batch, not each rank's (SyncBatchNorm on GPUs, "
                          "labs/common/batchnorm.py on CPUs)")
    faults.add_fault_arg(ddp)
    args = parser.parse_args(argv)
    flags.resolve_training_args(parser, args)
    return args


def train_one_epoch(model, loader, *, optimizer, schedule, precision, clock, args, device, rank):
    """One pass over this rank's shard; returns the mean training loss and the sample indices trained on."""
    model.train()
    models.set_bn_eval(model, args.bn_eval)
    loss_sum = torch.zeros((), device=device)  # summed on the device: no GPU sync at every step
    order = []  # this rank's samples, in order: the end-of-run checks compare them across ranks
    for images, labels, indices in loader:
        order += indices.tolist()
        images, labels = models.to_device(images, labels, device, args.channels_last)
        micro_batches = zip(images.chunk(args.accumulate), labels.chunk(args.accumulate), strict=True)
        # FAULT INJECTION (--fault skip): on its rank and step, every micro-batch runs inside no_sync,
        # so this rank leaves the step's all-reduce out, as a bug in a rank's control flow would.
        micro_batches = faults.skip_all_reduce(args.fault, rank, schedule.last_epoch + 1, micro_batches, model.no_sync)
        for i, (micro_images, micro_labels) in enumerate(micro_batches):
            # DDP all-reduces gradients during every backward. When accumulating, only the last
            # micro-batch needs it: no_sync lets the others just add to the local gradients, so K
            # micro-batches cost one all-reduce, not K. Forward and backward both belong inside.
            with model.no_sync() if i < args.accumulate - 1 else nullcontext():
                with precision.autocast():
                    loss = F.cross_entropy(model(micro_images), micro_labels) / args.accumulate
                precision.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        precision.scaler.step(optimizer)
        precision.scaler.update()
        optimizer.zero_grad()
        schedule.step()
        clock.step(len(labels))
        faults.fault_point(args.fault, rank, schedule.last_epoch)  # FAULT INJECTION (--fault crash or hang)
    return loss_sum / len(loader), order


def evaluate(model, loader, precision, args, device):
    counts = models.count_correct(model, loader, precision, args, device)
    # Each rank counted its own shard of the test set, and the shards hold every test image exactly
    # once (no padding, see the test loader): the sums are the whole test set's counts.
    dist.all_reduce(counts)
    correct, total = counts.tolist()
    return correct / total


def main(argv=None):
    args = parse_args(argv)
    topology = detect_topology()

    with lab_run("ddp", args, topology) as record:
        # One process per device: local rank i drives GPU i on its node.
        device = models.pick_device(args, topology.local_rank)
        if args.backend == "nccl" and device.type != "cuda":
            raise SystemExit("error: backend nccl needs GPUs and this run has none (none visible, or --device cpu); "
                             "use --backend gloo")
        if device.type == "cuda":
            # Before anything touches CUDA: NCCL's communicators, and every tensor made without a
            # device, would otherwise all go to GPU 0, from every process of the node.
            torch.cuda.set_device(device)
        # The process group. Rank and world size come from the launcher's environment, the
        # rendezvous address from MASTER_ADDR/MASTER_PORT (torchrun sets them). The timeout turns a
        # dead or stuck peer into an error in the collective that waits for it after --timeout
        # seconds, instead of a silent wait of torch's default (10 minutes for NCCL, 30 for Gloo).
        timeout = timedelta(seconds=args.timeout)
        # On one host rank 0 serves the rendezvous store from loopback only (None on several hosts:
        # torch's own, from MASTER_ADDR); see labs/README.md, "Who am I".
        store = process_group.loopback_store(topology, timeout)
        # device_id binds NCCL's communicators to this rank's GPU at once; Gloo takes none.
        dist.init_process_group(args.backend, store=store, rank=topology.rank, world_size=topology.world_size,
                                timeout=timeout, device_id=device if args.backend == "nccl" else None)
        torch.manual_seed(args.seed)
        train_set, test_set = data.load_datasets(args)
        global_batch = args.batch_size * topology.world_size
        steps = optim.steps_per_epoch(len(train_set), global_batch)
        # Linear scaling rule (Goyal et al., 2017): every step now averages the gradients of
        # world_size batches, a world_size times larger global batch, so the learning rate grows by
        # the same factor. The warm-up (--warmup-epochs) ramps it in: the scaled rate is too large
        # for the first steps of training.
        lr = args.lr * topology.world_size

        model = models.build_model(args.stem).to(device)
        if args.sync_bn:
            # Small per-GPU batches give noisy BatchNorm statistics; SyncBatchNorm computes them over
            # the global batch, at the cost of an all-reduce in every BatchNorm layer of the forward.
            # torch's refuses CPU modules: on CPUs the same idea in a few lines (labs/common/batchnorm.py).
            model = (torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) if device.type == "cuda"
                     else convert_to_global_batchnorm(model))
        if args.channels_last:
            model = model.to(memory_format=torch.channels_last)
        optimizer = optim.make_optimizer(model, lr, args)
        precision = models.make_precision(args, device)
        first_epoch, step, history = 0, 0, timing.History.empty()
        # Elastic restarts (torchrun --max-restarts N): after a rank fails, torchrun starts every
        # rank again and counts in TORCHELASTIC_RESTART_COUNT; the run goes on from its last checkpoint.
        restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        record.metrics["restarts"] = restarts
        if args.resume or (restarts and args.checkpoint is not None and args.checkpoint.is_file()):
            # Every rank reads the checkpoint onto its own device (checkpoints.load_checkpoint maps it there).
            first_epoch, step, history = checkpoints.load_checkpoint(args.checkpoint, model, optimizer, device,
                                                                  args, global_batch)
        schedule = optim.make_schedule(optimizer, steps, args, step)

        # Each rank trains on its own 1/world_size of every epoch's permutation; the shared seed makes
        # all ranks draw the same permutation, so the shards are disjoint. drop_last: trim the
        # permutation to a multiple of the world size instead of padding it with repeated samples.
        sampler = DistributedSampler(train_set, num_replicas=topology.world_size, rank=topology.rank,
                                     shuffle=True, seed=args.seed, drop_last=True)
        train_batches = data.train_loader(train_set, sampler, args.batch_size, args)
        # The test set is split by striding, not by DistributedSampler, which would pad the last
        # shards with repeated images and count them twice.
        test_shard = range(topology.rank, len(test_set), topology.world_size)
        test_batches = data.test_loader(test_set, 4 * args.batch_size, args, test_shard)
        # DDP broadcasts rank 0's parameters and buffers, so every replica starts equal, and from
        # then on averages the gradients in buckets while backward is still running.
        # gradient_as_bucket_view: the gradients live in the buckets, saving a copy of every
        # gradient into and out of them at each step, and the memory of a second copy.
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                    bucket_cap_mb=args.bucket_cap_mb, gradient_as_bucket_view=True)
        say(topology, f"ddp: {args.dataset} {len(train_set)}/{len(test_set)} images, {args.stem} stem, "
                      f"{device}, {args.precision}, batch {global_batch}, lr {lr:g}, {steps} steps/epoch, "
                      f"world size {topology.world_size}, {args.backend}")

        clock = timing.TrainClock(device)
        orders = []
        for epoch in range(first_epoch, args.epochs):
            started = time.perf_counter()
            sampler.set_epoch(epoch)  # without it every epoch repeats epoch 0's order on every rank
            clock.start_epoch()
            loss, order = train_one_epoch(model, train_batches, optimizer=optimizer, schedule=schedule,
                                          precision=precision, clock=clock, args=args, device=device,
                                          rank=topology.rank)
            epoch_seconds = clock.end_epoch()
            orders.append(order)
            # Each rank's loss is over its own shard: report the average over ranks.
            dist.all_reduce(loss)
            loss /= topology.world_size
            # One model to evaluate and save: the parameters are equal on every rank, BatchNorm's running
            # statistics are not (each rank updated them from its own batches), so make them their average.
            replicas.average_buffers(model.module, dist.all_reduce, topology.world_size)
            # The unwrapped model: DDP's forward broadcasts buffers from rank 0, a collective that
            # would hang when ranks have different numbers of test batches.
            accuracy = evaluate(model.module, test_batches, precision, args, device)
            history.add(loss.item(), accuracy, epoch_seconds, time.perf_counter() - started, args.target_accuracy)
            if args.checkpoint:
                if topology.is_rank0:  # the replicas are identical: one writer is enough
                    # model.module: without DDP's "module." prefix, so the baseline can load it too.
                    checkpoints.save_checkpoint(args.checkpoint, model.module, optimizer, epoch + 1,
                                             schedule.last_epoch, history, args, global_batch)
                # No rank starts the next epoch before the file is complete: whichever rank fails
                # next, this epoch's checkpoint is there to resume from.
                dist.barrier()
            say(topology, timing.epoch_line(epoch, args, history))

        # Every rank sends its parameters' and buffers' digests and sample order; rank 0 checks them for the record.
        reports = [None] * topology.world_size
        mine = replicas.replica_report(topology.rank, model.module, orders, clock, device)
        dist.all_gather_object(reports, mine)
        img_per_sec = replicas.check_replicas(record, reports, len(train_set), global_batch, first_epoch)
        timing.report(record, history, clock, args, lr, global_batch, img_per_sec)
        say(topology, f"ddp: {img_per_sec or 0:.0f} img/s, final accuracy {history.test_accuracy[-1]:.4f}")
        # Leave the process group on every rank: it closes the connections and stops the backend's
        # threads in order, where an exit without it can hang or warn (NCCL does).
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
