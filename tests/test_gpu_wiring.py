"""The GPU path, proven on a CPU machine: which backend each run gets for 0, 1, 2 and 8 visible GPUs.

Only the harness's view of the host is replaced (its GPU count); nothing here pretends a GPU run
happened. The real GPU runs are `make gpu-acceptance` on a GPU host.
"""

import os
import subprocess
import sys

import pytest

from harness.catalog import LABS, backend_for
from harness.run import request as requests
from labs.common import host


@pytest.mark.parametrize(("gpus", "world_size", "backend"), [
    (0, 1, "gloo"), (0, 2, "gloo"),
    (1, 1, "nccl"), (1, 2, "gloo"),  # one GPU cannot give two ranks a GPU each: the CPUs, said so
    (2, 2, "nccl"), (2, 4, "gloo"),
    (8, 1, "nccl"), (8, 2, "nccl"), (8, 8, "nccl"),
])
def test_ddp_uses_nccl_exactly_when_every_rank_has_a_gpu(gpus, world_size, backend):
    chosen, reason = backend_for(LABS["ddp"], world_size, gpus)
    assert chosen == backend
    assert str(gpus) in reason or "no GPU" in reason


def test_every_gpu_lab_has_a_gpu_backend_it_accepts():
    for lab in LABS.values():
        if lab.gpu_backend:
            assert lab.gpu_backend in lab.backends, lab.name
            assert backend_for(lab, 1, 1)[0] == lab.gpu_backend
    assert backend_for(LABS["baseline"], 1, 8)[0] == "none"  # the baseline picks its device itself
    assert backend_for(LABS["horovod"], 2, 0)[0] == "horovod"  # Horovod picks its transport itself


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_distlab_run_without_backend_follows_the_hardware(gpus, tmp_path, monkeypatch):
    monkeypatch.setattr(requests, "gpu_count", lambda: gpus)
    request = requests.build_request("ddp", gpus, [], results_root=tmp_path)
    assert (request.backend, request.launcher if gpus > 1 else "python") == ("nccl", "torchrun" if gpus > 1
                                                                              else "python")
    assert requests.build_request("check", gpus, [], results_root=tmp_path).backend == "nccl"
    # Asked for explicitly, gloo stays gloo on a GPU host (Gloo is also a GPU fallback).
    assert requests.build_request("ddp", gpus, [], backend="gloo", results_root=tmp_path).backend == "gloo"


@pytest.mark.parametrize(("gpus", "sizes"), [(1, [1]), (2, [1, 2]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8])])
def test_acceptance_runs_every_world_size_the_gpus_allow(gpus, sizes, tmp_path):
    from harness.acceptance.plan import profile_name
    from harness.acceptance.steps import PLAN, steps, world_sizes

    assert world_sizes(gpus) == sizes
    name = profile_name("NVIDIA H200", gpus, "20261205-071200")
    assert name == f"nvidia-h200-x{gpus}-20261205-071200"  # never a committed profile's plain name
    planned = dict(steps(gpus, name, tmp_path))
    assert [name for name in planned if name.startswith("ddp ")] == [f"ddp ws={ws}" for ws in sizes]
    calibrate = planned[f"calibrate {name}"]
    assert calibrate[calibrate.index("--template") + 1] == str(PLAN) and PLAN.is_file()
    grade = planned[f"grade against {name}"]
    assert grade[grade.index("--profile") + 1] == str(tmp_path / "profiles" / f"{name}.toml")
    # No step names a backend: each run's backend follows the hardware (NCCL on these GPUs).
    assert not any("--backend" in argv for argv in planned.values())


def test_acceptance_without_a_gpu_is_one_line_and_starts_nothing(capsys, tmp_path, monkeypatch):
    from harness.acceptance import preflight
    from harness.commands import cli

    no_gpu = {"python": "python3", "torch": "2.11.0", "cuda_visible": False, "why_no_cuda": "no NVIDIA driver here"}
    monkeypatch.setattr(preflight, "probe_torch", lambda: no_gpu)
    assert cli.main(["acceptance", "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "no GPU is visible" in err and "no NVIDIA driver here" in err and "make grade" in err
    assert err.count("\n") == 1 and not (tmp_path / "r").exists()


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_dry_run_shows_the_nccl_command_with_the_flight_recorder_and_starts_nothing(gpus, capsys, tmp_path,
                                                                                    monkeypatch):
    from harness.commands import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(requests, "gpu_count", lambda: gpus)
    assert cli.main(["run", "ddp", "-n", str(gpus), "--dry-run", "--", "--smoke"]) == 0
    command = capsys.readouterr().out.strip()
    assert "--backend nccl" in command and command.endswith("--smoke")
    assert ("torchrun" in command and f"--nproc-per-node {gpus}" in command) if gpus > 1 else "train.py" in command
    # A hang on GPUs leaves each rank's last collectives in the run directory.
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT=1" in command and "TORCH_NCCL_TRACE_BUFFER_SIZE=" in command
    assert not (tmp_path / "results").exists()


def test_each_rank_drives_the_gpu_of_its_local_rank(monkeypatch):
    import argparse

    import torch

    from labs.common import models

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    for local_rank in (0, 5, 7):
        assert models.pick_device(argparse.Namespace(device="cuda"), local_rank) == torch.device("cuda", local_rank)
    assert models.pick_device(argparse.Namespace(device="cpu"), 5) == torch.device("cpu")


@pytest.mark.skipif(any(os.path.exists(p) for p in host.GPU_DRIVER_PATHS), reason="this host has a GPU driver")
def test_a_host_without_a_gpu_driver_counts_no_gpu_without_importing_torch(monkeypatch, tmp_path):
    probe = "import sys; from labs.common.host import gpu_count; print(gpu_count(), 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["0", "False"]  # every distlab command asks: 1.4 s of CPU saved each time
    monkeypatch.setattr(host, "GPU_DRIVER_PATHS", (str(tmp_path),))  # a driver seems present: torch answers
    assert host.gpu_count() == 0
