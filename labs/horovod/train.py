"""Horovod: the baseline on several processes with Horovod, launched by horovodrun or mpirun.

This is labs/baseline/train.py plus only what Horovod needs, each addition commented with why:
`diff labs/baseline/train.py labs/horovod/train.py` shows them all (and diffing against
labs/ddp/train.py compares the two tools). Horovod wraps the optimizer instead of the model: its
DistributedOptimizer averages each gradient across processes as soon as backward produces it.

    horovodrun --gloo -np 2 -H localhost:2 python labs/horovod/train.py --smoke     # Gloo controller
    mpirun -np 2 python labs/horovod/train.py --smoke                              # MPI controller
    distlab run horovod --world-size 2 -- --smoke
"""

import argparse
import time
from functools import partial

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch.utils.data.distributed import DistributedSampler

from labs.common import checkpoints, data, faults, flags, models, optim, process_group, replicas, timing
from labs.common.batchnorm import convert_to_global_batchnorm, replace_batchnorm
from labs.common.contract import add_contract_args, lab_run
from labs.common.topology import detect_topology, say


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_contract_args(parser, ["horovod"], default_backend="horovod")  # Horovod picks Gloo, MPI or NCCL itself
    flags.add_training_args(parser)
    horovod = parser.add_argument_group("Horovod")
    horovod.add_argument("--fp16-allreduce", action="store_true",
                         help="send gradients as fp16: half the bytes on the wire, slightly less precise")
    horovod.add_argument("--sync-bn", action="store_true",
                         help="BatchNorm statistics over the global batch, not each rank's (hvd.SyncBatchNorm on "
                              "GPUs, labs/common/batchnorm.py with hvd.allreduce on CPUs)")
    faults.add_fault_arg(horovod)
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
        # FAULT INJECTION (--fault skip): Horovod starts the all-reduces from backward's hooks, so leaving
        # them out, as a bug in a rank's control flow would, means leaving this rank's whole step out.
        if faults.skips_collective(args.fault, rank, schedule.last_epoch + 1):
            continue
        order += indices.tolist()
        images, labels = models.to_device(images, labels, device, args.channels_last)
        micro_batches = zip(images.chunk(args.accumulate), labels.chunk(args.accumulate), strict=True)
        for micro_images, micro_labels in micro_batches:
            with precision.autocast():
                loss = F.cross_entropy(model(micro_images), micro_labels) / args.accumulate
            precision.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        # Wait for the gradient all-reduces here, then step without waiting again: a GradScaler (fp16)
        # must unscale the averaged gradients, not the local ones the all-reduce is about to replace.
        optimizer.synchronize()
        with optimizer.skip_synchronize():
            precision.scaler.step(optimizer)
        precision.scaler.update()
        optimizer.zero_grad()
        schedule.step()
        clock.step(len(labels))
        faults.fault_point(args.fault, rank, schedule.last_epoch)  # FAULT INJECTION (--fault crash or hang)
    return loss_sum / len(loader), order


def build_model(args, device):
    """ResNet-18 with the BatchNorm layers --sync-bn asks for, on this rank's device."""
    model = models.build_model(args.stem)
    if args.sync_bn:
        # Small per-rank batches give noisy BatchNorm statistics: compute them over the global
        # batch, one all-reduce per BatchNorm layer. Horovod's SyncBatchNorm runs on GPUs only.
        # The layers are replaced BEFORE the model moves to its device: the new ones are made on the
        # CPU, and in a model moved first they would stay there (a device mismatch in the first forward).
        if device.type != "cpu":
            model = replace_batchnorm(model, lambda bn: hvd.SyncBatchNorm(bn.num_features, bn.eps, bn.momentum))
        else:  # named by layer: Horovod's response cache then knows each all-reduce from the last step
            model = convert_to_global_batchnorm(model, lambda stats, name: hvd.allreduce(stats, op=hvd.Sum,
                                                                                         name=name))
    # --channels-last lays out the input batches only (models.to_device), never the model: Horovod
    # 0.28.1 refuses any tensor that is not contiguous ("Tensor is required to be contiguous"), and a
    # channels_last model's 4-D weights, their gradients and momentum buffers all are not. With
    # channels_last images cuDNN still runs its NHWC kernels; it converts each weight per call and each
    # weight gradient back (ResNet-18: about 180 MB of copies a step, some 40 us at an H200's 4.8 TB/s,
    # estimated), and the gradients are contiguous, in the parameters' own layout, as autograd keeps them.
    return model.to(device)


def evaluate(model, loader, precision, args, device):
    counts = models.count_correct(model, loader, precision, args, device)
    # Each rank counted its own shard of the test set, and the shards hold every test image exactly
    # once (no padding, see the test loader): the sums are the whole test set's counts.
    counts = hvd.allreduce(counts, op=hvd.Sum)
    correct, total = counts.tolist()
    return correct / total


def main(argv=None):
    args = parse_args(argv)
    topology = detect_topology()

    with lab_run("horovod", args, topology) as record:
        # Join the other processes: through horovodrun's Gloo rendezvous, or MPI under mpirun. A rank
        # that stops taking part is reported, and the job shut down, after --timeout.
        process_group.horovod_stall_timeouts(args.timeout)
        hvd.init()
        # One process per device: local rank i drives GPU i on its node.
        device = models.pick_device(args, hvd.local_rank())
        if device.type == "cuda":
            # Pin this process to its GPU: every CUDA call that names no device, Horovod's own
            # included, would otherwise go to GPU 0, from every process of the node.
            torch.cuda.set_device(device)
        torch.manual_seed(args.seed)
        train_set, test_set = data.load_datasets(args)
        global_batch = args.batch_size * hvd.size()
        steps = optim.steps_per_epoch(len(train_set), global_batch)
        # Linear scaling rule (Goyal et al., 2017): every step now averages the gradients of
        # world_size batches, a world_size times larger global batch, so the learning rate grows by
        # the same factor. The warm-up (--warmup-epochs) ramps it in: the scaled rate is too large
        # for the first steps of training.
        lr = args.lr * hvd.size()

        model = build_model(args, device)
        optimizer = optim.make_optimizer(model, lr, args)
        precision = models.make_precision(args, device)
        # The DistributedOptimizer all-reduces (averages) each gradient as soon as backward has it;
        # with accumulation it waits for the last of backward_passes_per_step backward passes.
        optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(),
            compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,
            backward_passes_per_step=args.accumulate)
        first_epoch, step, history = 0, 0, timing.History.empty()
        if args.resume:
            # After wrapping: the DistributedOptimizer is a new optimizer and would drop loaded state.
            # Every rank reads the checkpoint onto its own device (checkpoints.load_checkpoint maps it there).
            first_epoch, step, history = checkpoints.load_checkpoint(args.checkpoint, model, optimizer, device,
                                                                  args, global_batch)
        # Start every replica from rank 0's parameters and buffers, whatever each rank built or loaded.
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        if args.resume:
            # Momentum buffers exist only in a resumed optimizer. On a fresh one,
            # broadcast_optimizer_state would first take a step with zero gradients to create them,
            # and weight decay makes that step shrink every weight.
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        schedule = optim.make_schedule(optimizer, steps, args, step)

        # Each rank trains on its own 1/world_size of every epoch's permutation; the shared seed makes
        # all ranks draw the same permutation, so the shards are disjoint. drop_last: trim the
        # permutation to a multiple of the world size instead of padding it with repeated samples.
        sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                     shuffle=True, seed=args.seed, drop_last=True)
        train_batches = data.train_loader(train_set, sampler, args.batch_size, args)
        # The test set is split by striding, not by DistributedSampler, which would pad the last
        # shards with repeated images and count them twice.
        test_shard = range(hvd.rank(), len(test_set), hvd.size())
        test_batches = data.test_loader(test_set, 4 * args.batch_size, args, test_shard)
        say(topology, f"horovod: {args.dataset} {len(train_set)}/{len(test_set)} images, {args.stem} stem, "
                      f"{device}, {args.precision}, batch {global_batch}, lr {lr:g}, {steps} steps/epoch, "
                      f"world size {hvd.size()}, {'fp16' if args.fp16_allreduce else 'full-precision'} all-reduce")

        clock = timing.TrainClock(device)
        orders = []
        for epoch in range(first_epoch, args.epochs):
            started = time.perf_counter()
            sampler.set_epoch(epoch)  # without it every epoch repeats epoch 0's order on every rank
            clock.start_epoch()
            loss, order = train_one_epoch(model, train_batches, optimizer=optimizer, schedule=schedule,
                                          precision=precision, clock=clock, args=args, device=device, rank=hvd.rank())
            epoch_seconds = clock.end_epoch()
            orders.append(order)
            # Each rank's loss is over its own shard: report the average over ranks.
            loss = hvd.allreduce(loss, op=hvd.Average)
            # One model to evaluate and save: the parameters are equal on every rank, BatchNorm's running
            # statistics are not (each rank updated them from its own batches), so make them their average.
            replicas.average_buffers(model, partial(hvd.allreduce_, op=hvd.Sum, name="batchnorm_statistics"),
                                     hvd.size())
            accuracy = evaluate(model, test_batches, precision, args, device)
            history.add(loss.item(), accuracy, epoch_seconds, time.perf_counter() - started, args.target_accuracy)
            if args.checkpoint:
                if hvd.rank() == 0:  # the replicas are identical: one writer is enough
                    checkpoints.save_checkpoint(args.checkpoint, model, optimizer, epoch + 1,
                                             schedule.last_epoch, history, args, global_batch)
                # No rank starts the next epoch before the file is complete: whichever rank fails
                # next, this epoch's checkpoint is there to resume from.
                hvd.barrier()
            say(topology, timing.epoch_line(epoch, args, history))

        # Every rank sends its parameters' and buffers' digests and sample order; rank 0 checks them for the record.
        reports = hvd.allgather_object(replicas.replica_report(hvd.rank(), model, orders, clock, device))
        img_per_sec = replicas.check_replicas(record, reports, len(train_set), global_batch, first_epoch)
        timing.report(record, history, clock, args, lr, global_batch, img_per_sec)
        say(topology, f"horovod: {img_per_sec or 0:.0f} img/s, final accuracy {history.test_accuracy[-1]:.4f}")
        # Leave Horovod on every rank: its background thread stops and the controller (Gloo or MPI)
        # closes in order, where an exit without it can hang the peers still talking to this rank.
        hvd.shutdown()


if __name__ == "__main__":
    main()
