"""`distlab acceptance` (make gpu-acceptance; offline: docker/gpu-acceptance.sh): one command for a GPU host.

On N visible GPUs, at world sizes 1..N (powers of two, and N): doctor; check, baseline, ddp and
horovod; collectives and allreduce_bench on NCCL, and nccl-tests' all_reduce_perf beside the lab
when it is on PATH (`distlab bench allreduce`); a scaling study; then a profile calibrated for the
GPU it finds (from harness/profiles/plans/gpu-acceptance.toml) and a grade against that profile.

On ONE GPU (the machines this project can borrow: one H200, about 15 minutes in all, commands of at
most 10 minutes, at most 8 files of 16 MiB back) world size 1 alone would teach little, so the
one-GPU plan (ROWS) runs every lab that takes NCCL at world size 1 in bf16, two ranks sharing the
GPU over Gloo with CUDA tensors (the device-placement path; NCCL refuses two ranks on one GPU), and
Horovod where it was built with NCCL (else that row is named as skipped, with the reason). Calibrate
measures each row once and writes a profile from the rows that passed; the grade runs them against
it. `--cpu-proxy` runs the same plan on CPUs (Gloo, seconds-long arguments): the acceptance proven
on the GPU machine's own software without its GPU (nox -s gpu-proxy).

Built for a machine lent for minutes (docs/gpu-acceptance.md):
- a hard deadline, overall (--deadline) and per step: each step gets its share of the time left,
  is stopped (SIGINT: it keeps and reports what finished) when that runs out, and every process it
  left is ended; a step that fails is recorded and the next one starts;
- every step is written AS IT GOES into the folder the caller names (--out): acceptance.json (the
  steps, their seconds, the preflight, the estimate), acceptance.log (every step's output),
  doctor.json, the profile, and acceptance.tar.gz (the whole results folder without weights), all
  rewritten after each step, so a run cut short still returns what ran;
- `--dry-run` checks what the real run needs (torch importable, CUDA visible or why not, the
  launcher the Gloo rows use, Horovod) and prints every phase of the estimate (ESTIMATE).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.console import console
from harness.files import write_json
from harness.grading.disk import WEIGHTS
from harness.usage import UsageError, absolute_path, positive_int
from harness.verdict.profiles import tomllib
from labs.common.host import REPO

PLAN = Path(__file__).resolve().parents[1] / "profiles" / "plans" / "gpu-acceptance.toml"


def world_sizes(gpus: int) -> list[int]:
    """1, 2, 4, 8, ... up to the GPUs visible, and the count itself (6 GPUs: 1, 2, 4, 6)."""
    sizes = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= gpus]
    return sizes if gpus in sizes else [*sizes, gpus]


def profile_name(model: str, gpus: int, stamp: str) -> str:
    """The profile an acceptance writes, from the GPU model and when it began: "NVIDIA H200" on 1 GPU
    -> nvidia-h200-x1-20261205-0712. The stamp keeps it apart from every committed profile: calibrate
    refuses a name harness/profiles/ holds, so a profile committed under a plain nvidia-h200-x1 made
    the next acceptance's calibrate refuse, and with it the grade."""
    return f"{re.sub(r'[^a-z0-9]+', '-', model.lower()).strip('-')}-x{gpus}-{stamp}"


# ------------------------------------------------------------------------------- the one-GPU plan

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
             'how = "distlab acceptance (harness/commands/acceptance.py, ROWS)"', 'date = "-"', "",
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


# ------------------------------------------------------------------------------------ the estimate

# Seconds on one H200, ESTIMATED: no GPU run has happened yet; replace them with the figures of the
# first acceptance.json. Measured on the CPU proxy (Python 3.12, torch 2.11.0+cu130 on 2 cores of an
# AMD EPYC, docs/gpu-acceptance.md): the install, the doctor and the archive, which do not touch the GPU.
ESTIMATE = {
    # docker/gpu-install.py: a dry run of pip, then the missing wheels (distlab, jsonschema and five
    # small others) into a fresh folder: 6 s measured on the proxy.
    "install_s": 10.0,
    # Once per machine: the first process that touches CUDA reads torch's CUDA libraries (cuDNN,
    # cuBLAS, NCCL: about 2.5 GB in the wheels) from disk; under gVisor file reads cost more. The
    # preflight probe pays it, so no step does.
    "first_cuda_load_s": 40.0,
    "probe_s": 8.0,  # the preflight's own process: torch import and a CUDA context, the libraries cached
    "doctor_s": 15.0,  # measured 9 s on the proxy (torch import, the Horovod probe); on the GPU a CUDA context more
    # Every launch: interpreter and torch import (1.4 s of CPU on the CPU hosts here; torch 2.11's on
    # the proxy: PROXY below), a CUDA context (1-3 s), an NCCL communicator at world size 1 (under 1 s),
    # the harness around the run (its folder, the observer, the record checked: 1-2 s). Two ranks
    # start through torchrun: its agent imports torch too, and the ranks meet over a store.
    "launch_s": 6.0,
    "launch_torchrun_s": 9.0,
    # cudnn.benchmark: each new convolution shape is timed once per process. ResNet-18 has some ten
    # shapes, each forward and two backward, train and test batches: a few seconds per process.
    "autotune_s": 4.0,
    "evaluator_start_s": 10.0,  # its process: torch, a CUDA context, autotuning of the test batch shape
    "evaluate_s": 2.0,  # each observed run: rank 0's weights loaded and the test set counted
    "report_s": 3.0,  # calibrate writes its profile, the grade its pages and plots
    "archive_s": 2.0,  # after every step: measured under 1 s on the proxy (about 0.3 MB without weights)
    # docker/gpu-claim-spread.py on ddp's final weights, in two processes (each its own autotuning):
    # a launch, autotuning and three evaluations of 1024 images each.
    "claim_spread_s": 25.0,
}
DEADLINE_S = 510  # the default --deadline on one GPU: 8.5 minutes, 90 s inside a 10-minute command
# A step past its time gets SIGINT, then this long to stop its runs and write what it has, then SIGKILL.
GRACE_S = 30.0
RESERVE_S = GRACE_S + 10.0  # kept back at the end of the deadline: the last step's grace and the archive
MIN_STEP_S = 20.0  # a step that would get less is not started (named so in acceptance.json)
RUN_TIMEOUT_S = {"gpu": 150.0, "cpu": 400.0}  # each run's watchdog (--timeout): one hang is not the budget


def pass_seconds(rows: list[Row]) -> dict[str, float]:
    """One pass of the plan (calibrate's, or the grade's): each of its costs, ESTIMATED."""
    launches = sum(ESTIMATE["launch_torchrun_s" if row.world_size > 1 else "launch_s"] * (1 + bool(row.reference))
                   for row in rows)
    trained = sum(row.world_size + bool(row.reference) for row in rows if row.trains_resnet)
    observed = sum(1 for row in rows if row.lab in ("baseline", "ddp", "horovod"))
    return {"launches": launches, "work": float(sum(row.work_s for row in rows)),
            "cuDNN autotune": trained * ESTIMATE["autotune_s"],
            "evaluator": ESTIMATE["evaluator_start_s"] + observed * ESTIMATE["evaluate_s"],
            "report": ESTIMATE["report_s"]}


def estimate(rows: list[Row]) -> list[tuple[str, float]]:
    """Every phase of the one-GPU acceptance with its expected seconds, in order (ESTIMATE)."""
    one_pass = pass_seconds(rows)
    phases = [("install (docker/gpu-install.py)", ESTIMATE["install_s"]),
              ("first CUDA load (preflight probe)", ESTIMATE["first_cuda_load_s"] + ESTIMATE["probe_s"]),
              ("doctor", ESTIMATE["doctor_s"])]
    for step in ("calibrate", "grade"):
        phases += [(f"{step}: {part}", seconds) for part, seconds in one_pass.items()]
    phases.append(("claim spread (2 processes)", ESTIMATE["claim_spread_s"]))
    phases.append(("archive, after each of 4 steps", 4 * ESTIMATE["archive_s"]))
    return phases


def step_estimates(rows: list[Row]) -> dict[str, float]:
    """The estimate per step: what a step's share of the time left is weighed by."""
    one_pass = sum(pass_seconds(rows).values())
    return {"doctor": ESTIMATE["doctor_s"], "calibrate": one_pass, "grade": one_pass,
            "claim spread": ESTIMATE["claim_spread_s"]}


# ----------------------------------------------------------------------------------- the preflight

# Run in a process of its own: the acceptance itself never holds a CUDA context (it would keep GPU
# memory for the whole run), and an import that fails says why in its own words.
PROBE = r"""
import json, os, sys, time
started = time.monotonic()
facts = {"python": sys.executable, "torch": None, "cuda_visible": False, "devices": [], "why_no_cuda": None}
try:
    import torch
except Exception as error:
    facts["torch_error"] = f"{type(error).__name__}: {error}"
    print(json.dumps(facts)); sys.exit(0)
facts.update(torch=torch.__version__, torch_file=torch.__file__, cuda_build=torch.version.cuda,
             nccl=torch.distributed.is_nccl_available(), gloo=torch.distributed.is_gloo_available())
facts["import_s"] = time.monotonic() - started
if torch.version.cuda is None:
    facts["why_no_cuda"] = f"torch {torch.__version__} is a CPU-only build"
elif os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
    facts["why_no_cuda"] = f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} hides every GPU"
elif not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/nvidia0")):
    facts["why_no_cuda"] = "no NVIDIA driver here (/dev/nvidiactl, /proc/driver/nvidia)"
else:
    try:
        torch.cuda.init()
        facts["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        facts["cuda_visible"] = bool(facts["devices"])
        torch.zeros(1, device="cuda").sum().item()  # a context and a kernel: the first CUDA load, paid here
    except Exception as error:
        facts["why_no_cuda"] = f"torch.cuda: {type(error).__name__}: {str(error).strip().splitlines()[0]}"
    if facts["devices"]:
        try:  # provenance only: a failure here says nothing about the GPU
            facts.update(bf16=torch.cuda.is_bf16_supported(), cudnn=torch.backends.cudnn.version(),
                         nccl_version=str(torch.cuda.nccl.version()))
        except Exception as error:
            facts["provenance_error"] = repr(error)
    if not facts["devices"] and not facts["why_no_cuda"]:
        facts["why_no_cuda"] = "torch.cuda.device_count() is 0"
facts["seconds"] = time.monotonic() - started
print(json.dumps(facts))
"""


def probe_torch(timeout_s: float = 300.0) -> dict[str, Any]:
    """torch and CUDA as the steps will find them (PROBE), in a fresh process of this interpreter."""
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=timeout_s)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as error:
        return {"python": sys.executable, "torch": None, "torch_error": f"the probe failed: {error}"}


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


def horovod_for_cpus(python: str = sys.executable) -> tuple[bool, str]:
    """The CPU proxy's Horovod row: any Horovod with PyTorch (it runs over Gloo there)."""
    done = subprocess.run([python, "-c", "import horovod.torch"], capture_output=True, text=True, timeout=120)
    return (True, "Horovod installed") if done.returncode == 0 else (
        False, "Horovod is not installed (the GPU machine has none; `make setup` builds it)")


def launcher_env(folder: Path) -> dict[str, str]:
    """The steps' environment: the Gloo rows' torchrun must be this interpreter's own. The harness
    takes the one beside the interpreter first (a venv's bin), then PATH; where this interpreter has
    none beside it (its packages installed with --target), PATH could find another torch's, so a
    torchrun of this interpreter (`python -m torch.distributed.run`) goes first on PATH."""
    shims = folder / "bin"
    shims.mkdir(parents=True, exist_ok=True)
    shim = shims / "torchrun"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run "$@"\n')
    shim.chmod(0o755)
    return {**os.environ, "PATH": os.pathsep.join([str(shims), os.environ.get("PATH", "")])}


def torchrun_for_rows(env: dict[str, str] | None) -> tuple[str | None, bool]:
    """The torchrun the Gloo rows will start (as the harness picks it: beside the interpreter, then
    PATH), and whether it runs this interpreter. env None: before launcher_env made its shim."""
    beside = Path(sys.executable).parent / "torchrun"
    if beside.exists():
        return str(beside), True
    if env is None:
        return f"{sys.executable} -m torch.distributed.run (a shim the run puts first on PATH)", True
    tool = shutil.which("torchrun", path=env.get("PATH"))
    if tool is not None:
        with contextlib.suppress(OSError):
            return tool, sys.executable in Path(tool).read_text(errors="replace")[:400]
    return tool, False


def install_record() -> dict[str, Any] | None:
    """What docker/gpu-install.py installed for this run: it leaves a record at the top of its target,
    beside the distlab package, whose folder REPO is in an installed wheel (none in a checkout)."""
    if not (REPO / "__init__.py").is_file():
        return None  # a checkout: harness/ and labs/ at its top, no install of ours
    with contextlib.suppress(OSError, ValueError):
        return json.loads((REPO.parent / ".distlab-install.json").read_text())
    return None


def preflight(cpu_proxy: bool, env: dict[str, str] | None) -> tuple[dict[str, Any], list[str]]:
    """What the real run needs, checked before anything starts: the facts, and each problem that
    would stop it, in one line naming the fix."""
    torch = probe_torch()
    tool, own = torchrun_for_rows(env)
    facts = {"torch": torch, "distlab_from": str(REPO), "installed": install_record(), "torchrun": tool,
             "torchrun_is_this_pythons": own}
    problems = []
    if not torch.get("torch"):
        problems.append(f"torch is not importable by {sys.executable} ({torch.get('torch_error')}); run this with "
                        "the Python that has torch (docker/gpu-acceptance.sh: PYTHON=/path/to/python3)")
    elif not cpu_proxy and not torch.get("cuda_visible"):
        problems.append(f"no GPU is visible to torch {torch['torch']} ({torch.get('why_no_cuda')}); the GPU "
                        "acceptance needs one (`--cpu-proxy` runs its plan on the CPUs, `make grade` grades them)")
    if not own:
        problems.append(f"the Gloo rows would start {tool or 'no torchrun'}, not this Python's ({sys.executable})")
    return facts, problems


# ---------------------------------------------------------------------------------------- the steps

@dataclass
class Step:
    name: str
    argv: list[str] | None  # distlab's arguments; None: not run (skipped, with its reason in `note`)
    estimate_s: float = 0.0
    note: str = ""
    stdout_to: Path | None = None  # a step whose stdout is its product (doctor --json, grade --json)
    ok_codes: tuple[int, ...] = (0,)  # doctor exits 1 when it names a problem (no MPI there): its facts are the product
    script: Path | None = None  # a program of the checkout to run instead of distlab


def one_gpu_steps(name: str, folder: Path, horovod: tuple[bool, str], cpu_proxy: bool = False,
                  only: list[str] | None = None) -> list[Step]:
    """The one-GPU acceptance after its preflight: doctor, calibrate, grade (and a skipped Horovod named)."""
    share = step_estimates(planned_rows(horovod[0], only))
    timeout = f"{RUN_TIMEOUT_S['cpu' if cpu_proxy else 'gpu']:g}"
    results = ["--results", str(folder)]
    profiles = folder / "profiles"
    planned = [Step("doctor", ["doctor", "--json"], share["doctor"], stdout_to=folder / "doctor.json", ok_codes=(0, 1))]
    if not horovod[0] and (not only or "horovod" in only):
        planned.append(Step("horovod ws=1", None, note=f"SKIPPED: {horovod[1]}"))
    planned.append(Step(f"calibrate {name}", ["calibrate", "--profile", name, "--template", str(folder / "plan.toml"),
                                              "--output", str(profiles), "--repeats", "1", "--keep-going",
                                              "--timeout", timeout, *results], share["calibrate"]))
    planned.append(Step(f"grade against {name}", ["grade", "--profile", str(profiles / f"{name}.toml"), "--timeout",
                                                  timeout, "--json", *results], share["grade"],
                        stdout_to=folder / "grade.json"))
    # What bf16 and cuDNN make two honest evaluations of one model differ by, measured where it matters
    # (the claim tolerance was reasoned from the CPU's: docs/gpu-acceptance.md). Last: a cut takes it first.
    ddp = next((row for row in planned_rows(horovod[0], only) if row.name == "ddp"), None)
    if ddp is not None:
        configs = ["fp32:128", "fp32:37"] if cpu_proxy else ["bf16:512", "bf16:100", "fp32:512"]
        planned.append(Step("claim spread", [OBSERVED_DDP, *[f"--config={c}" for c in configs], "--processes", "2",
                                             "--", *(ddp.cpu_args if cpu_proxy else ddp.gpu_args)],
                            share["claim spread"], script=CHECKOUT / "docker" / "gpu-claim-spread.py",
                            stdout_to=folder / "claim-spread.txt"))
    return planned


OBSERVED_DDP = "{ddp ws=1 observe}"  # the claim spread's weights: the grade's ddp run, found once it ran
# Where the acceptance was started from (docker/gpu-acceptance.sh says), for the programs of the
# checkout that the wheel does not carry.
CHECKOUT = Path(os.environ.get("DISTLAB_CHECKOUT") or REPO)


def observed_ddp(folder: Path) -> str | None:
    runs = sorted(folder.glob("ddp/*-ws1-*/observe"))
    return str(runs[-1]) if runs else None


def steps(gpus: int, name: str, folder: Path) -> list[tuple[str, list[str]]]:
    """The acceptance as distlab command lines, in order (several GPUs; one_gpu_steps for one); the
    profile it writes is `name`."""
    sizes = world_sizes(gpus)
    results = ["--results", str(folder)]
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
                                          str(profiles), "--world-sizes", ",".join(map(str, sizes)), "--keep-going",
                                          *results]))
    planned.append((f"grade against {name}", ["grade", "--profile", str(profiles / f"{name}.toml"),
                                              "--world-sizes", ",".join(map(str, sizes)), *results]))
    return planned


class Clock:
    """The overall deadline, counted from when the acceptance began: DISTLAB_ACCEPTANCE_STARTED (epoch
    seconds, set by docker/gpu-acceptance.sh before its install) or now."""

    def __init__(self, deadline_s: float | None) -> None:
        started = os.environ.get("DISTLAB_ACCEPTANCE_STARTED", "")
        try:
            before = min(max(0.0, time.time() - float(started)), 3600.0) if started else 0.0
        except ValueError:
            before = 0.0
        self.zero = time.monotonic() - before
        self.deadline_s = deadline_s

    def elapsed(self) -> float:
        return time.monotonic() - self.zero

    def left(self) -> float:
        return float("inf") if self.deadline_s is None else self.deadline_s - self.elapsed()

    def limit(self, step: Step, later: list[Step]) -> float:
        """Seconds this step may run: its share of the time left (less the reserve), weighed by the
        estimates of it and the steps after it. A step that ends early leaves its time to the others."""
        if self.deadline_s is None:
            return float("inf")
        usable = self.left() - RESERVE_S
        weights = sum(s.estimate_s for s in [step, *later] if s.argv is not None)
        return usable * step.estimate_s / weights if weights else usable


def end_leftovers(token: str) -> int:
    """Every process still carrying this step's token in its environment, killed: a step stopped
    with SIGKILL cannot end its ranks or its evaluator itself. Returns how many."""
    import psutil

    ended = 0
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if process.pid != os.getpid() and process.environ().get(STEP_TOKEN) == token:
                process.kill()
                ended += 1
    return ended


STEP_TOKEN = "DISTLAB_ACCEPTANCE_STEP"  # inherited by everything a step starts: how leftovers are found
# What a step runs: distlab itself, as its entry point finds the harness (distlab/__init__.py): in a
# wheel, harness/ lies inside the distlab package, and `-m harness...` found nothing there.
DISTLAB_MODULE = "distlab"


def run_step(step: Step, limit_s: float, env: dict[str, str], log: Any, cwd: Path) -> dict[str, Any]:
    """One step as a process of its own (`python -m distlab ...`), stopped at its limit:
    SIGINT first (distlab stops the run in flight, keeps the finished ones, writes its report),
    SIGKILL GRACE_S later; then nothing it started is left running. cwd: the results folder, not a
    checkout, so the steps import the installed distlab and never a tree that happens to lie beside."""
    token = uuid.uuid4().hex
    started = time.monotonic()
    log.write(f"\n== {step.name}: distlab {' '.join(step.argv or [])}\n")
    log.flush()
    stdout = step.stdout_to.open("w") if step.stdout_to else log
    stopped, interrupted = "", False
    try:
        program = [str(step.script)] if step.script else ["-m", DISTLAB_MODULE]
        process = subprocess.Popen([sys.executable, *program, *(step.argv or [])],
                                   stdin=subprocess.DEVNULL, stdout=stdout, stderr=log, cwd=cwd,
                                   start_new_session=True, env={**env, STEP_TOKEN: token})
        try:
            code = process.wait(timeout=min(limit_s, 1e7))
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as why:
            interrupted = isinstance(why, KeyboardInterrupt)  # Ctrl-C on the acceptance: this step, then no other
            stopped = "Ctrl-C" if interrupted else f"stopped at its deadline ({limit_s:.0f} s)"
            process.send_signal(signal.SIGINT)
            try:
                code = process.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
                stopped += f", killed {GRACE_S:.0f} s later"
    finally:
        if step.stdout_to:
            stdout.close()
    leftovers = end_leftovers(token)
    seconds = time.monotonic() - started
    status = "stopped" if stopped else "ok" if code in step.ok_codes else "failed"
    if status == "ok" and step.stdout_to and step.stdout_to.suffix == ".json" and not json_file(step.stdout_to):
        # doctor exits 1 both when it names a problem and when it crashes: only its facts tell them apart
        status, stopped = "failed", f"exit {code} and no JSON on its stdout ({step.stdout_to.name}): see the log"
    outcome: dict[str, Any] = {"status": status, "exit_code": code, "seconds": round(seconds, 1),
                               "limit_s": None if limit_s == float("inf") else round(limit_s, 1)}
    if stopped:
        outcome["note"] = stopped
    if interrupted:
        outcome["interrupted"] = True
    if leftovers:
        outcome["processes_ended_after"] = leftovers
    log.write(f"== {step.name}: {status} (exit {code}) in {seconds:.1f} s\n")
    log.flush()
    return outcome


def json_file(path: Path) -> bool:
    """Whether a step's product is whole: one JSON document."""
    try:
        json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return True


# --------------------------------------------------------------------------------------- the outbox

# What never goes into the archive: trained weights and checkpoints (grading/disk.WEIGHTS; a ResNet-18
# run leaves about 45 MB, the whole acceptance 450-550 MB), each named with its size in left-out.json instead.
ARCHIVE_MEMBER_MAX = 4 << 20  # a larger file is left out too (and named): the archive must stay a few MiB
OUT_FILES = ("acceptance.json", "acceptance.log", "doctor.json", "acceptance.tar.gz")  # and the profile


class Outbox:
    """The folder the caller names (--out): a handful of small files at its top (the machine lent
    returns at most 8), each replaced whole (written, then renamed) after every step, so that
    whenever the run is stopped, what lies there is complete and readable."""

    def __init__(self, out: Path, folder: Path) -> None:
        self.out, self.folder = out, folder

    def write_json(self, name: str, data: Any) -> None:
        write_json(self.out / name, json.loads(json.dumps(data, default=str)))  # by rename

    def copy(self, source: Path) -> None:
        if source.is_file() and source.resolve().parent != self.out.resolve():
            partial = self.out / f".{source.name}.partial"
            shutil.copyfile(source, partial)
            os.replace(partial, self.out / source.name)

    def archive(self) -> dict[str, Any]:
        """The results folder as acceptance.tar.gz, weights and oversized files left out (and named)."""
        started = time.monotonic()
        left_out = []
        own = {(self.out / name).resolve() for name in OUT_FILES}
        partial = self.out / ".acceptance.tar.gz.partial"
        with tarfile.open(partial, "w:gz") as tar:
            for path in sorted(self.folder.rglob("*")):
                if path.is_symlink() or not path.is_file() or path.resolve() in own or path.name.endswith(".partial"):
                    continue
                size = path.stat().st_size
                if path.suffix in WEIGHTS or size > ARCHIVE_MEMBER_MAX:
                    left_out.append({"path": str(path.relative_to(self.folder)), "bytes": size})
                    continue
                with contextlib.suppress(OSError):  # a file a run is still writing may vanish
                    tar.add(path, arcname=f"{self.folder.name}/{path.relative_to(self.folder)}", recursive=False)
            listing = json.dumps(left_out, indent=1).encode()
            info = tarfile.TarInfo(f"{self.folder.name}/left-out.json")
            info.size, info.mtime = len(listing), int(time.time())
            tar.addfile(info, io.BytesIO(listing))
        os.replace(partial, self.out / "acceptance.tar.gz")
        return {"bytes": (self.out / "acceptance.tar.gz").stat().st_size, "left_out": len(left_out),
                "left_out_bytes": sum(item["bytes"] for item in left_out),
                "seconds": round(time.monotonic() - started, 2)}

    def collect(self, name: str, summary: dict[str, Any]) -> None:
        """After every step: the doctor's facts, the profile, the grade's summary, the archive, the summary."""
        profile = self.folder / "profiles" / f"{name}.toml"
        self.copy(self.folder / "doctor.json")
        self.copy(profile)
        with contextlib.suppress(OSError, ValueError):
            summary["grade"] = json.loads((self.folder / "grade.json").read_text())
        with contextlib.suppress(OSError):
            summary["claim_spread"] = (self.folder / "claim-spread.txt").read_text().splitlines()
        with contextlib.suppress(OSError, ValueError):
            written = sorted(tomllib.loads(profile.read_text()).get("labs", {}))
            summary["profile_rows"] = written
            summary["rows_left_out_of_profile"] = [row for row in summary["rows"] if row not in written]
        summary["archive"] = self.archive()
        self.write_json("acceptance.json", summary)


# ----------------------------------------------------------------------------------------- the run

def dry_run(rows: list[Row], planned: list[Step], facts: dict[str, Any], problems: list[str],
            deadline_s: float | None, cpu_proxy: bool = False) -> int:
    """Every check, row, step and phase with its expected seconds; nothing starts. Exit 1 when a
    check would stop the real run."""
    torch = facts["torch"]
    where = ", ".join(torch["devices"]) if torch.get("cuda_visible") else \
        f"no GPU visible ({torch.get('why_no_cuda') or torch.get('torch_error')})"
    console.print(f"python {sys.executable}; distlab from {facts['distlab_from']}", markup=False)
    console.print(f"torch {torch.get('torch') or 'NOT IMPORTABLE'} (CUDA {torch.get('cuda_build')}): {where}",
                  markup=False)
    console.print(f"torchrun for the Gloo rows: {facts['torchrun']}", markup=False)
    for row in rows:
        console.print(f"  plan row {row.name:<18} ws={row.world_size} {row.backend or '-':<5} "
                      f"{' '.join(row.cpu_args if cpu_proxy else row.gpu_args)}", markup=False)
    for step in planned:
        command = f"(not run: {step.note})" if step.argv is None else "distlab " + " ".join(step.argv)
        console.print(f"{step.name:<44} {step.estimate_s:6.0f} s  {command}", markup=False)
    phases = estimate(rows)
    for phase, seconds in phases:
        console.print(f"  {phase:<44} {seconds:6.0f} s", markup=False)
    total = sum(seconds for _, seconds in phases)
    console.print(f"expected total {total:.0f} s of a {deadline_s if deadline_s else 'no'} s deadline on one H200 "
                  "(ESTIMATED: harness/commands/acceptance.py, ESTIMATE)", markup=False)
    for problem in problems:
        console.print(f"the real run would stop: {problem}", markup=False)
    return 1 if problems else 0


DESCRIPTION = ("Doctor, every lab at world sizes 1..N on the visible GPUs, benchmarks, a profile calibrated for "
               "this GPU and a grade against it, under a deadline; written as it goes (docs/gpu-acceptance.md).")
EXAMPLES = ("examples:\n  distlab acceptance                      # every GPU this host shows\n"
            "  distlab acceptance --out /tmp/out --dry-run    # the checks and every phase's estimate\n"
            "  CUDA_VISIBLE_DEVICES=0,1 distlab acceptance")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", type=absolute_path, default="results", help="results root")
    parser.add_argument("--dry-run", action="store_true",
                        help="print every step with its expected seconds; start nothing")
    parser.add_argument("--gpus", type=positive_int,
                        help="--dry-run on a host without GPUs: plan for this many (default 1)")
    parser.add_argument("--gpu-model", help='--dry-run on a host without GPUs: their model (default "NVIDIA H200")')
    parser.add_argument("--out", type=Path, help="also write the summary, log, profile and a small archive here, "
                                                 "after every step (default: the results folder)")
    parser.add_argument("--deadline", type=float, help="seconds for everything, counted from the start "
                                                      "(default 510 on one GPU; none on several)")
    parser.add_argument("--cpu-proxy", action="store_true",
                        help="the one-GPU plan on the CPUs (Gloo, seconds-long): the acceptance without its GPU")
    parser.add_argument("--rows", help="one GPU: only these rows of the plan (to rerun what failed), e.g. ddp,fsdp")


def run(args: argparse.Namespace, lab_args: list[str]) -> int:
    """`distlab acceptance`: preflight, then every step under the deadline, written as it goes."""
    cpu_proxy, dry = args.cpu_proxy, args.dry_run
    only = [row for row in (args.rows or "").split(",") if row]
    unknown = [row for row in only if row not in {r.name for r in ROWS}]
    if unknown:
        raise UsageError(f"--rows: no row {unknown[0]!r}; the rows: {', '.join(r.name for r in ROWS)}")
    if args.deadline is not None and args.deadline < RESERVE_S + 2 * MIN_STEP_S:
        raise UsageError(f"--deadline {args.deadline:g} leaves no time for the steps; give at least "
                         f"{RESERVE_S + 2 * MIN_STEP_S:.0f} s ({DEADLINE_S} fits the one-GPU plan)")
    if args.out is not None and (args.out / "acceptance.json").exists():
        raise UsageError(f"{args.out} already holds an acceptance (acceptance.json); name another --out")
    clock = Clock(args.deadline if args.deadline is not None else DEADLINE_S)
    before = clock.elapsed()  # the install, in docker/gpu-acceptance.sh
    facts, problems = preflight(cpu_proxy, None)
    preflight_s = clock.elapsed() - before
    devices = facts["torch"].get("devices") or []
    gpus = 1 if cpu_proxy else len(devices) or (args.gpus or 1 if dry else 0)
    several = gpus > 1 and not cpu_proxy
    if several and args.deadline is None:
        clock.deadline_s = None  # no machine lent by the minute: no default deadline
    model = (devices or [args.gpu_model or "NVIDIA H200"])[0]
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = f"cpu-proxy-{stamp}" if cpu_proxy else profile_name(model, gpus, stamp)
    horovod = horovod_for_cpus() if cpu_proxy else horovod_with_nccl()
    folder = args.results / "acceptance" / name  # the stamp is in the name
    if dry:
        if several:
            for step_name, argv in steps(gpus, name, folder):
                console.print(f"{step_name:<44} distlab {' '.join(argv)}", markup=False)
            return 1 if problems else 0
        return dry_run(planned_rows(horovod[0], only), one_gpu_steps(name, folder, horovod, cpu_proxy, only), facts,
                       problems, clock.deadline_s, cpu_proxy)
    if problems:
        raise UsageError(problems[0])
    folder.mkdir(parents=True)
    env = launcher_env(folder)
    facts["torchrun"], facts["torchrun_is_this_pythons"] = torchrun_for_rows(env)
    out = args.out or folder
    out.mkdir(parents=True, exist_ok=True)
    outbox = Outbox(out, folder)
    rows = [] if several else planned_rows(horovod[0], only)
    if several:
        planned = [Step(step_name, argv, 1.0) for step_name, argv in steps(gpus, name, folder)]
    else:
        (folder / "plan.toml").write_text(plan_toml(horovod[0], cpu_proxy, only))
        planned = one_gpu_steps(name, folder, horovod, cpu_proxy, only)
    summary: dict[str, Any] = {
        "plan": "cpu-proxy" if cpu_proxy else f"{gpus} GPU(s)", "profile": name, "deadline_s": clock.deadline_s,
        "started": dt.datetime.now().isoformat(timespec="seconds"), "before_this_process_s": round(before, 1),
        "preflight": facts, "preflight_s": round(preflight_s, 1), "horovod": horovod[1],
        "rows": [row.name for row in rows], "estimate": dict(estimate(rows)) if rows else None, "results": str(folder),
        "steps": []}
    console.print(f"distlab acceptance: {summary['plan']}, profile {name}, deadline {clock.deadline_s or 'none'} s "
                  f"({clock.elapsed():.0f} s gone); results {folder}; out {out}", markup=False)
    interrupted = False
    with (out / "acceptance.log").open("a") as log:
        for index, step in enumerate(planned):
            record: dict[str, Any] = {"step": step.name, "argv": step.argv, "at_s": round(clock.elapsed(), 1),
                                      "estimate_s": round(step.estimate_s, 1)}
            limit = clock.limit(step, planned[index + 1:])
            profile_arg = step.argv[step.argv.index("--profile") + 1] if step.argv and step.argv[0] == "grade" else ""
            if step.argv is None:
                record.update(status="skipped", note=step.note)
            elif interrupted:
                record.update(status="not started", note="the acceptance was interrupted")
            elif limit < MIN_STEP_S:
                record.update(status="not started", note=f"{max(0.0, clock.left()):.0f} s left of the deadline")
            elif profile_arg and not Path(profile_arg).is_file():
                record.update(status="not started", note="calibrate wrote no profile (no row passed)")
            elif step.script and not step.script.is_file():
                record.update(status="skipped", note=f"no {step.script} (run from a checkout)")
            elif OBSERVED_DDP in step.argv and not observed_ddp(folder):
                record.update(status="not started", note="no ddp run at world size 1 was observed")
            else:
                console.print(f"== {step.name}" + (f" (at most {limit:.0f} s)" if limit < float("inf") else ""),
                              markup=False)
                if OBSERVED_DDP in step.argv:
                    step.argv = [str(observed_ddp(folder)) if arg == OBSERVED_DDP else arg  # found above
                                 for arg in step.argv]
                    record["argv"] = step.argv
                record.update(run_step(step, limit, env, log, folder))
                interrupted = record.pop("interrupted", False)
            took = f" in {record['seconds']} s" if "seconds" in record else ""
            console.print(f"   {record['status']}{': ' + record['note'] if record.get('note') else ''}{took}",
                          markup=False)
            summary["steps"].append(record)
            outbox.collect(name, summary)
    summary["failed"] = [s["step"] for s in summary["steps"] if s["status"] in ("failed", "stopped", "not started")]
    summary["total_s"] = round(clock.elapsed(), 1)
    outbox.collect(name, summary)
    for record in summary["steps"]:
        console.print(f"{record['step']:<44} {record['status']:<12} {record.get('seconds', 0.0):7.1f} s", markup=False)
    console.print(f"results: {folder}\nout: {out} (archive {summary['archive']['bytes'] / 1e6:.2f} MB; "
                  f"{summary['total_s']:.0f} s in all)", markup=False)
    if interrupted:
        return 130
    return 1 if summary["failed"] else 0
