"""Sharding: DDP, ZeRO-1 and FSDP2 train the same model; what each rank holds is measured.

DDP keeps a full copy of parameters, gradients and optimizer state on every rank. ZeRO stage 1
(torch's ZeroRedundancyOptimizer over DDP) splits the optimizer state across ranks. FSDP2
(torch.distributed.fsdp.fully_shard) splits all three, and all-gathers each block's parameters
just before it computes. All three take exactly the same steps: the lab replays them in one
process and checks the parameters against it. Adam in fp32 needs 4 (parameter) + 4 (gradient)
+ 8 (two moments) bytes per parameter; the lab counts the bytes each rank really holds and puts
them beside that formula. Checkpoints are sharded (torch.distributed.checkpoint): every rank
writes its own part, and a run resumes them at any world size.

    torchrun --standalone --nproc-per-node 2 labs/fsdp/train.py --strategy fsdp --smoke
    torchrun --standalone --nproc-per-node 2 labs/fsdp/train.py --strategy zero1 --checkpoint ck --steps 10
    torchrun --standalone --nproc-per-node 4 labs/fsdp/train.py --strategy fsdp --checkpoint ck --steps 20 --resume
    torchrun --standalone --nproc-per-node 8 labs/fsdp/train.py --strategy fsdp --backend nccl
"""

import argparse
import gc
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from labs.common import timing
from labs.common.contract import add_contract_args, lab_run
from labs.common.models_small import BlockStack, parameter_count, synthetic_batch, tensor_bytes
from labs.common.process_group import init_torch_distributed
from labs.common.topology import detect_topology, say

STRATEGIES = ("ddp", "zero1", "fsdp")
DIM = 256  # model width
HIDDEN = 1024  # feed-forward width: 4 x DIM, as in GPT-2
LAYERS = 4  # MLP blocks; FSDP shards each block on its own
CLASSES = 16
GLOBAL_BATCH = 64  # samples per step over all ranks: the same at every world size
STEPS = 20
LR = 1e-3  # Adam
SMOKE = {"dim": 64, "hidden": 256, "steps": 5}  # seconds on a CPU
# Bytes per parameter of fp32 training with Adam: parameter, gradient, optimizer state (m and v).
BYTES_PARAM, BYTES_GRAD, BYTES_ADAM = 4, 4, 8
MEMORY_TOLERANCE = 0.10  # measured bytes per rank against the formula
# The oracle: a single process takes the same steps on the whole global batch. The strategies sum
# gradients in another order, and Adam divides each update by sqrt(v), which magnifies rounding in
# elements whose gradient nearly cancels. Measured here (20 steps, default model, world size 2):
# the largest difference is 4.7e-4 of how far training moved the parameters; a rank that skips the
# gradient all-reduce ends 1.3 (130%) away. The check allows 1e-2. Adam cannot see a gradient
# that is summed instead of averaged: its update does not change when the gradient is scaled.
ORACLE_RTOL = 1e-2


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_contract_args(parser, ["gloo", "nccl"], default_backend="nccl" if torch.cuda.is_available() else "gloo")
    parser.add_argument("--strategy", choices=STRATEGIES, default="fsdp",
                        help="ddp: everything replicated; zero1: optimizer state sharded; fsdp: everything sharded")
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
    parser.add_argument("--checkpoint", type=Path, help="sharded checkpoint folder, written at the end of the run")
    parser.add_argument("--resume", action="store_true", help="start from --checkpoint, at any world size")
    args = parser.parse_args(argv)
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

    with lab_run("fsdp", args, topology) as record:
        refuse_bad_input(args, world_size)
        device = init_torch_distributed(args.backend, topology, args.timeout)
        torch.manual_seed(args.seed)  # every rank builds the same initial model
        model = BlockStack(args.dim, args.hidden, args.layers, args.classes).to(device)
        parameters = parameter_count(model)
        model, optimizer = wrap(model, args, device, world_size)

        first_step = 0
        if args.resume:
            first_step = load_checkpoint(args.checkpoint, model, optimizer, args)
        say(topology, f"fsdp: strategy {args.strategy}, {parameters:,} parameters, world size {world_size}, "
                      f"global batch {args.global_batch}, steps {first_step}..{args.steps}, {device}, {args.backend}")

        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        meter = MemoryMeter(model, optimizer, args.strategy)
        per_rank = args.global_batch // world_size
        losses, started = [], timing.now(device)
        for step in range(first_step, args.steps):
            inputs, labels = synthetic_batch(step, args.global_batch, args.dim, args.classes)
            mine = slice(rank * per_rank, (rank + 1) * per_rank)  # this rank's share of the global batch
            loss = F.cross_entropy(model(inputs[mine].to(device)), labels[mine].to(device))
            loss.backward()  # DDP all-reduces gradients here; FSDP reduce-scatters them to their owners
            meter.sample()
            optimizer.step()  # ZeRO-1 then broadcasts each updated parameter from the rank that owns it
            meter.sample()  # the steady state: parameters, gradients and optimizer state all present, last
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())  # no .item() per step: on a GPU it would wait for the queue each step
        seconds = timing.now(device) - started  # once the device has finished the steps' work
        losses = average(losses, world_size)

        if args.checkpoint:
            save_checkpoint(args.checkpoint, model, optimizer, args.strategy, args.steps, topology)
        # Full parameters on rank 0, gathered from the shards: the oracle compares them.
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        reports = [None] * world_size
        dist.all_gather_object(reports, meter.report(rank, device))

        if topology.is_rank0:
            check_against_single_process(record, full, args, first_step)
            check_memory(record, reports, parameters, args.strategy, world_size)
        record.metrics.update(strategy=args.strategy, world_size=world_size, parameters=parameters,
                              first_step=first_step, steps=args.steps, train_loss=losses,
                              step_seconds=seconds / max(1, args.steps - first_step))
        record.ranks = reports
        if topology.is_rank0:
            print_memory(topology, record, reports, args.strategy, world_size)
        # DDP, ZeRO and FSDP hold the process group inside reference cycles. Collect them before
        # destroying it, so gloo's threads stop here and not during interpreter shutdown, where
        # they abort the process ("terminate called without an active exception", 1 run in 4).
        del model, optimizer, meter
        gc.collect()
        dist.destroy_process_group()


def refuse_bad_input(args, world_size):
    """Stop before anything starts or is written: one line naming the fix."""
    if args.global_batch % world_size:
        raise SystemExit(f"error: --global-batch {args.global_batch} does not split over world size {world_size}; "
                         f"choose a multiple of {world_size}")
    if args.checkpoint is not None and not args.resume and args.checkpoint.exists():
        raise SystemExit(f"error: {args.checkpoint} already exists and is never overwritten; "
                         "add --resume to continue it, or choose another --checkpoint")
    if args.resume:
        refuse_another_models_checkpoint(args)


def refuse_another_models_checkpoint(args):
    """Compare the checkpoint's tensor shapes with this model's before loading anything."""
    if not (args.checkpoint / ".metadata").is_file():
        raise SystemExit(f"error: {args.checkpoint} holds no sharded checkpoint (no .metadata file); "
                         "drop --resume or point --checkpoint at a folder this lab wrote")
    saved = dcp.FileSystemReader(str(args.checkpoint)).read_metadata().state_dict_metadata
    with torch.device("meta"):  # shapes only, no memory
        model = BlockStack(args.dim, args.hidden, args.layers, args.classes)
    for name, tensor in model.state_dict().items():
        there = getattr(saved.get(f"model.{name}"), "size", None)
        if there is None or list(there) != list(tensor.shape):
            there = list(there) if there is not None else "missing"
            raise SystemExit(f"error: {args.checkpoint} was saved from another model ({name}: {there} there, "
                             f"{list(tensor.shape)} here); resume with the --dim/--hidden/--layers/--classes "
                             "it was saved with, or drop --resume")
    extra = sorted(k.removeprefix("model.") for k in saved if k.startswith("model."))
    extra = [k for k in extra if k not in model.state_dict()]
    if extra:
        raise SystemExit(f"error: {args.checkpoint} was saved from another model ({extra[0]}: not in this one); "
                         "resume with the --dim/--hidden/--layers/--classes it was saved with, or drop --resume")


def wrap(model, args, device, world_size):
    """The three strategies: what is replicated and what is sharded across the ranks."""
    if args.strategy == "fsdp":
        mesh = init_device_mesh(device.type, (world_size,))
        # One FSDP unit per block: during forward and backward only the block at work is whole
        # (all-gathered just before, freed just after); the root unit holds what is left (the head).
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        # The parameters are now DTensors, each rank holding 1/world_size of every tensor (dim 0);
        # Adam's moments are created alike, so they are sharded too.
        return model, torch.optim.Adam(model.parameters(), lr=args.lr)
    # gradient_as_bucket_view: the gradients live in DDP's all-reduce buckets, not in a second copy.
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True)
    if args.strategy == "zero1":
        # Every rank still gets every gradient (DDP's all-reduce), but keeps Adam's moments for its
        # own 1/world_size of the parameter tensors only, updates those, and broadcasts them.
        return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=args.lr)
    return model, torch.optim.Adam(model.parameters(), lr=args.lr)


def average(losses, world_size):
    """Each step's loss averaged over the ranks: one all-reduce for all steps, after the timed loop."""
    if not losses:
        return []
    summed = torch.stack(losses)
    dist.all_reduce(summed)
    return (summed / world_size).tolist()


# ------------------------------------------------------------------------------------------- memory


class MemoryMeter:
    """Bytes of parameters, gradients and optimizer state this rank holds, counted from the tensors.

    A DTensor counts its local shard only. `peak` is the largest sum seen at the end of a backward
    or of an optimizer step. It leaves out what lives only inside forward and backward: activations,
    DDP's buckets, the block FSDP all-gathers to compute with. On a GPU the caching allocator's
    peak, which holds all of that, is reported too.
    """

    def __init__(self, model, optimizer, strategy):
        self.model = model
        # ZeRO-1's own state lives in its local optimizer, over this rank's share of the parameters.
        self.optimizer = optimizer.optim if strategy == "zero1" else optimizer
        self.steady, self.peak = {}, 0

    def count(self):
        params = list(self.model.parameters())
        return {
            "param_bytes": sum(tensor_bytes(p) for p in params),
            "grad_bytes": sum(tensor_bytes(p.grad) for p in params if p.grad is not None),
            # Adam's moments m and v; its step counter (one scalar per parameter tensor) is left out.
            "optimizer_bytes": sum(tensor_bytes(value) for state in self.optimizer.state.values()
                                   for value in state.values() if torch.is_tensor(value) and value.dim() > 0),
        }

    def sample(self):
        self.steady = self.count()
        self.peak = max(self.peak, sum(self.steady.values()))

    def report(self, rank, device):
        report = {"rank": rank, **self.steady, "total_bytes": sum(self.steady.values()),
                  "peak_counted_bytes": self.peak}
        if device.type == "cuda":
            report["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        return report


def formula_bytes(parameters, strategy, world_size):
    """What each rank should hold, from the bytes per parameter and what the strategy shards."""
    param, grad, adam = parameters * BYTES_PARAM, parameters * BYTES_GRAD, parameters * BYTES_ADAM
    if strategy == "zero1":
        adam /= world_size
    elif strategy == "fsdp":
        param, grad, adam = param / world_size, grad / world_size, adam / world_size
    return {"param_bytes": param, "grad_bytes": grad, "optimizer_bytes": adam, "total_bytes": param + grad + adam}


def check_memory(record, reports, parameters, strategy, world_size):
    expected = formula_bytes(parameters, strategy, world_size)
    worst = max(abs(r["total_bytes"] - expected["total_bytes"]) / expected["total_bytes"] for r in reports)
    record.metrics.update(
        memory_formula_bytes_per_rank=expected,
        memory_measured_bytes_per_rank=[{k: r[k] for k in expected} for r in reports],
        memory_peak_counted_bytes=[r["peak_counted_bytes"] for r in reports],
        memory_worst_relative_error=worst,
    )
    if "peak_allocated_bytes" in reports[0]:
        record.metrics["memory_peak_allocated_bytes"] = [r["peak_allocated_bytes"] for r in reports]
    # Per rank the split can be uneven (ZeRO-1 gives whole tensors to ranks; FSDP's last shard of a
    # tensor whose first dimension does not divide is shorter), but whatever is sharded must add up
    # over the ranks to exactly one copy: nothing lost, nothing held twice.
    sharded = {"ddp": [], "zero1": ["optimizer_bytes"], "fsdp": ["param_bytes", "grad_bytes", "optimizer_bytes"]}
    one_copy = {k: parameters * {"param_bytes": BYTES_PARAM, "grad_bytes": BYTES_GRAD, "optimizer_bytes": BYTES_ADAM}[k]
                for k in sharded[strategy]}
    extra = {k: sum(r[k] for r in reports) - one_copy[k] for k in one_copy}
    record.check("memory_matches_formula", worst <= MEMORY_TOLERANCE,
                 detail=f"largest per-rank difference {worst:.2%} of the formula (tolerance {MEMORY_TOLERANCE:.0%})",
                 worst_relative_error=worst, tolerance=MEMORY_TOLERANCE)
    record.check("shards_add_up_to_one_copy", not any(extra.values()),
                 detail="over all ranks, each sharded kind holds exactly one copy"
                        + "".join(f"; {k} off by {v} bytes" for k, v in extra.items() if v),
                 extra_bytes=extra)


def print_memory(topology, record, reports, strategy, world_size):
    expected = record.metrics["memory_formula_bytes_per_rank"]
    formula = {"ddp": "4 + 4 + 8", "zero1": f"4 + 4 + 8/{world_size}", "fsdp": f"(4 + 4 + 8)/{world_size}"}[strategy]
    mib = 2 ** 20
    say(topology, f"memory per rank ({strategy}, fp32 Adam: {formula} bytes/parameter), MiB:")
    say(topology, f"  {'rank':>4} {'params':>9} {'grads':>9} {'adam':>9} {'total':>9} {'formula':>9} {'peak':>9}")
    for r in reports:
        say(topology, f"  {r['rank']:>4} {r['param_bytes'] / mib:9.3f} {r['grad_bytes'] / mib:9.3f} "
                  f"{r['optimizer_bytes'] / mib:9.3f} {r['total_bytes'] / mib:9.3f} "
                  f"{expected['total_bytes'] / mib:9.3f} {r['peak_counted_bytes'] / mib:9.3f}")
    checks = record.checks
    say(topology, f"  {checks['params_match_single_process']['detail']}")
    say(topology, f"  memory: {checks['memory_matches_formula']['detail']}; "
                  f"{checks['shards_add_up_to_one_copy']['detail']}")


# -------------------------------------------------------------------------------------------- oracle


def check_against_single_process(record, full, args, first_step):
    """Replay every step in one process on the whole global batch; the parameters must agree."""
    torch.manual_seed(args.seed)
    oracle = BlockStack(args.dim, args.hidden, args.layers, args.classes)
    initial = {k: v.clone() for k, v in oracle.state_dict().items()}
    optimizer = torch.optim.Adam(oracle.parameters(), lr=args.lr)
    for step in range(args.steps):
        inputs, labels = synthetic_batch(step, args.global_batch, args.dim, args.classes)
        F.cross_entropy(oracle(inputs), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    expected = oracle.state_dict()
    difference = max((full[k].float() - expected[k]).abs().max().item() for k in expected)
    moved = max((expected[k] - initial[k]).abs().max().item() for k in expected)
    relative = difference / moved
    record.metrics.update(oracle_max_abs_difference=difference, oracle_parameters_moved=moved,
                          oracle_relative_difference=relative)
    record.check("params_match_single_process", relative <= ORACLE_RTOL,
                 detail=f"parameters differ from a single-process run by at most {difference:.2e}, "
                        f"{relative:.1e} of the {moved:.2e} training moved them (tolerance {ORACLE_RTOL:g})",
                 max_abs_difference=difference, relative_difference=relative, tolerance=ORACLE_RTOL)


# ---------------------------------------------------------------------------------------- checkpoint


def training_state(model, optimizer, strategy):
    """Model and optimizer in DCP's form: keyed by parameter name, so any world size can load them.

    A DTensor (FSDP) is saved as the shards the ranks hold; a replicated tensor (DDP) once. For
    ZeRO-1 each rank gives its own optimizer's state, which covers only the parameters it owns.
    """
    local = optimizer.optim if strategy == "zero1" else optimizer
    model_state, optim_state = get_state_dict(model, local,
                                              options=StateDictOptions(flatten_optimizer_state_dict=True))
    return {"model": model_state, "optim": optim_state}


def save_checkpoint(path, model, optimizer, strategy, step, topology):
    state = training_state(model, optimizer, strategy)
    state["progress"] = {"step": torch.tensor(step)}
    # Written beside the old checkpoint, then swapped in: a crash mid-write leaves the old one whole.
    saving = path.with_name(path.name + ".saving")
    if topology.is_rank0 and saving.exists():
        shutil.rmtree(saving)
    dist.barrier()
    dcp.save(state, checkpoint_id=str(saving))  # every rank writes its own file; rank 0 the metadata
    dist.barrier()
    if topology.is_rank0:
        old = path.with_name(path.name + ".old")
        if path.exists():
            path.rename(old)
        saving.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def load_checkpoint(path, model, optimizer, args):
    """Every rank reads the parts of the saved tensors it needs now: DCP reshards to this world size."""
    state = training_state(model, optimizer, args.strategy)  # the template: names, shapes, shards wanted
    state["progress"] = {"step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=str(path))
    local = optimizer.optim if args.strategy == "zero1" else optimizer
    set_state_dict(model, local, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=StateDictOptions(flatten_optimizer_state_dict=True))
    step = int(state["progress"]["step"])
    if step >= args.steps:
        raise SystemExit(f"error: {path} is already at step {step}; resume with --steps above {step}")
    return step


if __name__ == "__main__":
    main()
