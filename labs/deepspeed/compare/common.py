"""What every program of the comparison shares, so that a diff against single.py shows what a tool adds.

`distlab compare` (harness/commands/compare.py) runs single.py's model (labs/fsdp's, from labs/common) with
each tool: ddp.py, horovod_train.py, zero1.py, fsdp2.py, deepspeed_zero.py. They take the same
steps on the same global batch; each measures its step time and the bytes of tensors alive on
every rank, the same way, and rank 0 writes the record.
"""

from __future__ import annotations

import argparse
import gc
import time
import warnings

import torch

from labs.common.contract import add_contract_args
from labs.common.models_small import BlockStack, synthetic_batch

DIM, HIDDEN, LAYERS, CLASSES = 256, 1024, 4, 16  # labs/fsdp/train.py's model
GLOBAL_BATCH = 64  # samples per step over all ranks: the same at every world size, for every tool
STEPS = 12
SMOKE = {"dim": 64, "hidden": 256, "steps": 6}
WARMUP = 2  # steps left out of the step time: the first allocate buffers, the first all-gathers
LR = 1e-3


def parse_args(description: str, backends: list[str], default_backend: str, argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    add_contract_args(parser, backends, default_backend)
    parser.add_argument("--dim", type=int, help=f"model width (default {DIM}; {SMOKE['dim']} with --smoke)")
    parser.add_argument("--hidden", type=int,
                        help=f"feed-forward width (default {HIDDEN}; {SMOKE['hidden']} with --smoke)")
    parser.add_argument("--global-batch", type=int, default=GLOBAL_BATCH, help="samples per step over all ranks")
    parser.add_argument("--steps", type=int, help=f"optimizer steps (default {STEPS}; {SMOKE['steps']} with --smoke)")
    parser.add_argument("--stage", type=int, choices=(1, 2, 3), default=1, help="ZeRO stage (deepspeed_zero.py)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: this local rank's GPU")
    args = parser.parse_args(argv)
    for name, value in {"dim": DIM, "hidden": HIDDEN, "steps": STEPS}.items():
        if getattr(args, name) is None:
            setattr(args, name, SMOKE[name] if args.smoke else value)
    if args.steps <= WARMUP:
        parser.error(f"--steps must be more than the {WARMUP} warm-up steps")
    if args.dim < 1 or args.hidden < 1 or args.global_batch < 1:
        parser.error("--dim, --hidden and --global-batch must be at least 1")
    return args


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(args.seed)  # every rank builds the same initial model
    return BlockStack(args.dim, args.hidden, LAYERS, CLASSES)


def device_for(args: argparse.Namespace, local_rank: int = 0) -> torch.device:
    """This rank's device: the GPU of its local rank with --device cuda, else the CPU."""
    if args.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("error: --device cuda needs a GPU and none is visible; use --device cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def batch(step: int, args: argparse.Namespace, device: torch.device, rank: int = 0, world_size: int = 1):
    """This rank's share of step's global batch, on its device."""
    if args.global_batch % world_size:
        raise SystemExit(f"error: --global-batch {args.global_batch} does not split over world size {world_size}; "
                         f"choose a multiple of {world_size}")
    inputs, labels = synthetic_batch(step, args.global_batch, args.dim, CLASSES)
    per_rank = args.global_batch // world_size
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    return inputs[mine].to(device), labels[mine].to(device)


class Meter:
    """Step times after the warm-up, and the bytes of every tensor alive at the last step's peaks.

    Every distinct tensor storage the garbage collector can list (a DTensor by its local shard),
    less what was alive before the model was built: parameters, gradients, optimizer state and the
    tool's own buffers alike, whoever holds them. Sampled after the last backward and the last
    step, outside the clock (a census takes about a second with DeepSpeed loaded).
    """

    def __init__(self, steps: int, device: torch.device) -> None:
        self.steps, self.times, self.peak, self.device = steps, [], 0, device
        self.before = set(alive())

    def start(self, step: int) -> None:
        self.step, self.started = step, time.perf_counter()

    def sample(self) -> None:
        if self.step == self.steps - 1:
            paused = time.perf_counter()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.peak = max(self.peak, sum(v for k, v in alive().items() if k not in self.before))
            self.started += time.perf_counter() - paused

    def stop(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the step's kernels are done, not just queued
        if self.step >= WARMUP:
            self.times.append(time.perf_counter() - self.started)

    def metrics(self, args: argparse.Namespace, peaks: list[int], losses: list[float]) -> dict:
        seconds = sum(self.times) / len(self.times)
        return {"step_seconds": seconds, "samples_per_second": args.global_batch / seconds,
                "peak_tensor_bytes_per_rank": peaks, "train_loss": losses, "steps": self.steps,
                "global_batch": args.global_batch,
                "parameters": sum(p.numel() for p in build_model(args).parameters())}


def alive() -> dict[int, int]:
    gc.collect()
    found = {}
    with warnings.catch_warnings():  # looking at every object touches deprecated ones
        warnings.simplefilter("ignore", FutureWarning)
        for obj in gc.get_objects():
            if torch.is_tensor(obj) and obj.device.type != "meta":
                local = obj.to_local() if hasattr(obj, "to_local") else obj
                storage = local.untyped_storage()
                found[(storage.device.type, storage.data_ptr())] = storage.nbytes()
    return found
