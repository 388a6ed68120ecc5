"""Picking the tool: memory per GPU of each way to split a training run, what fits, what to use.

The arithmetic behind `distlab plan` (harness/commands/plan.py).

The model states (the ZeRO paper's name: Rajbhandari et al., 2020) per parameter:

    bf16/fp16 mixed precision      fp32
    2  parameter (16-bit)          4  parameter
    2  gradient (16-bit)           4  gradient
    4  master copy (fp32)          -  (the parameter is the master)
    8  Adam m and v (fp32)         8  Adam m and v
    = 16 bytes/parameter           = 16 bytes/parameter
(SGD with momentum keeps 4 bytes instead of Adam's 8, plain SGD none.)

Per GPU, with N GPUs (data parallel degree N for DDP and ZeRO):
    DDP              everything replicated               (p + g + master + opt)
    ZeRO-1           optimizer states sharded            p + g + (master + opt)/N
    ZeRO-2           ... and gradients                   p + (g + master + opt)/N
    ZeRO-3 / FSDP    ... and parameters                  (p + g + master + opt)/N
    tensor parallel  every layer split t = min(N, 8) ways (p + g + master + opt)/t, activations ~/t;
                     inside a node, data parallel over the N/t nodes
    pipeline         N stages of layers/N each           (p + g + master + opt)/N
Which tool does which (the table's `tools` column): ZeRO-1 is DeepSpeed stage 1 or torch's
ZeroRedundancyOptimizer, ZeRO-2 DeepSpeed stage 2 or FSDP2 without resharding after forward,
ZeRO-3 DeepSpeed stage 3 or FSDP2 (labs/fsdp, labs/deepspeed measure them). DeepSpeed keeps its fp32
master partition even for an fp32 model (4 bytes/parameter more, sharded from stage 1; measured
in labs/deepspeed): `model_state_bytes(..., tool="deepspeed")`.
Sharding and model parallelism divide the same bytes; they differ in what they communicate:
DDP, ZeRO-1 and ZeRO-2 move 2x the gradients per step (an all-reduce, or a reduce-scatter plus an
all-gather); ZeRO-3/FSDP 3x (parameters all-gathered again in backward); tensor parallel moves
activations at every layer (only fast inside a node); pipeline moves activations only between
stages but leaves GPUs idle in its bubble. Activations (with --seq-len and --batch) are a rough
estimate for a GPT-like transformer, see `activation_bytes`. This module imports no torch.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import asdict, dataclass
from typing import Any

HEADROOM = 0.9  # of a GPU's memory a run may plan to fill: the CUDA context, the allocator's caches,
# communication buffers and fragmentation take the rest (typically 5-10%)
GPUS_PER_NODE = 8  # tensor parallel needs NVLink-class bandwidth: keep it inside one node

# Bytes per parameter: (parameter, gradient, fp32 master copy) by precision; optimizer state by optimizer.
PRECISION_BYTES = {"bf16": (2, 2, 4), "fp16": (2, 2, 4), "fp32": (4, 4, 0)}
OPTIMIZER_BYTES = {"adam": 8, "adamw": 8, "sgd-momentum": 4, "sgd": 0}
STRATEGIES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3/FSDP", "tensor parallel", "pipeline parallel")
# The tools that implement each row (labs/fsdp and labs/deepspeed run them on one model).
TOOLS = {
    "DDP": "DDP, Horovod",
    "ZeRO-1": "DeepSpeed 1, torch ZeRO",  # torch.distributed.optim.ZeroRedundancyOptimizer
    "ZeRO-2": "DeepSpeed 2",  # also FSDP2 with reshard_after_forward=False
    "ZeRO-3/FSDP": "DeepSpeed 3, FSDP2",
    "tensor parallel": "DTensor, Megatron",
    "pipeline parallel": "torch pipelining",
}
# DeepSpeed's ZeRO optimizer steps on an fp32 master partition it copies even from fp32
# parameters (labs/deepspeed counts it: 4 bytes/parameter over N ranks, at every stage).
DEEPSPEED_FP32_MASTER_BYTES = 4

# Activations of one transformer layer per token and per unit of width, in bytes, 16-bit, without
# recomputation, with FlashAttention (no seq x seq scores kept): 34 (Korthikanti et al., 2022,
# "Reducing Activation Recomputation in Large Transformer Models", eq. 1 without its 5as/h term).
# fp32 doubles it. With full recomputation only each layer's input is kept: 2 bytes.
ACTIVATION_BYTES_PER_TOKEN_WIDTH = 34
# Width against depth of GPT-like models: h = 128 * layers (LLaMA 7B 4096 x 32, 13B 5120 x 40),
# and 12 * layers * h^2 parameters, when --hidden/--layers are not given.
WIDTH_PER_LAYER = 128

UNITS = {"": 1e9, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
COUNTS = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


class PlanError(ValueError):
    """Bad input: one line naming the fix, exit code 2."""


# ------------------------------------------------------------------------------------------ parsing


def _number_and_unit(text: str, what: str, example: str) -> tuple[float, str]:
    match = re.fullmatch(r"\s*([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {what} (like {example})")
    value = float(match.group(1))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
    return value, match.group(2)


def parameter_count(text: str) -> int:
    """7e9, 7B, 1.3B, 125M, 7000000000."""
    value, unit = _number_and_unit(text, "parameter count", "7e9, 7B or 125M")
    if unit.lower() not in COUNTS:
        raise argparse.ArgumentTypeError(f"unknown unit {unit!r} in {text!r}; use K, M, B (or G) or T, like 7B or 7e9")
    return round(value * COUNTS[unit.lower()])


def memory_size(text: str) -> float:
    """80GB, 80G, 80GiB, 24576MiB; a bare number is GB (1e9 bytes, as GPU datasheets count)."""
    value, unit = _number_and_unit(text, "memory size", "80GB, 80GiB or 24576MiB")
    key = unit.lower()
    if key in ("k", "m", "g", "t", "ki", "mi", "gi", "ti"):  # 80G, 80Gi: the B is implied
        key += "b"
    if key not in UNITS:
        raise argparse.ArgumentTypeError(f"unknown unit {unit!r} in {text!r}; use B, KB, MB, GB, TB (powers of 1000) "
                                         "or KiB, MiB, GiB, TiB (powers of 1024), like 80GB")
    return value * UNITS[key]


# ------------------------------------------------------------------------------------------- memory


@dataclass
class Row:
    strategy: str
    layout: str
    tools: str
    param_bytes: float
    grad_bytes: float
    master_bytes: float
    optimizer_bytes: float
    activation_bytes: float | None
    total_bytes: float
    fits: bool
    communication: str


def tensor_parallel_degree(gpus: int) -> int:
    return min(gpus, GPUS_PER_NODE)


def model_state_bytes(params: int, gpus: int, optimizer: str, precision: str,
                      tool: str = "torch") -> dict[str, dict[str, float]]:
    """Bytes per GPU of parameters, gradients, master copy and optimizer state, for each strategy.

    tool="deepspeed": the ZeRO rows as DeepSpeed holds them, with its fp32 master copy in fp32 too.
    """
    param, grad, master = (b * params for b in PRECISION_BYTES[precision])
    zero_master = DEEPSPEED_FP32_MASTER_BYTES * params if tool == "deepspeed" and not master else master
    opt = OPTIMIZER_BYTES[optimizer] * params
    n, t = gpus, tensor_parallel_degree(gpus)
    return {
        "DDP": {"param": param, "grad": grad, "master": master, "optimizer": opt},
        "ZeRO-1": {"param": param, "grad": grad, "master": zero_master / n, "optimizer": opt / n},
        "ZeRO-2": {"param": param, "grad": grad / n, "master": zero_master / n, "optimizer": opt / n},
        "ZeRO-3/FSDP": {"param": param / n, "grad": grad / n, "master": zero_master / n, "optimizer": opt / n},
        "tensor parallel": {"param": param / t, "grad": grad / t, "master": master / t, "optimizer": opt / t},
        "pipeline parallel": {"param": param / n, "grad": grad / n, "master": master / n, "optimizer": opt / n},
    }


def model_shape(params: int, layers: int | None, hidden: int | None) -> tuple[int, int]:
    """(layers, hidden) of a GPT-like model of `params` parameters: 12 * layers * hidden^2."""
    if layers and hidden:
        return layers, hidden
    if hidden:
        return max(1, round(params / (12 * hidden**2))), hidden
    if layers:
        return layers, max(1, round(math.sqrt(params / (12 * layers))))
    layers = max(1, round((params / (12 * WIDTH_PER_LAYER**2)) ** (1 / 3)))
    return layers, max(1, round(math.sqrt(params / (12 * layers))))


def activation_bytes(seq_len: int, batch: int, layers: int, hidden: int, precision: str) -> float:
    """Rough: 34 bytes x tokens x width per layer, 16-bit, no recomputation, FlashAttention.

    Leaves out the logits (batch x seq x vocab, large for big vocabularies), the temporary buffers
    of each kernel and fragmentation. Activation checkpointing cuts it to ~2 bytes x tokens x width
    per layer (each layer's input), paying a second forward.
    """
    scale = 2 if precision == "fp32" else 1
    return ACTIVATION_BYTES_PER_TOKEN_WIDTH * scale * seq_len * batch * hidden * layers


def plan(params: int, gpus: int, gpu_memory: float, optimizer: str = "adam", precision: str = "bf16",
         seq_len: int | None = None, batch: int | None = None, layers: int | None = None,
         hidden: int | None = None, tool: str = "torch") -> dict[str, Any]:
    """Every strategy's memory per GPU, whether it fits, and the recommendation with its reason."""
    if (seq_len is None) != (batch is None):
        raise PlanError("--seq-len and --batch go together: give both for an activation estimate, or neither")
    states = model_state_bytes(params, gpus, optimizer, precision, tool)
    layers, hidden = model_shape(params, layers, hidden)
    activations = activation_bytes(seq_len, batch, layers, hidden, precision) if seq_len and batch else None
    usable = HEADROOM * gpu_memory
    communication = {
        "DDP": "all-reduce of the gradients (2x their size per GPU per step)",
        "ZeRO-1": "same as DDP (reduce-scatter + all-gather)",
        "ZeRO-2": "same as DDP (reduce-scatter + all-gather)",
        "ZeRO-3/FSDP": "1.5x DDP: parameters all-gathered in forward and again in backward",
        "tensor parallel": "an all-reduce of activations in every layer, forward and backward: inside a node",
        "pipeline parallel": "activations between neighbouring stages only; idle bubble (S-1)/(M+S-1)",
    }
    t = tensor_parallel_degree(gpus)
    layout = {"DDP": f"{gpus} replicas", "ZeRO-1": f"{gpus} shards", "ZeRO-2": f"{gpus} shards",
              "ZeRO-3/FSDP": f"{gpus} shards", "tensor parallel": f"{t}-way" + (f" x {gpus // t} replicas" if gpus > t
                                                                                  else ""),
              "pipeline parallel": f"{gpus} stages"}
    rows = []
    for name in STRATEGIES:
        s = states[name]
        # Activations: replicated strategies keep every layer's for their own micro-batch. Tensor
        # parallel splits most of them N ways (Korthikanti: 10 + 24/t of the 34; 10/N with sequence
        # parallelism, counted here as /t). A pipeline stage holds layers/N layers' worth for up to N
        # micro-batches in flight (1F1B), about the same as one GPU holding every layer for one.
        act = None
        if activations is not None:
            act = activations / tensor_parallel_degree(gpus) if name == "tensor parallel" else activations
        total = sum(s.values()) + (act or 0)
        rows.append(Row(name, layout[name], TOOLS[name], s["param"], s["grad"], s["master"], s["optimizer"], act, total,
                        total <= usable, communication[name]))
    return {
        "inputs": {"params": params, "gpus": gpus, "gpu_memory_bytes": gpu_memory, "optimizer": optimizer,
                   "precision": precision, "tool": tool, "seq_len": seq_len, "batch": batch, "layers": layers,
                   "hidden": hidden},
        "bytes_per_param": {k: round(v / params) for k, v in model_state_bytes(params, 1, optimizer, precision, tool)
                            ["ZeRO-1"].items()},
        "usable_bytes_per_gpu": usable,
        "headroom": HEADROOM,
        "strategies": [asdict(r) for r in rows],
        "recommendation": recommend(rows, params, gpus, gpu_memory, usable, optimizer, precision, activations, tool),
    }


def recommend(rows: list[Row], params: int, gpus: int, gpu_memory: float, usable: float, optimizer: str,
              precision: str, activations: float | None, tool: str = "torch") -> dict[str, str]:
    by_name = {r.strategy: r for r in rows}
    gb = 1e9
    states = sum(model_state_bytes(params, 1, optimizer, precision, tool)["ZeRO-1"].values())
    if gpus == 1 and by_name["DDP"].fits:
        return {"strategy": "single GPU", "reason": f"{by_name['DDP'].total_bytes / gb:.1f} GB fits in one GPU "
                                                    f"({usable / gb:.1f} GB usable): no parallelism needed"}
    if by_name["DDP"].fits:
        return {"strategy": "DDP", "reason": f"a full replica ({by_name['DDP'].total_bytes / gb:.1f} GB) fits in "
                                             f"{usable / gb:.1f} GB: DDP is the simplest and communicates least "
                                             "(one gradient all-reduce per step, overlapped with backward)"}
    for name, what, where in [
        ("ZeRO-1", "sharding the optimizer states", "DeepSpeed stage 1, torch's ZeroRedundancyOptimizer"),
        ("ZeRO-2", "sharding optimizer states and gradients",
         "DeepSpeed stage 2, FSDP's SHARD_GRAD_OP or FSDP2 with reshard_after_forward=False"),
    ]:
        if by_name[name].fits:
            return {"strategy": name, "reason": f"a replica needs {by_name['DDP'].total_bytes / gb:.1f} GB, more than "
                                                f"the {usable / gb:.1f} GB usable; {what} brings it to "
                                                f"{by_name[name].total_bytes / gb:.1f} GB at DDP's communication cost "
                                                f"({where})"}
    if by_name["ZeRO-3/FSDP"].fits:
        return {"strategy": "ZeRO-3/FSDP", "reason": f"only sharding everything fits: "
                                                     f"{by_name['ZeRO-3/FSDP'].total_bytes / gb:.1f} GB per GPU of "
                                                     f"{usable / gb:.1f} GB usable; it costs 1.5x DDP's "
                                                     "communication (parameters gathered twice per step)"}
    sharded_states = states / gpus
    if activations is not None and sharded_states <= usable and by_name["tensor parallel"].fits:
        return {"strategy": "FSDP + tensor parallel", "reason": "the model states fit when sharded "
                f"({sharded_states / gb:.1f} GB) but activations ({activations / gb:.1f} GB) do not: split layers "
                f"with tensor parallelism inside a node (up to {GPUS_PER_NODE} GPUs), or use activation checkpointing "
                "or a smaller micro-batch"}
    if sharded_states <= usable:
        return {"strategy": "ZeRO-3/FSDP + activation checkpointing", "reason": "the model states fit when sharded "
                f"({sharded_states / gb:.1f} GB) but not with these activations; checkpoint activations (~2 bytes per "
                "token per unit of width per layer instead of 34), or lower the micro-batch, or add tensor parallel"}
    needed = math.ceil(states / usable)
    return {"strategy": "does not fit", "reason": f"the model states alone are {states / gb:.0f} GB, "
            f"{sharded_states / gb:.1f} GB per GPU even fully sharded over {gpus}, more than the {usable / gb:.1f} GB "
            f"usable: use at least {needed} GPUs of this size (FSDP, with tensor parallel inside nodes and pipeline "
            "across them when that is many nodes), or offload optimizer states to CPU memory, or fine-tune fewer "
            "parameters (LoRA)"}
