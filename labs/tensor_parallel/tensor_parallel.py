"""Tensor parallelism: one transformer MLP block split across ranks, Megatron-style.

The block is x + down(gelu(up(norm(x)))). Megatron-LM (Shoeybi et al., 2019) splits `up` by
columns (each rank computes its own slice of the hidden layer: no communication, GELU works on
it elementwise) and `down` by rows (each rank multiplies its slice of the hidden layer by its
rows of `down`, giving a partial sum of the output): one all-reduce in forward adds the partial
sums, and its mirror in backward adds the ranks' contributions to the input's gradient.

The lab splits the block twice: with DTensor (parallelize_module, ColwiseParallel,
RowwiseParallel), which hides the collectives, and by hand with one explicit dist.all_reduce in
forward. Both must reproduce the single-process block, forward and backward.

    torchrun --standalone --nproc-per-node 2 labs/tensor_parallel/tensor_parallel.py --smoke
    torchrun --standalone --nproc-per-node 8 labs/tensor_parallel/tensor_parallel.py --backend nccl
"""

import argparse
import copy
import gc

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from labs.common import timing
from labs.common.contract import add_contract_args, lab_run
from labs.common.models_small import MLPBlock, tensor_bytes
from labs.common.process_group import init_torch_distributed
from labs.common.topology import detect_topology, say

DIM = 1024  # model width
HIDDEN = 4096  # feed-forward width, 4 x DIM as in GPT: the dimension the ranks split
TOKENS = 64  # rows of the input (batch x sequence, flattened)
SMOKE = {"dim": 64, "hidden": 256}
REPEATS = 5  # timed forward+backward passes of each version, after one untimed
# The split versions add the output's partial sums (and the input gradient's) in another order
# than one matrix multiply does: float32 rounding, relative to the largest value compared. Measured
# here at world size 2: at most 3.5e-7 (default and smoke sizes); without the backward all-reduce
# the LayerNorm's gradient is 0.86 off.
RTOL = 1e-5


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_contract_args(parser, ["gloo", "nccl"], default_backend="nccl" if torch.cuda.is_available() else "gloo")
    parser.add_argument("--dim", type=int, help=f"model width (default {DIM}; {SMOKE['dim']} with --smoke)")
    parser.add_argument("--hidden", type=int,
                        help=f"feed-forward width, split across ranks (default {HIDDEN}; {SMOKE['hidden']} "
                             "with --smoke)")
    parser.add_argument("--tokens", type=int, default=TOKENS, help=f"input rows (default {TOKENS})")
    args = parser.parse_args(argv)
    args.dim = args.dim or (SMOKE["dim"] if args.smoke else DIM)
    args.hidden = args.hidden or (SMOKE["hidden"] if args.smoke else HIDDEN)
    for name in ("dim", "hidden", "tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    topology = detect_topology()
    rank, world_size = topology.rank, topology.world_size

    with lab_run("tensor_parallel", args, topology) as record:
        if args.hidden % world_size:
            raise SystemExit(f"error: --hidden {args.hidden} does not divide over world size {world_size}: each rank "
                             f"holds hidden/world_size columns; choose --hidden a multiple of {world_size}")
        device = init_torch_distributed(args.backend, topology, args.timeout)
        torch.manual_seed(args.seed)  # every rank builds the same block, input and target
        block = MLPBlock(args.dim, args.hidden).to(device)
        inputs = torch.randn(args.tokens, args.dim, device=device)
        target = torch.randn(args.tokens, args.dim, device=device)
        say(topology, f"tensor_parallel: MLP block {args.dim} -> {args.hidden} -> {args.dim}, {args.tokens} tokens, "
                      f"world size {world_size}, {device}, {args.backend}")

        expected = forward_backward(copy.deepcopy(block), inputs, target)

        mesh = init_device_mesh(device.type, (world_size,))
        with_dtensor = parallelize_module(copy.deepcopy(block), mesh, {"up": ColwiseParallel(),
                                                                       "down": RowwiseParallel()})
        by_hand = MegatronMLP(block, rank, world_size)
        for name, model in [("dtensor", with_dtensor), ("by_hand", by_hand)]:
            got = forward_backward(model, inputs, target)
            if name == "by_hand":  # each rank has its slice of up/down's gradients: compare the slice
                expected_here = by_hand.slice_like_this_rank(expected)
            else:  # DTensor gradients of up/down are sharded too: gather them whole
                got["grads"] = {k: full_tensor(g) for k, g in got["grads"].items()}
                expected_here = expected
            compare(record, name, got, expected_here)
            record.metrics[f"{name}_param_bytes_per_rank"] = sum(tensor_bytes(p) for p in model.parameters())
            record.metrics[f"{name}_seconds_per_pass"] = time_passes(model, inputs, target, device)
        record.metrics["single_process_param_bytes"] = sum(tensor_bytes(p) for p in block.parameters())
        record.metrics["single_process_seconds_per_pass"] = time_passes(block, inputs, target, device)
        # Forward sends one all-reduce of the block's output, backward one of the input's gradient.
        record.metrics["allreduce_bytes_per_pass"] = 2 * inputs.numel() * inputs.element_size()
        record.metrics["world_size"] = world_size

        for name in ("dtensor", "by_hand"):
            say(topology, f"  {name:8s} {record.checks[f'{name}_matches_single_process']['detail']}")
        say(topology, f"  parameters per rank {record.metrics['by_hand_param_bytes_per_rank'] / 2**20:.2f} MiB "
                      f"of {record.metrics['single_process_param_bytes'] / 2**20:.2f} MiB; "
                      f"all-reduced per forward+backward {record.metrics['allreduce_bytes_per_pass'] / 2**10:.0f} KiB")
        say(topology, "  seconds per forward+backward: " + ", ".join(
            f"{name} {record.metrics[f'{name}_seconds_per_pass']:.4f}"
            for name in ("single_process", "dtensor", "by_hand")))
        # The device mesh and the DTensor module hold the process group inside reference cycles:
        # collect them before destroying the group, or gloo's threads may abort the process at exit.
        del mesh, with_dtensor, by_hand, model
        gc.collect()
        dist.destroy_process_group()


def forward_backward(model, inputs, target):
    """Output, loss, and the gradients of the input and of every parameter, by name."""
    inputs = inputs.clone().requires_grad_()
    output = model(inputs)
    loss = F.mse_loss(output, target)
    loss.backward()
    return {"output": output.detach(), "loss": loss.detach(), "input_grad": inputs.grad,
            "grads": {name: p.grad for name, p in model.named_parameters()}}


def full_tensor(tensor):
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def compare(record, name, got, expected):
    """Largest difference over all ranks, relative to the largest expected value, of each quantity."""
    pairs = {"output": (got["output"], expected["output"]), "loss": (got["loss"], expected["loss"]),
             "input_grad": (got["input_grad"], expected["input_grad"]),
             **{f"grad {k}": (got["grads"][k], expected["grads"][k]) for k in expected["grads"]}}
    # Stacked on the rank's device, where the tensors are: an NCCL group refuses a CPU tensor ("No
    # backend type associated with device type cpu"), and no .item() per pair waits for the GPU.
    errors = torch.stack([((a - b).abs().max() / b.abs().max()).float() for a, b in pairs.values()])
    dist.all_reduce(errors, op=dist.ReduceOp.MAX)  # every rank checked its own slices
    worst = errors.max().item()
    worst_of = list(pairs)[errors.argmax().item()]
    record.metrics[f"{name}_max_relative_difference"] = dict(zip(pairs, errors.tolist(), strict=True))
    record.check(f"{name}_matches_single_process", worst <= RTOL,
                 detail=f"output, loss and all gradients within {worst:.1e} of the single-process block "
                        f"(worst: {worst_of}; tolerance {RTOL:g} relative)",
                 max_relative_difference=worst, tolerance=RTOL)


def time_passes(model, inputs, target, device):
    forward_backward(model, inputs, target)  # warm-up
    started = timing.now(device)  # readings of finished work: on a GPU, not the kernels' launch
    for _ in range(REPEATS):
        forward_backward(model, inputs, target)
    return (timing.now(device) - started) / REPEATS


# --------------------------------------------------------------------------------------- by hand


class AllReduceInForward(torch.autograd.Function):
    """Megatron's g: sum the ranks' partial outputs. Backward passes the gradient through: every
    partial sum entered the total with weight one."""

    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)  # THE collective of tensor parallelism, which RowwiseParallel hides
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


class AllReduceInBackward(torch.autograd.Function):
    """Megatron's f, g's mirror: the input goes to every rank's slice unchanged, so its gradient is
    the sum of what each slice sends back."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class MegatronMLP(nn.Module):
    """The block split by hand: this rank holds hidden units [r*h/p, (r+1)*h/p) of up and down."""

    def __init__(self, block, rank, world_size):
        super().__init__()
        width = block.up.out_features // world_size
        self.mine = slice(rank * width, (rank + 1) * width)
        self.norm = copy.deepcopy(block.norm)  # replicated: every rank normalises the whole input
        self.up_weight = nn.Parameter(block.up.weight.detach()[self.mine].clone())  # rows of W1: columns of x W1^T
        self.up_bias = nn.Parameter(block.up.bias.detach()[self.mine].clone())
        self.down_weight = nn.Parameter(block.down.weight.detach()[:, self.mine].clone())  # the matching columns
        self.down_bias = nn.Parameter(block.down.bias.detach().clone())  # added once, to the sum

    def forward(self, x):
        h = AllReduceInBackward.apply(self.norm(x))
        h = F.gelu(F.linear(h, self.up_weight, self.up_bias))  # this rank's slice of the hidden layer
        partial = F.linear(h, self.down_weight)  # this rank's share of the output
        return x + AllReduceInForward.apply(partial) + self.down_bias

    def slice_like_this_rank(self, expected):
        """The single-process gradients, cut the way this rank holds its parameters."""
        grads = expected["grads"]
        mine = {"norm.weight": grads["norm.weight"], "norm.bias": grads["norm.bias"],
                "up_weight": grads["up.weight"][self.mine], "up_bias": grads["up.bias"][self.mine],
                "down_weight": grads["down.weight"][:, self.mine], "down_bias": grads["down.bias"]}
        return {**expected, "grads": mine}


if __name__ == "__main__":
    main()
