"""`distlab plan`: memory per GPU of DDP, ZeRO, FSDP, tensor and pipeline parallel, what fits, what to
use; the picking-the-tool lecture as a command (the arithmetic: harness/planning/memory.py)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from harness.console import console as shared_console
from harness.planning.memory import (
    OPTIMIZER_BYTES,
    PRECISION_BYTES,
    WIDTH_PER_LAYER,
    PlanError,
    memory_size,
    parameter_count,
    plan,
)
from harness.usage import UsageError, positive_int

DESCRIPTION = "The picking-the-tool lecture as a command (labs/PARALLELISM.md)."
EXAMPLES = """examples:
  distlab plan --params 7e9 --gpus 8 --gpu-memory 80GB --optimizer adam --precision bf16
  distlab plan --params 70e9 --gpus 64 --gpu-memory 80GB --seq-len 4096 --batch 1 --json"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", type=parameter_count, required=True, help="parameter count: 7e9, 7B, 125M")
    parser.add_argument("--gpus", type=positive_int, required=True, help="number of GPUs")
    parser.add_argument("--gpu-memory", type=memory_size, required=True,
                        help="memory of one GPU: 80GB, 80GiB, 24576MiB (a bare number is GB)")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZER_BYTES), default="adam",
                        help="adam/adamw: 8 bytes of state per parameter; sgd-momentum: 4; sgd: 0 (default adam)")
    parser.add_argument("--precision", choices=sorted(PRECISION_BYTES), default="bf16",
                        help="bf16/fp16: mixed precision with an fp32 master copy; fp32: none (default bf16)")
    parser.add_argument("--tool", choices=("torch", "deepspeed"), default="torch",
                        help="deepspeed: its ZeRO keeps an fp32 master copy with --precision fp32 too (default torch)")
    parser.add_argument("--seq-len", type=positive_int, help="tokens per sequence: adds a rough activation estimate")
    parser.add_argument("--batch", type=positive_int, help="sequences per GPU per micro-batch (with --seq-len)")
    parser.add_argument("--layers", type=positive_int, help=f"transformer layers (default: from --params, h = "
                                                             f"{WIDTH_PER_LAYER} x layers)")
    parser.add_argument("--hidden", type=positive_int, help="model width h (default: from --params)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def print_plan(result: dict[str, Any], console: Console | None = None) -> None:
    console = console or shared_console
    inputs, per = result["inputs"], result["bytes_per_param"]
    gb = 1e9
    console.print(f"{inputs['params'] / 1e9:g}B parameters on {inputs['gpus']} GPU(s) of "
                  f"{inputs['gpu_memory_bytes'] / gb:g} GB, {inputs['optimizer']}, {inputs['precision']}: "
                  f"{per['param']} (param) + {per['grad']} (grad) + {per['master']} (fp32 master) + "
                  f"{per['optimizer']} (optimizer) = {sum(per.values())} bytes/parameter")
    table = Table(title=f"memory per GPU, GB (fits: at most {result['headroom']:.0%} of "
                        f"{inputs['gpu_memory_bytes'] / gb:g} GB = {result['usable_bytes_per_gpu'] / gb:.1f} GB)")
    columns = ["strategy", "layout", "tools", "params", "grads", "master", "optimizer"]
    has_activations = inputs["seq_len"] is not None
    if has_activations:
        columns.append("activations")
    columns += ["total", "fits"]
    for name in columns:
        table.add_column(name, justify="left" if name in ("strategy", "layout", "tools") else "right", no_wrap=True)
    for row in result["strategies"]:
        cells = [row["strategy"], row["layout"], row["tools"]] + [
            f"{row[k] / gb:.1f}" for k in ("param_bytes", "grad_bytes", "master_bytes", "optimizer_bytes")]
        if has_activations:
            cells.append(f"{row['activation_bytes'] / gb:.1f}")
        cells += [f"{row['total_bytes'] / gb:.1f}", "yes" if row["fits"] else "no"]
        table.add_row(*cells)
    # Never squeezed into a narrow terminal: the columns are the lesson.
    (console if console.width >= 120 else Console(highlight=False, soft_wrap=True, width=120)).print(table)
    if has_activations:
        console.print(f"activations: a rough estimate, 34 bytes x seq_len x batch x width x layers (16-bit, no "
                      f"recomputation, FlashAttention), for {inputs['layers']} layers of width {inputs['hidden']}")
    rec = result["recommendation"]
    console.print(f"recommendation: [bold]{rec['strategy']}[/bold]: {rec['reason']}")


def run(args: argparse.Namespace, lab_args: list[str]) -> int:
    try:
        result = plan(args.params, args.gpus, args.gpu_memory, args.optimizer, args.precision, args.seq_len,
                      args.batch, args.layers, args.hidden, args.tool)
    except PlanError as error:
        raise UsageError(str(error)) from None
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_plan(result)
    return 0
