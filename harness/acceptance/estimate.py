"""The one-GPU acceptance's seconds, ESTIMATED phase by phase (ESTIMATE): what --dry-run prints, and
what each step's share of the deadline is weighed by (step_estimates)."""

from __future__ import annotations

from harness.acceptance.plan import Row

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
