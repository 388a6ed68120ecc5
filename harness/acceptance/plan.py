"""What the one-GPU acceptance runs: the plan's rows (ROWS), as calibrate's template (plan_toml), and
the name of the profile it writes.

On ONE GPU (the machines this project can borrow: one H200, about 15 minutes in all, commands of at
most 10 minutes, at most 8 files of 16 MiB back) world size 1 alone would teach little, so the
one-GPU plan (ROWS) runs every lab that takes NCCL at world size 1 in bf16, two ranks sharing the
GPU over Gloo with CUDA tensors (the device-placement path; NCCL refuses two ranks on one GPU), and
Horovod where it was built with NCCL (else that row is named as skipped, with the reason). Calibrate
measures each row once and writes a profile from the rows that passed; the grade runs them against
it. `--cpu-proxy` runs the same plan on CPUs (Gloo, seconds-long arguments): the acceptance proven
on the GPU machine's own software without its GPU (nox -s gpu-proxy).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


def profile_name(model: str, gpus: int, stamp: str) -> str:
    """The profile an acceptance writes, from the GPU model and when it began: "NVIDIA H200" on 1 GPU
    -> nvidia-h200-x1-20261205-0712. The stamp keeps it apart from every committed profile: calibrate
    refuses a name harness/profiles/ holds, so a profile committed under a plain nvidia-h200-x1 made
    the next acceptance's calibrate refuse, and with it the grade."""
    return f"{re.sub(r'[^a-z0-9]+', '-', model.lower()).strip('-')}-x{gpus}-{stamp}"


@dataclass(frozen=True)
class Row:
    """One row of the one-GPU plan, run once by calibrate and once by the grade."""

    name: str
    lab: str
    world_size: int
    backend: str | None  # on the GPU; None: the lab's own choice (baseline: its device; horovod: its transport)
    gpu_args: tuple[str, ...]
    cpu_args: tuple[str, ...]  # the same row in the CPU proxy plan: Gloo on the CPUs, seconds long
    work_s: float  # ESTIMATED seconds of work on one H200 beyond the launch (ESTIMATE)
    reference: str | None = None  # the plain loop its throughput is a ratio to (harness/verdict/references.py)
    trains_resnet: bool = False  # convolutions: cuDNN autotunes them in every process (benchmark mode)


BF16 = ("--precision", "bf16")
# Training rows: 8192 synthetic images x 2 epochs, in bf16. The warm-up is a quarter of the run, so the
# learning rate has decayed by the end (with FULL's 2 warm-up epochs the whole run was warm-up and the
# final accuracy still rose steeply, the worst place to read a band from); --synthetic-noise 1.0
# (the default 1.5 is hard) lets 16k images reach a plateau rather than a slope.
TRAIN = ("--dataset", "synthetic", "--train-size", "8192", "--test-size", "1024", "--epochs", "2",
         "--warmup-epochs", "0.5", "--synthetic-noise", "1.0", *BF16)
# The proxy's: 256 images, the standard stem, fp32. bf16 autocast on a CPU without bf16 instructions
# is emulated: one step of the smoke ResNet-18 took 64-110 s against 5-6 s in fp32 (torch 2.11, AMD EPYC
# with AVX2, 2 threads, a loaded machine), so the proxy proves the plan's path, not its precision.
CPU_TRAIN = ("--smoke",)
# In the order they run: a deadline that cuts the plan short cuts its tail, so what this plan is
# for comes first (NCCL, the shared GPU, the training labs), the libraries' own labs after. One launch
# each but ddp's (its reference loop: the ratio that carries from one GPU to another); fsdp runs FSDP2
# alone (its ZeRO-1 and DDP strategies run on the CPUs in the tests), so that two passes fit the
# deadline (ESTIMATE).
ROWS: tuple[Row, ...] = (
    Row("check", "check", 1, "nccl", ("--elements", "16777216"), ("--elements", "65536"), 2),
    Row("check_gloo_cuda", "check", 2, "gloo", ("--device", "cuda", "--elements", "16777216"),
        ("--elements", "65536"), 3),
    Row("ddp", "ddp", 1, "nccl", TRAIN, CPU_TRAIN, 6, reference="train_loop", trains_resnet=True),
    # Gloo between two ranks on one GPU copies the 45 MB of gradients through host memory and
    # loopback, taken at 0.2 s a step: 4096 images in one epoch, 16 steps of 128 per rank.
    Row("ddp_gloo_cuda", "ddp", 2, "gloo",
        ("--device", "cuda", "--dataset", "synthetic", "--train-size", "4096", "--test-size", "1024", "--epochs", "1",
         "--synthetic-noise", "1.0", *BF16), ("--device", "cpu", *CPU_TRAIN), 8, trains_resnet=True),
    Row("baseline", "baseline", 1, None, TRAIN, CPU_TRAIN, 6, trains_resnet=True),
    Row("horovod", "horovod", 1, None, TRAIN, CPU_TRAIN, 6, trains_resnet=True),
    Row("collectives", "collectives", 1, "nccl", (), (), 3),
    Row("allreduce_bench", "allreduce_bench", 1, "nccl", ("-b", "8", "-e", "256M", "-f", "4"),
        ("-b", "1K", "-e", "1M", "-w", "2", "-n", "5"), 6),
    Row("fsdp", "fsdp", 1, "nccl", ("--strategy", "fsdp"), ("--smoke", "--strategy", "fsdp"), 3),
    Row("tensor_parallel", "tensor_parallel", 1, "nccl", (), ("--smoke",), 2),
    Row("pipeline", "pipeline", 1, "nccl", (), ("--smoke",), 2),
    Row("scaling", "scaling", 1, "nccl", ("--steps", "30", "--warmup-steps", "5", *BF16),
        ("--smoke", "--batch-size", "4"), 4, trains_resnet=True),
)


def planned_rows(horovod: bool, only: list[str] | None = None) -> list[Row]:
    """The rows this host runs: Horovod's where it was built; `only` (--rows) a few of them, for a rerun."""
    return [row for row in ROWS if (horovod or row.lab != "horovod") and (not only or row.name in only)]


def plan_toml(horovod: bool, cpu_proxy: bool = False, only: list[str] | None = None) -> str:
    """The one-GPU plan (or its CPU proxy) as a template profile for calibrate (TOML)."""
    name, gpus = ("gpu-acceptance-cpu-proxy", 0) if cpu_proxy else ("gpu-acceptance-x1", 1)
    where = "the CPUs, Gloo, seconds-long arguments" if cpu_proxy else "one GPU"
    lines = [f'name = "{name}"', f'description = "the one-GPU acceptance on {where}: every NCCL lab at world '
             'size 1, bf16, and two ranks sharing the GPU over Gloo"', "provisional = true", "auto_select = false",
             *(["threads_per_rank = 1"] if cpu_proxy else []), "",
             "[measured]", 'where = "not measured: a plan for distlab calibrate"',
             'how = "distlab acceptance (harness/acceptance/plan.py, ROWS)"', 'date = "-"', "",
             "[match]", f"gpus = {gpus}"]
    for row in planned_rows(horovod, only):
        lines += ["", f"[labs.{row.name}]"]
        if row.lab != row.name:
            lines.append(f'lab = "{row.lab}"')
        lines.append(f"world_sizes = [{row.world_size}]")
        backend = ("gloo" if row.backend else None) if cpu_proxy else row.backend
        if backend:
            lines.append(f'backend = "{backend}"')
        lines.append(f"args = {json.dumps(list(row.cpu_args if cpu_proxy else row.gpu_args))}")
        if row.reference:
            lines.append(f'reference = "{row.reference}"')
        if row.lab == "allreduce_bench":
            lines.append('throughput_metric = "avg_busbw_gbps"')
    return "\n".join(lines) + "\n"


def one_gpu_plan(horovod: bool) -> str:
    return plan_toml(horovod)
