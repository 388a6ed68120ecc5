"""Scaling benchmark: where the time of a data-parallel training step goes, for DDP and Horovod.

Every rank trains ResNet-18 on one fixed batch of random images that already sits on its device:
no input pipeline to wait for, so only compute and communication are left. Three measurements,
all ranks running together (so they contend for the same cores, memory and links as in training):

1. synced steps, the real DDP (or Horovod) step: step_seconds, img_per_sec;
2. the same steps with gradient sync off (DDP's no_sync(); for Horovod a local copy of the model
   with a plain optimizer): step_seconds_no_sync, the compute alone;
3. one gradient-sized buffer all-reduced by itself: allreduce_seconds, what the communication
   would cost if nothing hid it.
Phases 1 and 2 alternate in rounds, so that a change in the host's load touches both alike.

comm_seconds = step_seconds - step_seconds_no_sync is the communication the step really waits for;
comm_fraction = comm_seconds / step_seconds; overlap = 1 - comm_seconds / allreduce_seconds is the
share of the all-reduce hidden behind the backward pass. `distlab scale` runs this lab at several
world sizes and turns the records into speedup and efficiency (labs/SCALING.md).

    torchrun --standalone --nproc-per-node 2 labs/scaling/scaling.py --backend gloo --batch-size 32
    horovodrun --gloo -np 2 -H localhost:2 python labs/scaling/scaling.py --backend horovod --fp16-allreduce
    distlab scale --lab ddp --world-sizes 1,2 --repeats 3 -- --steps 50
"""

import argparse
import contextlib
import copy
import math
import statistics
import time

import torch
import torch.nn.functional as F

from labs.common.comm import connect
from labs.common.contract import add_contract_args, lab_run
from labs.common.data import CLASSES, IMAGE_SHAPE
from labs.common.models import build_model, make_precision
from labs.common.replicas import params_digest
from labs.common.timing import synchronize
from labs.common.topology import detect_topology, say

# Defaults a flag takes when it is not given; SMOKE runs in seconds on a CPU (tests use it).
FULL = {
    "batch_size": 32,  # images per rank per step
    "warmup_steps": 5,  # untimed: allocator, cuDNN autotuning, DDP's bucket rebuild after step 1
    "steps": 30,  # timed steps in each phase (synced, then sync off)
    "allreduce_repeats": 10,  # timed all-reduces of the gradient-sized buffer
}
SMOKE = {"batch_size": 4, "warmup_steps": 1, "steps": 2, "allreduce_repeats": 2}
DDP_BUCKET_CAP_MB = 25.0  # torch's own default
ROUNDS = 5  # the synced and sync-off phases alternate in this many rounds
LR = 0.01  # irrelevant to timing; small so that 1000s of steps on random labels stay finite


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_contract_args(parser, ["gloo", "nccl", "horovod"], default_backend="gloo")
    parser.add_argument("--batch-size", type=int, help="images per rank per step (default 32; 4 with --smoke)")
    parser.add_argument("--warmup-steps", type=int, help="untimed steps before each phase (default 5; 1 with --smoke)")
    parser.add_argument("--steps", type=int, help="timed steps per phase (default 30; 2 with --smoke)")
    parser.add_argument("--allreduce-repeats", type=int,
                        help="timed all-reduces of a gradient-sized buffer (default 10; 2 with --smoke)")
    parser.add_argument("--stem", choices=["cifar", "standard"],
                        help="ResNet-18 input stem: cifar (the course's model) or standard (about 16x cheaper); "
                             "default cifar on GPU, standard on CPU and with --smoke")
    levers = parser.add_argument_group("levers")
    levers.add_argument("--precision", "--amp", choices=["fp32", "bf16", "fp16"], default="fp32",
                        help="autocast precision of forward and backward; fp16 needs a GPU")
    levers.add_argument("--bucket-cap-mb", type=float,
                        help=f"DDP only: gradients are all-reduced in buckets of about this many MiB as backward "
                             f"fills them (default {DDP_BUCKET_CAP_MB:g}); smaller buckets start communicating "
                             "sooner, larger ones make fewer calls")
    levers.add_argument("--channels-last", action=argparse.BooleanOptionalAction,
                        help="NHWC images (and, with DDP, model) as tensor cores want them (default: on GPUs)")
    levers.add_argument("--fp16-allreduce", action="store_true",
                        help="send gradients as fp16, half the bytes (Horovod's Compression.fp16, "
                             "DDP's fp16_compress_hook)")
    args = parser.parse_args(argv)

    for name, value in (SMOKE if args.smoke else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in FULL:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.backend == "horovod" and args.bucket_cap_mb is not None:
        parser.error("--bucket-cap-mb is DDP's; Horovod fuses tensors up to HOROVOD_FUSION_THRESHOLD bytes instead")
    if args.backend != "horovod":
        args.bucket_cap_mb = DDP_BUCKET_CAP_MB if args.bucket_cap_mb is None else args.bucket_cap_mb
        if args.bucket_cap_mb <= 0:
            parser.error("--bucket-cap-mb must be positive")
    return args


def train_step(model, optimizer, precision, images, labels, no_sync=contextlib.nullcontext):
    """One optimizer step; gradients are all-reduced unless no_sync says otherwise (DDP)."""
    optimizer.zero_grad()  # gradients set to None (torch's default); Horovod's override takes no argument
    with no_sync():
        with precision.autocast():
            loss = F.cross_entropy(model(images), labels)
        precision.scaler.scale(loss).backward()
    if precision.scaler.is_enabled() and hasattr(optimizer, "skip_synchronize"):
        # Horovod with fp16 loss scaling: the scaler must unscale all-reduced gradients, so
        # wait for the all-reduce first and keep step() from waiting a second time.
        optimizer.synchronize()
        precision.scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():
            precision.scaler.step(optimizer)
    else:
        precision.scaler.step(optimizer)
    precision.scaler.update()
    return loss.detach()


def sgd(model):
    # fused: one kernel for the whole update, as the training labs use
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, fused=True)


def ddp_steps(model, device, args):
    """(synced step, local step, the replica to check, in-place sum of a tensor over ranks) for DDP."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=args.bucket_cap_mb)
    if args.fp16_allreduce:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = sgd(ddp)

    def synced(precision, images, labels):
        return train_step(ddp, optimizer, precision, images, labels)

    def local(precision, images, labels):
        return train_step(ddp, optimizer, precision, images, labels, no_sync=ddp.no_sync)

    return synced, local, model, dist.all_reduce


def horovod_steps(model, device, args):
    """(synced step, local step, the replica to check, in-place sum of a tensor over ranks) for Horovod."""
    import horovod.torch as hvd

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    # Horovod's optimizer hooks the model's parameters and all-reduces on every backward, with no
    # switch to turn that off: the sync-off phase trains a copy, whose parameters carry no hooks.
    local_model = copy.deepcopy(model)
    local_optimizer = sgd(local_model)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                         compression=compression)

    def synced(precision, images, labels):
        return train_step(model, optimizer, precision, images, labels)

    def local(precision, images, labels):
        return train_step(local_model, local_optimizer, precision, images, labels)

    def allreduce(tensor):
        hvd.allreduce_(tensor, op=hvd.Sum)

    return synced, local, model, allreduce


def timed(step, steps, device, barrier):
    """Seconds for `steps` calls of step(), every rank starting together (the wait is not timed)."""
    synchronize(device)
    barrier()
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    synchronize(device)
    return time.perf_counter() - start, loss


def time_phases(synced, local, args, device, barrier, check_replicas):
    """Total seconds of args.steps synced and args.steps sync-off steps, and the last synced loss.

    The two phases alternate in ROUNDS rounds: when other work on the host comes and goes, it then
    slows both alike, and their difference (the communication) stays meaningful.
    """
    rounds = [len(chunk) for chunk in torch.arange(args.steps).tensor_split(min(ROUNDS, args.steps))]
    for _ in range(args.warmup_steps):
        synced()
    synced_seconds, loss = timed(synced, rounds[0], device, barrier)
    check_replicas()  # before the first sync-off step, which lets the replicas drift apart on purpose
    for _ in range(min(args.warmup_steps, 2)):  # the first no_sync() steps take another code path
        local()
    local_seconds, _ = timed(local, rounds[0], device, barrier)
    for steps in rounds[1:]:
        seconds, loss = timed(synced, steps, device, barrier)
        synced_seconds += seconds
        local_seconds += timed(local, steps, device, barrier)[0]
    return synced_seconds, local_seconds, float(loss)


def time_allreduce(allreduce, elements, dtype, device, repeats, barrier, rank, world_size):
    """Mean seconds of one all-reduce of `elements` values, and how many came out wrong.

    Rank r sends r + 1 everywhere, so every element must sum to n(n+1)/2, exact in fp16 and fp32
    alike. The buffer is refilled and the ranks meet before each call, outside the clock: the
    time is the all-reduce's, not a late rank's.
    """
    buffer = torch.empty(elements, dtype=dtype, device=device)
    seconds = []
    for repeat in range(repeats + 1):  # the first call sets up connections and buffers: untimed
        buffer.fill_(rank + 1)
        synchronize(device)
        barrier()
        start = time.perf_counter()
        allreduce(buffer)
        synchronize(device)
        if repeat:
            seconds.append(time.perf_counter() - start)
    expected = world_size * (world_size + 1) / 2
    return statistics.fmean(seconds), int((buffer != expected).sum()), expected


def summarize(ranks, args, world_size, parameters):
    """The record's metrics from what every rank measured.

    Ranks step together when synced, so the slowest sets the pace: times are the maximum
    over ranks. Sync off, the ranks run independently; the slowest is still the one the
    synced step would wait for.
    """
    step_seconds = max(r["synced_seconds"] for r in ranks) / args.steps
    step_seconds_no_sync = max(r["local_seconds"] for r in ranks) / args.steps
    allreduce_seconds = max(r["allreduce_seconds"] for r in ranks)
    global_batch = args.batch_size * world_size
    img_per_sec = global_batch / step_seconds
    comm_seconds = step_seconds - step_seconds_no_sync  # negative only by noise: no communication to wait for
    # A lone rank's all-reduce is a copy, not communication: nothing to hide, so no overlap to report.
    overlap = None
    if world_size > 1 and allreduce_seconds > 0:
        overlap = min(1.0, max(0.0, 1 - comm_seconds / allreduce_seconds))
    return {
        "world_size": world_size,
        "per_rank_batch": args.batch_size,
        "global_batch": global_batch,
        "timed_steps": args.steps,
        "img_per_sec": img_per_sec,
        "img_per_sec_per_rank": img_per_sec / world_size,
        "img_per_sec_no_sync": global_batch / step_seconds_no_sync,
        "step_seconds": step_seconds,
        "step_seconds_no_sync": step_seconds_no_sync,
        "comm_seconds": comm_seconds,
        "comm_fraction": max(0.0, comm_seconds) / step_seconds,
        "allreduce_seconds": allreduce_seconds,
        "allreduce_bytes": ranks[0]["allreduce_bytes"],
        "overlap": overlap,
        "parameters": parameters,
        "threads_per_rank": ranks[0]["threads"],
    }


def main(argv=None):
    args = parse_args(argv)
    topology = detect_topology()

    with lab_run("scaling", args, topology) as record:
        comm = connect(args.backend, topology, args.timeout)
        device = comm.device
        if args.precision == "fp16" and device.type != "cuda":
            raise SystemExit("error: --precision fp16 needs a GPU (and its loss scaling); use fp32 or bf16 on CPU")
        args.stem = args.stem or ("cifar" if device.type == "cuda" and not args.smoke else "standard")
        record.config.update(stem=args.stem, bucket_cap_mb=args.bucket_cap_mb)
        precision = make_precision(args, device)

        args.channels_last = device.type == "cuda" if args.channels_last is None else args.channels_last
        record.config.update(channels_last=args.channels_last)
        torch.manual_seed(args.seed)  # the same initial model everywhere; DDP and Horovod broadcast it anyway
        model = build_model(args.stem).to(device)
        if args.channels_last and args.backend != "horovod":
            # Not for Horovod: 0.28.1 refuses tensors that are not contiguous, and a channels_last model's
            # weights, gradients and momentum are not (labs/horovod/train.py, build_model). Its images alone
            # are channels_last, which is enough for cuDNN's NHWC kernels.
            model = model.to(memory_format=torch.channels_last)
        parameters = sum(p.numel() for p in model.parameters())
        wrap = horovod_steps if args.backend == "horovod" else ddp_steps
        synced, local, replica, allreduce = wrap(model, device, args)

        # Each rank its own data, made once: the steps measure the model, not the input pipeline.
        generator = torch.Generator().manual_seed(args.seed * 1000 + comm.rank)
        images = torch.randn(args.batch_size, *IMAGE_SHAPE, generator=generator).to(device)
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, CLASSES, (args.batch_size,), generator=generator).to(device)

        say(topology, f"scaling: backend={args.backend} world_size={comm.size} per-rank batch={args.batch_size} "
                      f"global batch={args.batch_size * comm.size} stem={args.stem} precision={args.precision} "
                      f"threads/rank={torch.get_num_threads()} device={device}")

        def check_replicas():
            digests = comm.all_gather_object(params_digest(replica))
            record.check("params_identical", len(set(digests)) == 1, distinct_digests=len(set(digests)))

        synced_seconds, local_seconds, synced_loss = time_phases(
            lambda: synced(precision, images, labels), lambda: local(precision, images, labels), args, device,
            comm.barrier, check_replicas)
        dtype = torch.float16 if args.fp16_allreduce else torch.float32
        allreduce_seconds, wrong, expected = time_allreduce(allreduce, parameters, dtype, device,
                                                            args.allreduce_repeats, comm.barrier, comm.rank,
                                                            comm.size)
        mine = {
            "rank": comm.rank,
            "host": topology.hostname,
            "device": str(device),
            "threads": torch.get_num_threads(),
            "synced_seconds": synced_seconds,
            "local_seconds": local_seconds,
            "allreduce_seconds": allreduce_seconds,
            "allreduce_bytes": parameters * dtype.itemsize,
            "allreduce_wrong": wrong,
            "loss": synced_loss,
        }
        record.ranks = sorted(comm.all_gather_object(mine), key=lambda r: r["rank"])
        record.check("allreduce_value", all(r["allreduce_wrong"] == 0 for r in record.ranks), expected=expected,
                     wrong_elements=[r["allreduce_wrong"] for r in record.ranks])
        record.check("loss_finite", all(math.isfinite(r["loss"]) for r in record.ranks),
                     losses=[r["loss"] for r in record.ranks])
        record.metrics.update(summarize(record.ranks, args, comm.size, parameters))

        m = record.metrics
        overlap = "n/a" if m["overlap"] is None else f"{m['overlap']:.0%}"
        say(topology, f"  {m['img_per_sec']:.1f} img/s ({m['img_per_sec_per_rank']:.1f} per rank); step "
                      f"{m['step_seconds'] * 1e3:.1f} ms, sync off {m['step_seconds_no_sync'] * 1e3:.1f} ms, "
                      f"all-reduce of {m['allreduce_bytes'] / 2**20:.1f} MiB alone {m['allreduce_seconds'] * 1e3:.1f} "
                      f"ms; comm fraction {m['comm_fraction']:.1%}, overlap {overlap}")
        comm.close()


if __name__ == "__main__":
    main()
