"""How close the training labs come to the compute limit (`distlab bench train`).

In one run, on the same model, batch and threads:

    input efficiency   = baseline img/s / in-memory loop img/s          target >= 0.90
    DDP overhead       = DDP at world size 1 img/s / baseline img/s     target >= 0.95
    Horovod overhead   = Horovod at world size 1 img/s / baseline img/s target >= 0.95
    observation cost   = DDP observed by the harness / DDP unobserved   target >= 0.97

The in-memory loop (harness/on_ranks/train_loop.py, the grade's reference for the training labs) is forward,
backward and optimizer step on one batch that already sits on the device as float tensors: no
data loading, augmentation or conversion, so it is what this hardware can do with this model.
Every program is launched like any run (runner.run_lab: plain python, world size 1, a run
directory each) and only its record is read (metrics.img_per_sec: training steps only, start-up
and evaluation left out).
Every measurement is a fresh process with the same OMP_NUM_THREADS; the kinds take turns over
--repeats rounds, and each kind's best round counts: other work on the machine can only slow a
round down, so the fastest is the closest to the undisturbed speed (timeit's rule). The median and
the slowest round are shown beside it; when rounds of one kind differ by more than 10%, a warning
says the machine was too busy for the ratios to be trusted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from harness.catalog import LABS
from harness.files import write_json
from harness.run.request import RunRequest
from harness.run.runner import run_lab
from harness.usage import UsageError
from harness.verdict.references import REFERENCES
from labs.common.host import usable_cores

NOISY_SPREAD = 1.10  # max/min of one kind's rounds above which the machine was too busy to trust the ratios
TIMING_WARMUP_STEPS = 3  # as the labs: labs/common/timing.py leaves the first 3 steps out of img_per_sec
# (measurement, program, its backend: "{ddp_backend}" is nccl on GPUs, else gloo; whether the
# harness's observer runs on its ranks, as it does in every graded run)
KINDS = [
    ("in-memory loop", REFERENCES["train_loop"].program, "none", False),
    ("baseline", LABS["baseline"].path, "none", False),
    ("ddp, world size 1", LABS["ddp"].path, "{ddp_backend}", False),
    ("ddp, world size 1, observed", LABS["ddp"].path, "{ddp_backend}", True),
    ("horovod, world size 1", LABS["horovod"].path, "horovod", False),
]
# (ratio, numerator, denominator, target)
RATIOS = [
    ("input efficiency: baseline / in-memory loop", "baseline", "in-memory loop", 0.90),
    ("DDP overhead: ddp / baseline", "ddp, world size 1", "baseline", 0.95),
    ("Horovod overhead: horovod / baseline", "horovod, world size 1", "baseline", 0.95),
    ("observation cost: ddp observed / ddp", "ddp, world size 1, observed", "ddp, world size 1", 0.97),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--stem", choices=["cifar", "standard"],
                        help="ResNet-18 stem (default: standard on CPU, cifar on GPU)")
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"],
                        help="autocast precision (default: bf16 on GPU, fp32 on CPU)")
    parser.add_argument("--batch-size", type=int, default=128, help="images per step")
    parser.add_argument("--steps", type=int, default=16, help="training steps per measurement (first 3 untimed)")
    parser.add_argument("--threads", type=int, default=usable_cores().count, help="OMP_NUM_THREADS of every process")
    parser.add_argument("--repeats", type=int, default=5, help="rounds; the best of each kind counts")
    parser.add_argument("--json", type=Path, help="also write the measurements and ratios here")


def settle(args: argparse.Namespace) -> argparse.Namespace:
    """The arguments checked, and the device's defaults filled in."""
    if args.steps <= TIMING_WARMUP_STEPS or args.repeats < 1 or args.batch_size < 1 or args.threads < 1:
        raise UsageError(f"--steps must exceed {TIMING_WARMUP_STEPS}; --repeats, --batch-size, --threads >= 1")
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.stem = args.stem or ("cifar" if args.device == "cuda" else "standard")
    args.precision = args.precision or ("bf16" if args.device == "cuda" else "fp32")
    return args


def measure(kind: str, program: Path, backend: str, observe: bool, args: argparse.Namespace,
            workdir: Path) -> float:
    """One measurement in a fresh process, through the runner like any run; a failed run stops the
    benchmark (its number would be no number)."""
    common = ["--device", args.device, "--stem", args.stem, "--precision", args.precision,
              "--batch-size", str(args.batch_size)]
    if program == REFERENCES["train_loop"].program:
        lab_args = [*common, "--steps", str(args.steps - TIMING_WARMUP_STEPS)]
    else:  # one epoch of exactly --steps steps of synthetic data
        lab_args = [*common, "--dataset", "synthetic", "--train-size", str(args.batch_size * args.steps),
                    "--test-size", str(args.batch_size), "--epochs", "1"]
    request = RunRequest(lab=program.parent.name if program.name == "train.py" else program.stem, program=program,
                         world_size=1, launcher="python",
                         backend=backend.format(ddp_backend="nccl" if args.device == "cuda" else "gloo"),
                         lab_args=lab_args, threads=args.threads, timeout_s=1800.0, results_root=workdir,
                         observe=observe)
    result = run_lab(request, echo=False)
    img_per_sec = (result.record or {}).get("metrics", {}).get("img_per_sec")
    if not result.ok or not img_per_sec:
        raise SystemExit(f"error: {kind} did not pass ({result.reason}); see {result.run_dir}")
    return float(img_per_sec)


def run(args: argparse.Namespace) -> int:
    args = settle(args)

    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"bench train: resnet18 {args.stem} stem, batch {args.batch_size}, {args.steps} steps "
                  f"({args.steps - TIMING_WARMUP_STEPS} timed), {args.device}, {args.threads} threads, "
                  f"{args.repeats} rounds")
    samples: dict[str, list[float]] = {kind: [] for kind, *_ in KINDS}
    with tempfile.TemporaryDirectory(prefix="distlab-bench-train-") as tmp:
        for round_ in range(args.repeats):
            for kind, program, backend, observe in KINDS:
                samples[kind].append(measure(kind, program, backend, observe, args, Path(tmp)))
                console.print(f"  round {round_ + 1}: {kind}: {samples[kind][-1]:.1f} img/s")
    best = {kind: max(values) for kind, values in samples.items()}

    table = Table(title=f"img/s over {args.repeats} rounds")
    for column in ("measurement", "best", "median", "slowest"):
        table.add_column(column, justify="left" if column == "measurement" else "right")
    for kind, values in samples.items():
        table.add_row(kind, f"{best[kind]:.1f}", f"{statistics.median(values):.1f}", f"{min(values):.1f}")
    console.print(table)
    ratios = Table(title="ratios of the best rounds")
    for column in ("ratio", "value", "target", ""):
        ratios.add_column(column, justify="left" if column == "ratio" else "right")
    summary: list[dict[str, Any]] = []
    for name, numerator, denominator, target in RATIOS:
        value = best[numerator] / best[denominator]
        met = value >= target
        summary.append({"ratio": name, "value": value, "target": target, "met": met})
        ratios.add_row(name, f"{value:.3f}", f">= {target:.2f}", "[green]met[/]" if met else "[red]missed[/]")
    console.print(ratios)
    spread = max(max(values) / min(values) for values in samples.values())
    if spread > NOISY_SPREAD:
        console.print(f"[yellow]warning:[/] one kind's rounds differ by {spread:.2f}x: something else is using "
                      "this machine's cores, and the ratios say more about it than about the labs. Rerun on an "
                      "idle machine, or with more --repeats.")
    if args.json:
        write_json(args.json, {"config": {k: str(v) if isinstance(v, Path) else v
                                          for k, v in vars(args).items() if not callable(v)},
                               "img_per_sec": samples, "best": best, "ratios": summary, "max_spread": spread})
    return 0
