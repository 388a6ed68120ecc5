"""Pipeline parallelism: the model cut into stages, one per rank, fed with micro-batches (GPipe).

Rank r holds layers [r*L/S, (r+1)*L/S) of the L-layer model (S = world size; the last stage also
the head and the loss). The batch is cut into M micro-batches. GPipe (Huang et al., 2019) runs
all M forwards, each stage passing activations on to the next, then all M backwards, passing
gradients back, and steps once. Stage r can start only when stage r-1 has sent it something: at
the beginning and at the end of each phase some stages wait. That idle time, the bubble, is
(S - 1) / (M + S - 1) of a step when every stage takes the same time. The lab measures it.

Two implementations of the same schedule: `--schedule manual` with dist.send/recv written out,
and `--schedule torch` with torch.distributed.pipelining's ScheduleGPipe (works on CPU with gloo,
measured here with torch 2.14). Both must reproduce, bit for bit, the single-process model
trained on the same micro-batches.

    torchrun --standalone --nproc-per-node 2 labs/pipeline/pipeline.py --smoke
    torchrun --standalone --nproc-per-node 2 labs/pipeline/pipeline.py --schedule torch --micro-batches 16
    torchrun --standalone --nproc-per-node 4 labs/pipeline/pipeline.py --backend nccl
"""

import argparse
import copy
import gc
import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labs.common import timing
from labs.common.contract import add_contract_args, lab_run
from labs.common.models_small import BlockStack, synthetic_batch
from labs.common.process_group import init_torch_distributed
from labs.common.topology import detect_topology, say

DIM = 512  # model width: the activation passed between stages is micro-batch x DIM
HIDDEN = 2048  # feed-forward width
LAYERS = 8  # MLP blocks, cut into world-size stages
CLASSES = 16
BATCH = 128  # samples per step
MICRO_BATCHES = 8  # GPipe's M: more micro-batches, a smaller bubble
STEPS = 5  # the first one is a warm-up, left out of the timing
LR = 0.05  # SGD
SMOKE = {"dim": 256, "hidden": 1024, "layers": 4, "batch": 64, "micro_batches": 4, "steps": 3}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_contract_args(parser, ["gloo", "nccl"], default_backend="nccl" if torch.cuda.is_available() else "gloo")
    parser.add_argument("--schedule", choices=["manual", "torch"], default="manual",
                        help="manual: send/recv written out; torch: torch.distributed.pipelining.ScheduleGPipe")
    for name, default in [("dim", DIM), ("hidden", HIDDEN), ("layers", LAYERS), ("batch", BATCH),
                          ("micro_batches", MICRO_BATCHES), ("steps", STEPS)]:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int,
                            help=f"default {default}; {SMOKE[name]} with --smoke")
    parser.add_argument("--classes", type=int, default=CLASSES, help=f"output classes (default {CLASSES})")
    parser.add_argument("--lr", type=float, default=LR, help=f"SGD learning rate (default {LR})")
    args = parser.parse_args(argv)
    for name, default in [("dim", DIM), ("hidden", HIDDEN), ("layers", LAYERS), ("batch", BATCH),
                          ("micro_batches", MICRO_BATCHES), ("steps", STEPS)]:
        if getattr(args, name) is None:
            setattr(args, name, SMOKE[name] if args.smoke else default)
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.batch % args.micro_batches:
        parser.error(f"--batch {args.batch} does not split into --micro-batches {args.micro_batches}; "
                     f"choose a batch that is a multiple of {args.micro_batches}")
    return args


def main(argv=None):
    args = parse_args(argv)
    topology = detect_topology()
    rank, stages = topology.rank, topology.world_size

    with lab_run("pipeline", args, topology) as record:
        refuse_bad_input(args, stages)
        device = init_torch_distributed(args.backend, topology, args.timeout)
        torch.manual_seed(args.seed)  # every rank builds the same whole model, then keeps its stage
        whole = BlockStack(args.dim, args.hidden, args.layers, args.classes).to(device)
        oracle = copy.deepcopy(whole)
        stage = TimedStage(stage_layers(whole, rank, stages))
        optimizer = torch.optim.SGD(stage.parameters(), lr=args.lr)
        run_step = gpipe_step_manual if args.schedule == "manual" else gpipe_step_torch(stage, args, rank, stages,
                                                                                        device)
        say(topology, f"pipeline: {args.layers} blocks in {stages} stages of {args.layers // stages}, "
                      f"batch {args.batch} in {args.micro_batches} micro-batches, schedule {args.schedule}, "
                      f"{device}, {args.backend}")

        losses, bubbles, step_seconds, durations = [], [], [], []
        for step in range(args.steps):
            inputs, labels = synthetic_batch(step, args.batch, args.dim, args.classes)
            optimizer.zero_grad(set_to_none=True)
            stage.reset()
            inputs, labels = inputs.to(device), labels.to(device)
            timing.synchronize(device)  # the copies are not the step's
            dist.barrier()  # every stage starts the step together: the clock starts with the pipeline
            started = timing.now(device)
            micro_losses = run_step(stage, inputs, labels, args, rank, stages)
            # On the rank's device: an NCCL group refuses a CPU tensor ("No backend type associated
            # with device type cpu"); the clock read after the GPU has finished the step's work.
            seconds = torch.tensor(timing.now(device) - started, device=device)
            # The step lasts until the last stage is done: a stage that finished early is idle till then.
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            # Gradients were summed over micro-batches; divide once, as torch's ScheduleGPipe does.
            for p in stage.parameters():
                p.grad.div_(args.micro_batches)
            optimizer.step()
            losses.append(sum(micro_losses) / args.micro_batches if micro_losses else None)
            bubbles.append(1 - stage.busy_seconds / seconds.item())
            step_seconds.append(seconds.item())
            durations.append((stage.forward_seconds, stage.backward_seconds))

        # Rank 0 gathers every stage's account; the last stage has the losses.
        timed = slice(1, None) if args.steps > 1 else slice(None)  # the first step warms up (allocations, links)
        mine = {"rank": rank, "bubble": statistics.mean(bubbles[timed]), "losses": losses, "durations": durations,
                "exact": compare_with_single_process(stage, oracle, args, rank, stages, losses, device)}
        reports = [None] * stages
        dist.all_gather_object(reports, mine)
        report(record, reports, step_seconds[timed], args, stages, topology)
        # torch's pipeline schedule holds the process group inside reference cycles: collect it
        # before destroying the group, or gloo's threads may abort the process at interpreter exit.
        del run_step, stage, optimizer
        gc.collect()
        dist.destroy_process_group()


def refuse_bad_input(args, stages):
    """Stop before anything starts: one line naming the fix."""
    if args.layers % stages:
        raise SystemExit(f"error: --layers {args.layers} does not divide into {stages} stages (world size); "
                         f"choose --layers a multiple of {stages} or another world size")
    if args.micro_batches < stages:
        raise SystemExit(f"error: --micro-batches {args.micro_batches} is fewer than the {stages} stages: the last "
                         f"stage would get nothing to do while the first is busy; use at least {stages} "
                         "(more micro-batches make the bubble smaller)")


def stage_layers(whole, rank, stages):
    """This rank's contiguous slice of the blocks; the last stage also holds the head."""
    per_stage = len(whole.blocks) // stages
    layers = list(whole.blocks[rank * per_stage:(rank + 1) * per_stage])
    if rank == stages - 1:
        layers.append(whole.head)
    return nn.Sequential(*layers)


# ------------------------------------------------------------------------------------ the schedules


def gpipe_step_manual(stage, inputs, labels, args, rank, stages):
    """GPipe by hand: M forwards, then M backwards; activations go forward, their gradients back.

    Sends are asynchronous (isend), so a stage goes on computing while the next one receives;
    receives block, and that waiting is the bubble. Returns the micro-batch losses (last stage).
    """
    first, last = rank == 0, rank == stages - 1
    micro_inputs, micro_labels = inputs.chunk(args.micro_batches), labels.chunk(args.micro_batches)
    shape = micro_inputs[0].shape  # every block keeps the width: one activation shape everywhere
    received, outputs, sends, losses = [], [], [], []
    for i in range(args.micro_batches):
        if first:
            x = micro_inputs[i]
        else:
            x = torch.empty(shape, device=inputs.device)
            dist.recv(x, src=rank - 1)
            x.requires_grad_()  # its gradient is what this stage sends back in the backward phase
        y = stage(x)
        if last:
            y = F.cross_entropy(y, micro_labels[i])
            losses.append(y.detach())  # no .item() here: on a GPU it would wait for the queue every micro-batch
        else:
            sends.append(dist.isend(y.detach(), dst=rank + 1))
        received.append(x)
        outputs.append(y)
    for i in range(args.micro_batches):
        if last:
            grad = None  # the loss: d loss / d loss = 1
        else:
            grad = torch.empty(shape, device=inputs.device)
            dist.recv(grad, src=rank + 1)
        torch.autograd.backward(outputs[i], grad)
        if not first:
            sends.append(dist.isend(received[i].grad, dst=rank - 1))
    for send in sends:
        send.wait()
    return torch.stack(losses).tolist() if losses else []


def gpipe_step_torch(stage, args, rank, stages, device):
    """The same schedule from torch.distributed.pipelining: it splits the batch and moves the tensors."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    pipeline_stage = PipelineStage(stage, rank, stages, device)
    # scale_grads=False: the training loop divides by M itself, the same for both schedules.
    schedule = ScheduleGPipe(pipeline_stage, n_microbatches=args.micro_batches, loss_fn=F.cross_entropy,
                             scale_grads=False)

    def step(stage, inputs, labels, args, rank, stages):
        losses = []
        if rank == 0:
            schedule.step(inputs, target=labels if stages == 1 else None, losses=losses)
        elif rank == stages - 1:
            schedule.step(target=labels, losses=losses)
        else:
            schedule.step()
        return [loss.item() for loss in losses]

    return step


# ----------------------------------------------------------------------------------------- timing


class TimedStage(nn.Module):
    """A stage's layers with a stopwatch on their compute, forward and backward.

    Busy time is all this stage computes; the rest of a step it waits for a neighbour (or for
    the last stage to finish): the bubble, plus whatever the sends and receives themselves cost.
    """

    def __init__(self, layers):
        super().__init__()
        self.layers = layers
        self.reset()

    def reset(self):
        self.forward_seconds, self.backward_seconds = [], []  # one per micro-batch, in order

    @property
    def busy_seconds(self):
        return sum(self.forward_seconds) + sum(self.backward_seconds)

    def forward(self, x):
        # Every reading waits for the device (timing.now): on a GPU the stopwatch would otherwise
        # time the kernels' launch, and the bubble would be launch time, not compute.
        started = timing.now(x.device)
        if not x.requires_grad:  # the first stage's input: so that the backward stopwatch below runs
            x = x.detach().requires_grad_()
        y = _StopwatchEnd.apply(self.layers(_StopwatchStart.apply(x, self)), self)
        self.forward_seconds.append(timing.now(x.device) - started)
        return y


class _StopwatchEnd(torch.autograd.Function):
    """Sits on the stage's output: its backward runs first in the stage's backward."""

    @staticmethod
    def forward(ctx, y, stage):
        ctx.stage = stage
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        ctx.stage.backward_started = timing.now(grad.device)
        return grad, None


class _StopwatchStart(torch.autograd.Function):
    """Sits on the stage's input: its backward runs last."""

    @staticmethod
    def forward(ctx, x, stage):
        ctx.stage = stage
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.stage.backward_seconds.append(timing.now(grad.device) - ctx.stage.backward_started)
        return grad, None


# ----------------------------------------------------------------------------------------- checks


def compare_with_single_process(stage, oracle, args, rank, stages, losses, device):
    """Train the whole model in one process on the same micro-batches; this stage must match it exactly."""
    optimizer = torch.optim.SGD(oracle.parameters(), lr=args.lr)
    oracle_losses = []
    for step in range(args.steps):
        inputs, labels = synthetic_batch(step, args.batch, args.dim, args.classes)
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for x, y in zip(inputs.to(device).chunk(args.micro_batches), labels.to(device).chunk(args.micro_batches),
                        strict=True):
            loss = F.cross_entropy(oracle(x), y)
            loss.backward()
            total += loss.item()
        for p in oracle.parameters():
            p.grad.div_(args.micro_batches)
        optimizer.step()
        oracle_losses.append(total / args.micro_batches)
    mine = list(stage_layers(oracle, rank, stages).parameters())
    ours = list(stage.parameters())
    return {
        "param_max_abs_difference": max((a - b).abs().max().item() for a, b in zip(ours, mine, strict=True)),
        "grad_max_abs_difference": max((a.grad - b.grad).abs().max().item() for a, b in zip(ours, mine, strict=True)),
        "loss_max_abs_difference": (max(abs(a - b) for a, b in zip(losses, oracle_losses, strict=True))
                                    if rank == stages - 1 else 0.0),
    }


def bubble_from_durations(forward, backward):
    """Each stage's idle fraction of a step if only GPipe's order made stages wait.

    forward[r][i], backward[r][i]: the seconds stage r computed micro-batch i. A stage's forward of
    micro-batch i starts when its previous forward is done and stage r-1 has sent it i; its
    backward phase starts after all its forwards, each backward when stage r+1 has sent i's
    gradient. Sending is free here, and every stage has a core to itself: this is the bubble the
    schedule itself costs with these compute times, what (S-1)/(M+S-1) gives when all are equal.
    """
    stages, micro_batches = len(forward), len(forward[0])
    forward_end = [[0.0] * micro_batches for _ in range(stages)]
    for r in range(stages):
        for i in range(micro_batches):
            ready = max(forward_end[r - 1][i] if r else 0.0, forward_end[r][i - 1] if i else 0.0)
            forward_end[r][i] = ready + forward[r][i]
    backward_end = [[0.0] * micro_batches for _ in range(stages)]
    for r in reversed(range(stages)):
        for i in range(micro_batches):
            ready = max(backward_end[r + 1][i] if r < stages - 1 else 0.0,
                        backward_end[r][i - 1] if i else forward_end[r][-1])
            backward_end[r][i] = ready + backward[r][i]
    step = max(ends[-1] for ends in backward_end)
    return [1 - (sum(forward[r]) + sum(backward[r])) / step for r in range(stages)]


def report(record, reports, step_seconds, args, stages, topology):
    formula = (stages - 1) / (args.micro_batches + stages - 1)
    measured = statistics.mean(r["bubble"] for r in reports)
    timed = range(1, args.steps) if args.steps > 1 else range(args.steps)
    from_durations = statistics.mean(statistics.mean(bubble_from_durations(
        [r["durations"][t][0] for r in reports], [r["durations"][t][1] for r in reports])) for t in timed)
    worst = {k: max(r["exact"][k] for r in reports) for k in reports[0]["exact"]}
    record.metrics.update(
        world_size=stages, stages=stages, micro_batches=args.micro_batches, schedule=args.schedule,
        bubble_fraction=measured, bubble_fraction_formula=formula, bubble_fraction_schedule=from_durations,
        bubble_fraction_per_stage=[r["bubble"] for r in reports],
        step_seconds=statistics.mean(step_seconds), train_loss=reports[-1]["losses"], **worst,
    )
    record.ranks = [{"rank": r["rank"], "bubble": r["bubble"], "busy_seconds_per_step": statistics.mean(
        sum(r["durations"][t][0]) + sum(r["durations"][t][1]) for t in timed), **r["exact"]} for r in reports]
    record.check("matches_single_process", not any(worst.values()),
                 detail="losses, gradients and parameters "
                        + ("bit for bit equal to" if not any(worst.values()) else f"differ ({worst}) from")
                        + f" the single-process model after {args.steps} steps",
                 **worst)
    say(topology, "  stage  bubble (idle / step time)")
    for r in reports:
        say(topology, f"  {r['rank']:>5}  {r['bubble']:.3f}")
    say(topology, f"  bubble: formula (S-1)/(M+S-1) = ({stages}-1)/({args.micro_batches}+{stages}-1) = {formula:.3f}; "
                  f"from the measured compute times and GPipe's order {from_durations:.3f}; "
                  f"measured by the clock {measured:.3f} (step {record.metrics['step_seconds']:.3f} s)")
    say(topology, "  (clock minus schedule: sending, receiving, and waiting for a CPU)")
    say(topology, f"  {record.checks['matches_single_process']['detail']}")


if __name__ == "__main__":
    main()
