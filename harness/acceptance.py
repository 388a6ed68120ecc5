"""`distlab acceptance` (make gpu-acceptance): one command for a fresh GPU host.

On N visible GPUs, at world sizes 1..N (powers of two, and N): doctor; check, baseline, ddp and
horovod; collectives and allreduce_bench on NCCL, and nccl-tests' all_reduce_perf beside the lab
when it is on PATH (`distlab bench allreduce`); a scaling study; then a profile calibrated for the
GPU it finds (from harness/profiles/plans/gpu-acceptance.toml) and a grade against that profile.
Every step goes through the same commands a person would type, into one results folder, packed
into one archive to attach to a ticket. A failed step is recorded and the others still run: one
broken lab should not hide the state of the rest.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import time
from pathlib import Path

from harness import doctor
from harness.console import console
from harness.usage import UsageError
from labs.common.host import gpus as visible_gpus

PLAN = Path(__file__).resolve().parent / "profiles" / "plans" / "gpu-acceptance.toml"


def world_sizes(gpus: int) -> list[int]:
    """1, 2, 4, 8, ... up to the GPUs visible, and the count itself (6 GPUs: 1, 2, 4, 6)."""
    sizes = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= gpus]
    return sizes if gpus in sizes else [*sizes, gpus]


def profile_name(model: str, gpus: int) -> str:
    """A profile name from the GPU model: "NVIDIA H200" on 1 GPU -> nvidia-h200-x1."""
    return f"{re.sub(r'[^a-z0-9]+', '-', model.lower()).strip('-')}-x{gpus}"


def steps(gpus: int, model: str, folder: Path) -> list[tuple[str, list[str]]]:
    """The acceptance as distlab command lines, in order."""
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


def run(args: argparse.Namespace) -> int:
    from harness import cli  # the same commands a person types, in this process

    gpus = visible_gpus()
    if not gpus["count"]:
        raise UsageError("no GPU is visible (torch.cuda finds none); the GPU acceptance needs GPUs, "
                         "`make grade` grades this host's CPUs")
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = args.results / "acceptance" / f"{stamp}-{profile_name(gpus['models'][0], gpus['count'])}"
    folder.mkdir(parents=True)
    (folder / "doctor.json").write_text(json.dumps(doctor.facts(), indent=2, default=str) + "\n")
    outcomes = []
    for name, argv in steps(gpus["count"], gpus["models"][0], folder):
        console.print(f"== {name}: distlab {' '.join(argv)}", markup=False)
        started = time.monotonic()
        code = cli.main(argv)
        outcomes.append({"step": name, "argv": argv, "exit_code": code, "seconds": time.monotonic() - started})
        if code == 130:
            break  # Ctrl-C: stop here, keep what was done
    failed = [o["step"] for o in outcomes if o["exit_code"] != 0]
    (folder / "acceptance.json").write_text(json.dumps({
        "gpus": gpus, "world_sizes": world_sizes(gpus["count"]), "steps": outcomes, "failed": failed}, indent=2) + "\n")
    archive = shutil.make_archive(str(folder), "gztar", root_dir=folder.parent, base_dir=folder.name)
    for outcome in outcomes:
        mark = "ok" if outcome["exit_code"] == 0 else f"FAILED (exit {outcome['exit_code']})"
        console.print(f"{outcome['step']:<40} {mark:<20} {outcome['seconds']:7.1f} s", markup=False)
    console.print(f"results: {folder}\narchive: {archive}", markup=False)
    return 1 if failed else 0
