"""`distlab acceptance` (make gpu-acceptance): one command for a fresh GPU host.

On N visible GPUs, at world sizes 1..N (powers of two, and N): doctor; check, baseline, ddp and
horovod; collectives and allreduce_bench on NCCL, and nccl-tests' all_reduce_perf beside the lab
when it is on PATH (`distlab bench allreduce`); a scaling study; then a profile calibrated for the
GPU it finds (from harness/profiles/plans/gpu-acceptance.toml) and a grade against that profile.
Every step goes through the same commands a person would type, into one results folder, packed
into one archive to attach to a ticket. A failed step is recorded and the others still run: one
broken lab should not hide the state of the rest.

On ONE GPU (the GPU machines this project can borrow have one H200) world size 1 alone would
teach little: no all-reduce crosses anything, no gradient is synchronised, nothing is sharded.
The one-GPU plan (one_gpu_plan) runs every lab that takes NCCL at world size 1 in bf16 (check,
ddp, fsdp's three strategies, tensor_parallel, pipeline, allreduce_bench, collectives, scaling),
and two ranks sharing the GPU over Gloo with CUDA tensors (check and ddp with --device cuda: the
device-placement path, which NCCL refuses with two ranks on one GPU). Horovod runs at world size
1 when it was built with NCCL; else that step is named as skipped, with the reason, and the rest
goes on. Calibrate writes the profile from these rows, and the grade runs them against it.
`distlab acceptance --dry-run` prints the steps with their expected seconds (ESTIMATES below).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from harness.console import console
from harness.files import write_json
from harness.run import capabilities
from harness.usage import UsageError, absolute_path, positive_int
from labs.common.host import gpus as visible_gpus

PLAN = Path(__file__).resolve().parents[1] / "profiles" / "plans" / "gpu-acceptance.toml"


def world_sizes(gpus: int) -> list[int]:
    """1, 2, 4, 8, ... up to the GPUs visible, and the count itself (6 GPUs: 1, 2, 4, 6)."""
    sizes = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= gpus]
    return sizes if gpus in sizes else [*sizes, gpus]


def profile_name(model: str, gpus: int) -> str:
    """A profile name from the GPU model: "NVIDIA H200" on 1 GPU -> nvidia-h200-x1."""
    return f"{re.sub(r'[^a-z0-9]+', '-', model.lower()).strip('-')}-x{gpus}"


# The one-GPU plan: one row per (lab, how it runs); "lab" names the catalog lab when the row's name
# is not one. Each row is short: the plan must fit 8 minutes on one H200, calibrate and grade each
# running it once (ESTIMATES).
BF16 = ["--precision", "bf16"]
TRAIN = ["--dataset", "synthetic", "--train-size", "8192", "--test-size", "1024", "--epochs", "2", *BF16]
ONE_GPU_ROWS: dict[str, dict] = {
    "check": {"world_sizes": [1], "backend": "nccl", "args": ["--elements", "16777216"]},
    "check_gloo_cuda": {"lab": "check", "world_sizes": [2], "backend": "gloo",
                        "args": ["--device", "cuda", "--elements", "16777216"]},
    "baseline": {"world_sizes": [1], "args": TRAIN, "reference": "train_loop"},
    "ddp": {"world_sizes": [1], "backend": "nccl", "args": TRAIN, "reference": "train_loop"},
    "ddp_gloo_cuda": {"lab": "ddp", "world_sizes": [2], "backend": "gloo",
                      "args": ["--device", "cuda", "--dataset", "synthetic", "--train-size", "4096", "--test-size",
                               "1024", "--epochs", "1", *BF16]},
    "horovod": {"world_sizes": [1], "args": TRAIN, "reference": "train_loop"},
    "fsdp": {"world_sizes": [1], "backend": "nccl", "args": ["--strategy", "fsdp"]},
    "fsdp_zero1": {"lab": "fsdp", "world_sizes": [1], "backend": "nccl", "args": ["--strategy", "zero1"]},
    "fsdp_ddp": {"lab": "fsdp", "world_sizes": [1], "backend": "nccl", "args": ["--strategy", "ddp"]},
    "tensor_parallel": {"world_sizes": [1], "backend": "nccl", "args": []},
    "pipeline": {"world_sizes": [1], "backend": "nccl", "args": []},
    "collectives": {"world_sizes": [1], "backend": "nccl", "args": []},
    "allreduce_bench": {"world_sizes": [1], "backend": "nccl", "args": ["-b", "8", "-e", "256M", "-f", "4"]},
    "scaling": {"world_sizes": [1], "backend": "nccl", "args": ["--steps", "30", "--warmup-steps", "5", *BF16],
                "reference": "train_loop"},
}

# Expected seconds, ESTIMATED (no GPU run has happened yet; replace with the archive's figures when
# one has). A run costs START_S per launch: interpreter and torch import (1.4 s of CPU measured on
# the CPU hosts here), CUDA context and cuDNN (1-3 s), an NCCL communicator (about 1 s), launcher and
# harness (1-2 s). Work on top, per row: ResNet-18 (CIFAR stem, bf16, channels_last) taken at 5,000
# img/s on an H200, a fifth of what such a GPU is reported to reach, so 8192 x 2 images plus tests
# are some 5 s; Gloo between two ranks on one GPU copies the 45 MB of gradients through host memory
# and loopback, taken at 0.2 s a step; the all-reduce sweep to 256 MB a few seconds; a reference
# loop (train_loop) a launch of its own. The grade adds its evaluator (one process) and the doctor.
START_S = 8.0
WORK_S = {"check": 2, "check_gloo_cuda": 3, "baseline": 6, "ddp": 6, "ddp_gloo_cuda": 8, "horovod": 6, "fsdp": 3,
          "fsdp_zero1": 3, "fsdp_ddp": 3, "tensor_parallel": 2, "pipeline": 2, "collectives": 3,
          "allreduce_bench": 6, "scaling": 4}
EVALUATOR_S = 10.0
BUDGET_S = 8 * 60  # the GPU machines are lent for about 15 minutes; acceptance gets eight


def horovod_with_nccl(python: str = sys.executable) -> tuple[bool, str]:
    """Whether Horovod is installed and built with NCCL, and if not, why (for the skipped step)."""
    probe = "import horovod.torch as hvd; print(int(hvd.nccl_built()))"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as error:
        return False, f"Horovod could not be asked ({error})"
    if done.returncode != 0:
        return False, "Horovod is not installed (`make setup` builds it; on this host with NCCL)"
    if not int(done.stdout.split()[-1] or 0):
        return False, "Horovod was built without NCCL (`nox -s horovod-nccl` or `make setup` on a GPU host builds it)"
    return True, "Horovod built with NCCL"


def one_gpu_plan(horovod: bool) -> str:
    """The one-GPU plan as a template profile for calibrate (TOML)."""
    lines = ['name = "gpu-acceptance-x1"', 'description = "the one-GPU acceptance: every NCCL lab at world size 1, '
             'bf16, and two ranks sharing the GPU over Gloo"', "provisional = true", "auto_select = false", "",
             "[measured]", 'where = "not measured: a plan for distlab calibrate"',
             'how = "distlab acceptance on one GPU (harness/commands/acceptance.py, one_gpu_plan)"', 'date = "-"', "",
             "[match]", "gpus = 1"]
    for name, row in ONE_GPU_ROWS.items():
        if name == "horovod" and not horovod:
            continue
        lines += ["", f"[labs.{name}]"]
        lines += [f"{key} = {json.dumps(value)}" for key, value in row.items()]
    return "\n".join(lines) + "\n"


def planned_rows(horovod: bool) -> list[str]:
    return [name for name in ONE_GPU_ROWS if horovod or name != "horovod"]


def row_seconds(name: str) -> float:
    row = ONE_GPU_ROWS[name]
    launches = 1 + bool(row.get("reference"))  # a reference loop runs before each run of its cell
    return launches * START_S + WORK_S[name]


def one_gpu_steps(model: str, folder: Path, horovod: tuple[bool, str]) -> list[tuple[str, list[str] | None, float]]:
    """The one-GPU acceptance: (name, distlab argv or None for a skipped step, expected seconds)."""
    name = profile_name(model, 1)
    results = ["--results", str(folder)]
    plan, profiles = folder / "plan-x1.toml", folder / "profiles"
    rows = planned_rows(horovod[0])
    one_pass = sum(row_seconds(row) for row in rows)
    planned: list[tuple[str, list[str] | None, float]] = []
    if not horovod[0]:
        planned.append((f"horovod ws=1 SKIPPED: {horovod[1]}", None, 0.0))
    planned.append((f"calibrate {name}", ["calibrate", "--profile", name, "--template", str(plan), "--output",
                                          str(profiles), *results], one_pass))
    planned.append((f"grade against {name}", ["grade", "--profile", str(profiles / f"{name}.toml"), *results],
                    one_pass + EVALUATOR_S))
    return planned


def steps(gpus: int, model: str, folder: Path) -> list[tuple[str, list[str]]]:
    """The acceptance as distlab command lines, in order (several GPUs; one_gpu_steps for one)."""
    sizes = world_sizes(gpus)
    results = ["--results", str(folder)]
    name = profile_name(model, gpus)
    planned: list[tuple[str, list[str]]] = []
    for ws in sizes:
        planned.append((f"check ws={ws}", ["run", "check", "-n", str(ws), *results]))
    planned.append(("baseline ws=1", ["run", "baseline", "-n", "1", *results, "--", "--smoke"]))
    for lab in ("ddp", "horovod"):
        for ws in sizes:
            planned.append((f"{lab} ws={ws}", ["run", lab, "-n", str(ws), *results, "--", "--smoke"]))
    for ws in sizes:
        planned.append((f"collectives ws={ws}", ["run", "collectives", "-n", str(ws), *results]))
    for ws in [ws for ws in sizes if ws > 1] or [1]:
        planned.append((f"allreduce_bench ws={ws}", ["run", "allreduce_bench", "-n", str(ws), *results, "--",
                                                     "-b", "8", "-e", "256M"]))
    if shutil.which("all_reduce_perf") and gpus > 1:
        planned.append(("allreduce_bench vs nccl-tests", ["bench", "allreduce", "--", "--libraries", "nccl",
                                                          "--world-size", str(gpus), "--out",
                                                          str(folder / "bench-allreduce.json")]))
    planned.append(("scaling", ["scale", "--world-sizes", ",".join(map(str, sizes)), "--repeats", "2", *results,
                                "--", "--steps", "30"]))
    profiles = folder / "profiles"
    planned.append((f"calibrate {name}", ["calibrate", "--profile", name, "--template", str(PLAN), "--output",
                                          str(profiles), "--world-sizes", ",".join(map(str, sizes)), *results]))
    planned.append((f"grade against {name}", ["grade", "--profile", str(profiles / f"{name}.toml"),
                                              "--world-sizes", ",".join(map(str, sizes)), *results]))
    return planned


def dry_run(count: int, model: str, folder: Path, horovod: tuple[bool, str]) -> int:
    """Every step with its expected seconds, and the total against the budget; nothing starts."""
    if count == 1:
        planned = one_gpu_steps(model, folder, horovod)
        for row in planned_rows(horovod[0]):
            console.print(f"  plan row {row:<18} {row_seconds(row):5.0f} s per pass  "
                          f"{json.dumps(ONE_GPU_ROWS[row])}", markup=False)
    else:
        planned = [(name, argv, float("nan")) for name, argv in steps(count, model, folder)]
    for name, argv, seconds in planned:
        command = "(skipped)" if argv is None else "distlab " + " ".join(argv)
        console.print(f"{name:<44} {seconds:6.0f} s  {command}", markup=False)
    total = sum(seconds for _, _, seconds in planned)
    if count == 1:
        console.print(f"expected total {total:.0f} s of a {BUDGET_S} s budget (estimated: "
                      "harness/commands/acceptance.py, ESTIMATES)", markup=False)
    return 0


DESCRIPTION = ("Doctor, every lab at world sizes 1..N on the visible GPUs, benchmarks, a profile calibrated for "
               "this GPU and a grade against it; one folder, one archive.")
EXAMPLES = ("examples:\n  distlab acceptance                      # every GPU this host shows\n"
            "  CUDA_VISIBLE_DEVICES=0,1 distlab acceptance")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", type=absolute_path, default="results", help="results root")
    parser.add_argument("--dry-run", action="store_true",
                        help="print every step with its expected seconds; start nothing")
    parser.add_argument("--gpus", type=positive_int,
                        help="--dry-run on a host without GPUs: plan for this many (default 1)")
    parser.add_argument("--gpu-model", help='--dry-run on a host without GPUs: their model (default "NVIDIA H200")')


def run(args: argparse.Namespace, lab_args: list[str], distlab: Callable[[list[str]], int] | None = None) -> int:
    """Every step through `distlab` (cli.main: the same commands a person types, in this process)."""
    if distlab is None:
        from harness.commands.cli import main as distlab  # the parser, not another command
    gpus = visible_gpus()
    dry = getattr(args, "dry_run", False)
    if dry and not gpus["count"]:  # a plan for a GPU host, printed on any host
        gpus = {"count": args.gpus or 1, "models": [args.gpu_model or "NVIDIA H200"], "driver": None}
    if not gpus["count"]:
        raise UsageError("no GPU is visible (torch.cuda finds none); the GPU acceptance needs GPUs, "
                         "`make grade` grades this host's CPUs")
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = args.results / "acceptance" / f"{stamp}-{profile_name(gpus['models'][0], gpus['count'])}"
    horovod = horovod_with_nccl()
    if dry:
        return dry_run(gpus["count"], gpus["models"][0], folder, horovod)
    folder.mkdir(parents=True)
    write_json(folder / "doctor.json", json.loads(json.dumps(capabilities.facts(), default=str)))
    if gpus["count"] == 1:
        (folder / "plan-x1.toml").write_text(one_gpu_plan(horovod[0]))
        planned = [(name, argv) for name, argv, _ in one_gpu_steps(gpus["models"][0], folder, horovod)]
    else:
        planned = steps(gpus["count"], gpus["models"][0], folder)
    outcomes = []
    for name, argv in planned:
        if argv is None:
            console.print(f"== {name}", markup=False)
            outcomes.append({"step": name, "argv": None, "exit_code": None, "seconds": 0.0, "skipped": True})
            continue
        console.print(f"== {name}: distlab {' '.join(argv)}", markup=False)
        started = time.monotonic()
        code = distlab(argv)
        outcomes.append({"step": name, "argv": argv, "exit_code": code, "seconds": time.monotonic() - started})
        if code == 130:
            break  # Ctrl-C: stop here, keep what was done
    failed = [o["step"] for o in outcomes if o["exit_code"] not in (0, None)]
    write_json(folder / "acceptance.json", {
        "gpus": gpus, "world_sizes": world_sizes(gpus["count"]), "steps": outcomes, "failed": failed})
    archive = shutil.make_archive(str(folder), "gztar", root_dir=folder.parent, base_dir=folder.name)
    for outcome in outcomes:
        mark = "skipped" if outcome.get("skipped") else "ok" if outcome["exit_code"] == 0 else \
            f"FAILED (exit {outcome['exit_code']})"
        console.print(f"{outcome['step']:<40} {mark:<20} {outcome['seconds']:7.1f} s", markup=False)
    console.print(f"results: {folder}\narchive: {archive}", markup=False)
    return 1 if failed else 0
