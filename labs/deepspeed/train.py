"""DeepSpeed ZeRO stages 1, 2 and 3 on the fsdp lab's model: the same steps as one process, bytes per rank measured.

DeepSpeed's engine (deepspeed.initialize with a JSON config) replaces DDP's wrapper and the
optimizer at once. Its ZeRO optimizer keeps a flat fp32 "master" copy of the parameters for Adam
to update, even when the model itself is fp32, and shards more at each stage:

    stage 1   Adam's moments and the master copy sharded     4 + 4 + 12/N bytes per parameter
    stage 2   ... and the gradients                          4 + (4 + 12)/N
    stage 3   ... and the parameters                         (4 + 4 + 12)/N

(the ZeRO paper's 2 + 2 + K with K = 12, in fp32: Rajbhandari et al., 2020). Each stage trains
the same model on the same global batch as labs/fsdp/train.py; the lab replays the steps in one
process with torch's Adam and checks the parameters against it, and counts what every rank holds.
Several stages run one after the other in one process group (`--stages 1,2,3`); each builds its
model afresh from the seed. `--offload` moves the optimizer state and master copy to CPU memory
(ZeRO-Offload); on a CPU host that is where they already are, so it runs the offload code path
(its own Adam step on CPU tensors, gradients copied out) and saves nothing.

Launched with torchrun, not DeepSpeed's own `deepspeed` launcher. deepspeed.init_distributed
reads the env:// variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) that torchrun sets, so
torchrun starts DeepSpeed programs as it starts every other torch lab here, with distlab's
loopback-only file rendezvous, restarts and process tracking; the `deepspeed` launcher is a
wrapper that spawns the same ranks itself (and, across nodes, over pdsh/ssh).

    torchrun --standalone --nproc-per-node 2 labs/deepspeed/train.py --smoke
    torchrun --standalone --nproc-per-node 2 labs/deepspeed/train.py --stages 3 --offload
    torchrun --standalone --nproc-per-node 2 labs/deepspeed/train.py --stages 2 --checkpoint ck --steps 10
    torchrun --standalone --nproc-per-node 1 labs/deepspeed/train.py --stages 2 --checkpoint ck --steps 15 --resume
    torchrun --standalone --nproc-per-node 8 labs/deepspeed/train.py --backend nccl

On CPUs: DS_ACCELERATOR=cpu (set here when no GPU is visible), the gloo backend, and torch's Adam
(`torch_adam`): DeepSpeed's fused and CPU Adam are C++/CUDA ops compiled on first use.
"""

import argparse
import datetime as dt
import gc
import os
import time
import warnings
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported: it picks its accelerator then

import deepspeed  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from labs.common.contract import add_contract_args, lab_run  # noqa: E402
from labs.common.models_small import BlockStack, parameter_count, synthetic_batch  # noqa: E402
from labs.common.process_group import loopback_store  # noqa: E402
from labs.common.topology import detect_topology, say  # noqa: E402

STAGES = (1, 2, 3)
DIM, HIDDEN, LAYERS, CLASSES = 256, 1024, 4, 16  # labs/fsdp/train.py's model
GLOBAL_BATCH = 64  # samples per step over all ranks: the same at every world size
STEPS = 20
LR = 1e-3  # Adam
SMOKE = {"dim": 64, "hidden": 256, "steps": 5}  # seconds on a CPU
# Bytes per parameter with DeepSpeed in fp32: parameter, gradient, and K = master copy + Adam's m, v.
BYTES_PARAM, BYTES_GRAD, BYTES_MASTER, BYTES_ADAM = 4, 4, 4, 8
MEMORY_TOLERANCE = 0.10  # the model states counted per rank against the formula
# DeepSpeed's buckets default to 5e8 elements; stage 3 allocates its reduce bucket whole: 2.0 GB of
# fp32 per rank for this 0.5 MB model (measured here: 2,001,891,569 bytes of tensors alive after a
# step). 2^18 elements (1 MiB) holds the largest tensor of the default model, 256 x 1024.
BUCKET_ELEMENTS = 2**18
# The oracle: one process, torch's Adam on the whole global batch. DeepSpeed averages the ranks'
# gradients in a flat bucket (another order of additions than one process's backward) and Adam
# divides by sqrt(v), magnifying rounding where a gradient nearly cancels. Measured here at world
# size 2, the largest difference as a fraction of how far training moved the parameters, the same
# at every stage: 20 steps of the default model 6.6e-4 (ATEN_CPU_CAPABILITY=avx512, this CPU's, and
# avx2) and 2.1e-4 (default); the smoke run's 5 steps 3.9e-4 and 8.6e-4. labs/fsdp measured 1.3 on
# this model and oracle for a rank that skips the gradient all-reduce. The check allows 1e-2 (12x
# the largest honest difference), as labs/fsdp's does.
ORACLE_RTOL = 1e-2


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_contract_args(parser, ["gloo", "nccl"], default_backend="nccl" if torch.cuda.is_available() else "gloo")
    parser.add_argument("--stages", default="1,2,3",
                        help="ZeRO stages to train one after the other, comma-separated (default 1,2,3)")
    parser.add_argument("--offload", action="store_true",
                        help="ZeRO-Offload: optimizer state and master copy in CPU memory, Adam stepped there")
    parser.add_argument("--dim", type=int, help=f"model width (default {DIM}; {SMOKE['dim']} with --smoke)")
    parser.add_argument("--hidden", type=int,
                        help=f"feed-forward width (default {HIDDEN}; {SMOKE['hidden']} with --smoke)")
    parser.add_argument("--layers", type=int, default=LAYERS, help=f"MLP blocks (default {LAYERS})")
    parser.add_argument("--classes", type=int, default=CLASSES, help=f"output classes (default {CLASSES})")
    parser.add_argument("--global-batch", type=int, default=GLOBAL_BATCH,
                        help=f"samples per step over all ranks (default {GLOBAL_BATCH})")
    parser.add_argument("--steps", type=int,
                        help=f"optimizer steps in all (default {STEPS}; {SMOKE['steps']} with --smoke)")
    parser.add_argument("--lr", type=float, default=LR, help=f"Adam learning rate (default {LR})")
    parser.add_argument("--checkpoint", type=Path,
                        help="DeepSpeed checkpoint folder (one sub-folder per stage), written at the end of the run")
    parser.add_argument("--resume", action="store_true",
                        help="start each stage from --checkpoint (DeepSpeed's universal form: at any world size)")
    args = parser.parse_args(argv)
    try:
        args.stages = [int(s) for s in args.stages.split(",")]
    except ValueError:
        parser.error(f"--stages {args.stages!r}: give ZeRO stages as numbers, like 1,2,3")
    if not args.stages or any(s not in STAGES for s in args.stages) or len(set(args.stages)) < len(args.stages):
        parser.error(f"--stages {','.join(map(str, args.stages))}: each of 1, 2, 3 at most once, like 1,2,3")
    for name, value in {"dim": DIM, "hidden": HIDDEN, "steps": STEPS}.items():
        if getattr(args, name) is None:
            setattr(args, name, SMOKE[name] if args.smoke else value)
    for name in ("dim", "hidden", "layers", "classes", "global_batch", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.lr <= 0:
        parser.error("--lr must be > 0")
    if args.resume and args.checkpoint is None:
        parser.error("--resume needs --checkpoint DIR (the folder to resume from)")
    return args


def main(argv=None):
    args = parse_args(argv)
    topology = detect_topology()
    rank, world_size = topology.rank, topology.world_size

    with lab_run("deepspeed", args, topology) as record:
        refuse_bad_input(args, world_size)
        if args.backend == "nccl":
            torch.cuda.set_device(topology.local_rank)
        device = torch.device("cuda", topology.local_rank) if args.backend == "nccl" else torch.device("cpu")
        # DeepSpeed joins the process group from the env:// variables; with torch's group already
        # initialised (on the loopback store, with the collective timeout) it uses that one.
        timeout = dt.timedelta(seconds=args.timeout)
        dist.init_process_group(args.backend, store=loopback_store(topology, timeout), rank=rank,
                                world_size=world_size, timeout=timeout)
        deepspeed.init_distributed(dist_backend=args.backend, timeout=timeout)

        oracle = single_process_parameters(args) if topology.is_rank0 else None
        record.metrics.update(world_size=world_size, deepspeed=deepspeed.__version__, steps=args.steps,
                              offload=args.offload, stages={})
        reports_by_stage = {}
        for stage in args.stages:
            metrics, reports, full = train_stage(stage, args, topology, device)
            reports_by_stage[stage] = reports
            if topology.is_rank0:
                check_against_single_process(record, stage, metrics, full, oracle)
                check_memory(record, stage, metrics, reports, metrics["parameters"], world_size)
            record.metrics["stages"][str(stage)] = metrics
        record.metrics["parameters"] = metrics["parameters"]
        record.ranks = [{"rank": r["rank"], **{f"stage{s}": reports_by_stage[s][i] for s in args.stages}}
                        for i, r in enumerate(reports_by_stage[args.stages[0]])]
        if topology.is_rank0:
            print_memory(topology, record, args.stages, world_size)
        dist.destroy_process_group()


def refuse_bad_input(args, world_size):
    """Stop before anything starts or is written: one line naming the fix."""
    if args.global_batch % world_size:
        raise SystemExit(f"error: --global-batch {args.global_batch} does not split over world size {world_size}; "
                         f"choose a multiple of {world_size}")
    for stage in args.stages:
        folder = stage_folder(args.checkpoint, stage) if args.checkpoint else None
        if folder is not None and not args.resume and folder.exists():
            raise SystemExit(f"error: {folder} already exists and is never overwritten; "
                             "add --resume to continue it, or choose another --checkpoint")
        if args.resume and not (folder / "latest_universal").is_file():
            raise SystemExit(f"error: {folder} holds no universal DeepSpeed checkpoint (no latest_universal file); "
                             "drop --resume or point --checkpoint at a folder this lab wrote")


def config(stage, args, world_size):
    """The JSON config DeepSpeed reads: batch sizes, optimizer, ZeRO stage. Users keep it in a file."""
    zero = {"stage": stage, "reduce_bucket_size": BUCKET_ELEMENTS, "allgather_bucket_size": BUCKET_ELEMENTS}
    if stage == 3:
        # Stage 3 keeps small parameters whole on every rank below this many elements (default
        # 1e5, which is every tensor of the smoke model): 0 shards them all, as FSDP does.
        zero.update(stage3_prefetch_bucket_size=BUCKET_ELEMENTS, stage3_param_persistence_threshold=0,
                    stage3_max_live_parameters=BUCKET_ELEMENTS)
    if args.offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {
        "train_batch_size": args.global_batch,  # = micro-batch x gradient accumulation x world size
        "train_micro_batch_size_per_gpu": args.global_batch // world_size,
        "gradient_accumulation_steps": 1,
        # adam_w_mode false: Adam, not AdamW (whose weight decay the oracle does not have);
        # torch_adam: torch.optim.Adam, not DeepSpeed's compiled fused or CPU Adam.
        "optimizer": {"type": "Adam", "params": {"lr": args.lr, "torch_adam": True, "adam_w_mode": False}},
        "zero_optimization": zero,
        # DeepSpeed 0.19 clips the gradient norm to 1.0 unless told otherwise (GRADIENT_CLIPPING_DEFAULT);
        # the smoke model's first gradient has norm 1.67, so its first step differed from plain Adam
        # by 12% of the step. 0: no clipping, like the single-process run and the fsdp lab.
        "gradient_clipping": 0.0,
        # Offload with torch's Adam instead of DeepSpeed's CPU Adam is a choice DeepSpeed warns about.
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,  # DeepSpeed's own progress lines: off
        "checkpoint": {"load_universal": args.resume},
    }


def train_stage(stage, args, topology, device):
    """One ZeRO stage from the seed to --steps: its losses, time, bytes per rank and full parameters."""
    rank, world_size = topology.rank, topology.world_size
    gc.collect()
    meter = MemoryMeter()  # what is alive before the model: not this stage's
    torch.manual_seed(args.seed)  # every rank builds the same initial model
    model = BlockStack(args.dim, args.hidden, args.layers, args.classes).to(device)
    parameters = parameter_count(model)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config(stage, args, world_size))
    first_step = 0
    if args.resume:
        # DeepSpeed reads the universal checkpoint's per-parameter files, sliced to this world size.
        engine.load_checkpoint(str(stage_folder(args.checkpoint, stage)))
        first_step = engine.global_steps
        if first_step >= args.steps:
            raise SystemExit(f"error: {stage_folder(args.checkpoint, stage)} is already at step {first_step}; "
                             f"resume with --steps above {first_step}")
    say(topology, f"deepspeed: ZeRO stage {stage}{' + offload' if args.offload else ''}, {parameters:,} parameters, "
                  f"world size {world_size}, global batch {args.global_batch}, steps {first_step}..{args.steps}, "
                  f"{device}, {args.backend}")
    per_rank = args.global_batch // world_size
    losses, started = [], time.perf_counter()
    for step in range(first_step, args.steps):
        last = step == args.steps - 1
        inputs, labels = synthetic_batch(step, args.global_batch, args.dim, args.classes)
        mine = slice(rank * per_rank, (rank + 1) * per_rank)  # this rank's share of the global batch
        loss = F.cross_entropy(engine(inputs[mine].to(device)), labels[mine].to(device))
        engine.backward(loss)  # gradients reduced in buckets; stages 2 and 3 keep only their partition
        if last:  # the steady state, every buffer allocated; and out of the clock (a census takes ~1 s here)
            seconds = time.perf_counter() - started
            meter.sample(engine, "backward")
            started = time.perf_counter()
        engine.step()  # Adam on this rank's partition of the master copy, then the parameters all-gathered
        if last:
            seconds += time.perf_counter() - started
            meter.sample(engine, "step")
        losses.append(average(loss.detach(), world_size))

    if args.checkpoint:
        save_checkpoint(engine, stage_folder(args.checkpoint, stage), topology)
    # Full parameters on every rank (stage 3 gathers its shards for the duration of the block).
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=stage == 3):
        full = {k: v.detach().cpu().clone() for k, v in engine.module.state_dict().items()}
    reports = [None] * world_size
    dist.all_gather_object(reports, meter.report(rank))
    metrics = {"stage": stage, "parameters": parameters, "tensors": len(full), "first_step": first_step,
               "train_loss": losses, "step_seconds": seconds / max(1, args.steps - first_step),
               "optimizer": type(engine.optimizer).__name__}
    engine.destroy()
    del engine, model
    gc.collect()
    return metrics, reports, full


def stage_folder(checkpoint, stage):
    return checkpoint / f"stage{stage}"


def average(loss, world_size):
    dist.all_reduce(loss)
    return loss.item() / world_size


# ------------------------------------------------------------------------------------------- memory


class MemoryMeter:
    """Bytes of every tensor alive in this process, and which of them are parameters, master copy, Adam's state.

    DeepSpeed keeps its tensors in flat buffers of its own, so the meter counts storages, not
    tensors: every distinct storage alive (the garbage collector's list, after a collection),
    less what was alive before the model was built. Of those, the parameters are the model's
    (in stage 3 each one's local shard, `ds_tensor`), the master copy is what the wrapped torch
    optimizer steps on, Adam's state is its `state`. The gradients are what DeepSpeed's optimizer
    holds besides those (its attributes named for gradients: partitions, buckets); the rest is
    `other_bytes`: its communication buffers, the batch. Sampled at the end of the last backward
    and of the last step (every buffer is allocated by then); the report is the one with more bytes
    alive.
    """

    def __init__(self):
        self.before = set(alive_tensor_storages())
        self.peak = None

    def sample(self, engine, when):
        gc.collect()  # tensors in reference cycles that nothing can reach any more are not held
        alive = {k: v for k, v in alive_tensor_storages().items() if k not in self.before}
        params = storages(getattr(p, "ds_tensor", p) for p in engine.module.parameters())
        inner = engine.optimizer.optimizer  # the torch optimizer DeepSpeed's ZeRO optimizer wraps
        # Adam's state is keyed by the tensors it steps on (stage 3 swaps them into its param
        # groups only for the step).
        master = storages([p for group in inner.param_groups for p in group["params"]] + list(inner.state))
        master = {k: v for k, v in master.items() if k not in params}
        adam = storages(v for state in inner.state.values() for v in state.values()
                        if torch.is_tensor(v) and v.dim() > 0)  # m and v; the step counter left out
        named = params.keys() | master.keys() | adam.keys()
        grads = {k: v for k, v in storages(gradient_tensors(engine.optimizer)).items() if k not in named}
        counted = {"param_bytes": sum(params.values()), "grad_bytes": sum(grads.values()),
                   "master_bytes": sum(master.values()), "optimizer_bytes": sum(adam.values())}
        total = sum(alive.values())
        sample = {**counted, "other_bytes": max(0, total - sum(counted.values())), "total_bytes": total,
                  "sampled_after": when}
        if self.peak is None or total >= self.peak["total_bytes"]:
            self.peak = sample

    def report(self, rank):
        return {"rank": rank, **self.peak}


def alive_tensor_storages():
    with warnings.catch_warnings():  # looking at every object touches deprecated ones (torch.distributed.reduce_op)
        warnings.simplefilter("ignore", FutureWarning)
        return storages(o for o in gc.get_objects() if torch.is_tensor(o))


def storages(tensors):
    """{storage address: bytes} of tensors with memory (a view and the buffer it views count once)."""
    found = {}
    for tensor in tensors:
        if tensor is None or tensor.device.type == "meta":
            continue
        storage = tensor.untyped_storage()
        if storage.nbytes():
            found[(tensor.device.type, storage.data_ptr())] = storage.nbytes()
    return found


def gradient_tensors(zero_optimizer, depth=3):
    """The tensors DeepSpeed's ZeRO optimizer keeps under attributes named for gradients."""
    found = []

    def walk(value, depth):
        if torch.is_tensor(value):
            found.append(value)
        elif depth and isinstance(value, dict):
            for item in value.values():
                walk(item, depth - 1)
        elif depth and isinstance(value, (list, tuple)):
            for item in value:
                walk(item, depth - 1)
        elif depth and type(value).__module__.startswith("deepspeed") and hasattr(value, "__dict__"):
            for item in vars(value).values():  # e.g. its gradient buckets
                walk(item, depth - 1)

    for name, value in vars(zero_optimizer).items():
        if "grad" in name:
            walk(value, depth)
    return found


def formula_bytes(parameters, stage, world_size):
    """What each rank should hold at this stage, from the bytes per parameter and what the stage shards."""
    n = world_size
    param, grad = parameters * BYTES_PARAM, parameters * BYTES_GRAD
    master, adam = parameters * BYTES_MASTER / n, parameters * BYTES_ADAM / n  # sharded from stage 1 on
    if stage >= 2:
        grad /= n
    if stage == 3:
        param /= n
    return {"param_bytes": param, "grad_bytes": grad, "master_bytes": master, "optimizer_bytes": adam,
            "model_state_bytes": param + master + adam, "total_bytes": param + grad + master + adam}


def check_memory(record, stage, metrics, reports, parameters, world_size):
    expected = formula_bytes(parameters, stage, world_size)
    # Parameters, master copy and Adam's state are counted from tensors DeepSpeed names; they must
    # match the formula. Gradients depend on when and where DeepSpeed reduces them: reported, and
    # checked in tests/test_deepspeed.py against what each stage should keep.
    states = [r["param_bytes"] + r["master_bytes"] + r["optimizer_bytes"] for r in reports]
    worst = max(abs(s - expected["model_state_bytes"]) / expected["model_state_bytes"] for s in states)
    metrics.update(memory_formula_bytes_per_rank=expected, memory_measured_bytes_per_rank=reports,
                   memory_worst_relative_error=worst)
    record.check(f"stage{stage}_memory_matches_formula", worst <= MEMORY_TOLERANCE,
                 detail=f"parameters + master + Adam differ from the formula by at most {worst:.2%} per rank "
                        f"(tolerance {MEMORY_TOLERANCE:.0%})", worst_relative_error=worst, tolerance=MEMORY_TOLERANCE)
    # Whatever is sharded adds up over the ranks to one copy, give or take DeepSpeed's padding of
    # each partition to an even length: nothing lost, nothing held twice.
    sharded = ["master_bytes", "optimizer_bytes"] + (["param_bytes"] if stage == 3 else [])
    per_parameter = {"param_bytes": BYTES_PARAM, "master_bytes": BYTES_MASTER, "optimizer_bytes": BYTES_ADAM}
    extra = {k: sum(r[k] for r in reports) - parameters * per_parameter[k] for k in sharded}
    padding = {k: world_size * metrics["tensors"] * per_parameter[k] for k in sharded}  # at most N-1 per tensor
    record.check(f"stage{stage}_shards_add_up_to_one_copy", all(0 <= extra[k] <= padding[k] for k in sharded),
                 detail="over all ranks, each sharded kind holds one copy"
                        + "".join(f"; {k} {v:+d} bytes" for k, v in extra.items() if v),
                 extra_bytes=extra)


def print_memory(topology, record, stages, world_size):
    mib = 2**20
    formula = {1: f"4 + 4 + 12/{world_size}", 2: f"4 + (4 + 12)/{world_size}", 3: f"(4 + 4 + 12)/{world_size}"}
    say(topology, "memory per rank, MiB (fp32: 4 parameter + 4 gradient + K = 12: master 4, Adam 8 bytes/parameter):")
    say(topology, f"  {'stage':>5} {'rank':>4} {'params':>8} {'grads':>8} {'master':>8} {'adam':>8} {'other':>8} "
                  f"{'total':>8} {'formula':>8}  bytes/parameter")
    for stage in stages:
        metrics = record.metrics["stages"][str(stage)]
        expected = metrics["memory_formula_bytes_per_rank"]["total_bytes"]
        for r in metrics["memory_measured_bytes_per_rank"]:
            kinds = ("param_bytes", "grad_bytes", "master_bytes", "optimizer_bytes", "other_bytes", "total_bytes")
            say(topology, f"  {stage:>5} {r['rank']:>4} " + " ".join(f"{r[k] / mib:8.3f}" for k in kinds)
                + f" {expected / mib:8.3f}  {formula[stage]}")
        checks = record.checks
        say(topology, f"  stage {stage}: {checks[f'stage{stage}_params_match_single_process']['detail']}; "
                      f"{checks[f'stage{stage}_memory_matches_formula']['detail']}")


# -------------------------------------------------------------------------------------------- oracle


def single_process_parameters(args):
    """Every step in one process on the whole global batch: the parameters each stage must end with."""
    torch.manual_seed(args.seed)
    oracle = BlockStack(args.dim, args.hidden, args.layers, args.classes)
    initial = {k: v.clone() for k, v in oracle.state_dict().items()}
    optimizer = torch.optim.Adam(oracle.parameters(), lr=args.lr)
    for step in range(args.steps):
        inputs, labels = synthetic_batch(step, args.global_batch, args.dim, args.classes)
        F.cross_entropy(oracle(inputs), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return initial, oracle.state_dict()


def check_against_single_process(record, stage, metrics, full, oracle):
    initial, expected = oracle
    difference = max((full[k].float() - expected[k]).abs().max().item() for k in expected)
    moved = max((expected[k] - initial[k]).abs().max().item() for k in expected)
    relative = difference / moved
    metrics.update(oracle_max_abs_difference=difference, oracle_parameters_moved=moved,
                   oracle_relative_difference=relative)
    record.check(f"stage{stage}_params_match_single_process", relative <= ORACLE_RTOL,
                 detail=f"parameters differ from a single-process run by at most {difference:.2e}, "
                        f"{relative:.1e} of the {moved:.2e} training moved them (tolerance {ORACLE_RTOL:g})",
                 max_abs_difference=difference, relative_difference=relative, tolerance=ORACLE_RTOL)


# ---------------------------------------------------------------------------------------- checkpoint


def save_checkpoint(engine, folder, topology):
    """DeepSpeed's sharded checkpoint (every rank writes its partitions), then its universal form.

    The sharded form loads only at the world size that wrote it. ds_to_universal rewrites it as
    one file per parameter (its fp32 master and Adam's moments, whole), which DeepSpeed slices
    for any world size on load ("checkpoint": {"load_universal": true}).
    """
    tag = f"global_step{engine.global_steps}"
    engine.save_checkpoint(str(folder), tag=tag)
    dist.barrier()
    if topology.is_rank0:
        to_universal(folder, tag)
    dist.barrier()


def to_universal(folder, tag):
    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

    ds_to_universal(argparse.Namespace(
        input_folder=str(folder / tag), output_folder=str(folder / f"{tag}_universal"), num_extract_workers=1,
        num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=True))
    (folder / "latest_universal").write_text(f"{tag}_universal")


if __name__ == "__main__":
    main()
