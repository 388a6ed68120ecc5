"""The acceptance as distlab command lines, in order: on several GPUs every lab at world sizes 1..N,
benchmarks, calibrate and grade (steps); on one, doctor, calibrate and grade of the one-GPU plan and
the claim spread (one_gpu_steps)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from harness.acceptance.estimate import step_estimates
from harness.acceptance.plan import planned_rows
from labs.common.host import REPO

PLAN = Path(__file__).resolve().parents[1] / "profiles" / "plans" / "gpu-acceptance.toml"
RUN_TIMEOUT_S = {"gpu": 150.0, "cpu": 400.0}  # each run's watchdog (--timeout): one hang is not the budget


def world_sizes(gpus: int) -> list[int]:
    """1, 2, 4, 8, ... up to the GPUs visible, and the count itself (6 GPUs: 1, 2, 4, 6)."""
    sizes = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= gpus]
    return sizes if gpus in sizes else [*sizes, gpus]


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
    # What bf16 and cuDNN make two honest evaluations of one model differ by, measured where it matters
    # (the claim tolerance was reasoned from the CPU's: docs/gpu-acceptance.md). Last: a cut takes it first.
    # It reads the weights of the grade's ddp run, so that grade keeps them (a grade removes them once
    # judged); the archive leaves weights out either way.
    ddp = next((row for row in planned_rows(horovod[0], only) if row.name == "ddp"), None)
    keep = ["--keep"] if ddp is not None else []
    planned.append(Step(f"grade against {name}", ["grade", "--profile", str(profiles / f"{name}.toml"), "--timeout",
                                                  timeout, "--json", *keep, *results], share["grade"],
                        stdout_to=folder / "grade.json"))
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
