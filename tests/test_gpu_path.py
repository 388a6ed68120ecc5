"""The GPU path, checked on a CPU: the bugs a first GPU run would hit, each caught here.

1. Horovod refused channels_last tensors ("Tensor is required to be contiguous"): the Horovod
   labs with --channels-last at world size 2 over Gloo.
2. Tensors handed to a collective that are not on the device the lab chose (a CPU tensor on an
   NCCL group): a recording wrapper (tests/programs/device_recorder.py) runs the lab and checks
   each one. On a CPU every tensor is on the CPU; what it catches is a tensor whose device nobody
   chose, the one that lands on the CPU beside cuda:<local rank> on a GPU.
3. More ranks than GPUs: `--device auto` gave each rank cuda:<local rank>; the rule is now a
   function (labs/common/host.py, rank_device), tested here against the harness's backend_for.
4. Horovod's SyncBatchNorm built after the model moved to its device: its layers stayed on the CPU.
And the clocks: every reading on a CUDA device waits for the device (labs/common/timing.py).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
import torch
from conftest import run_lab

from harness.catalog import LABS, backend_for
from labs.common import flags, host, models, timing

REPO = Path(__file__).resolve().parents[1]
RECORDER = REPO / "tests" / "programs" / "device_recorder.py"

try:
    import horovod.torch  # noqa: F401

    HOROVOD = True
except ImportError:
    HOROVOD = False
needs_horovod = pytest.mark.skipif(not HOROVOD, reason="Horovod is not installed here (`make setup` builds it)")


# ------------------------------------------------------------------------------------- the device rule


@pytest.mark.parametrize("gpus", [0, 1, 2, 4, 8])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8, 16])
def test_auto_puts_every_rank_on_the_cpu_when_the_gpus_are_fewer_than_the_ranks(gpus, world_size):
    devices = [host.rank_device("auto", rank, world_size, gpus) for rank in range(world_size)]
    if gpus < world_size:
        assert devices == ["cpu"] * world_size
    else:
        assert devices == [f"cuda:{rank}" for rank in range(world_size)]
    # The harness's rule and the labs' agree: NCCL exactly when every rank is on a GPU of its own,
    # and "on the CPUs" is where the ranks then are.
    backend, reason = backend_for(LABS["ddp"], world_size, gpus)
    assert (backend == "nccl") == all(d.startswith("cuda") for d in devices)
    if gpus and gpus < world_size:
        assert "on the CPUs" in reason


def test_cuda_asked_for_shares_the_gpus_and_cpu_is_the_cpu():
    assert [host.rank_device("cuda", r, 2, 1) for r in range(2)] == ["cuda:0", "cuda:0"]  # Gloo on one GPU
    assert [host.rank_device("cuda", r, 4, 2) for r in range(4)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert host.rank_device("cpu", 3, 8, 8) == "cpu"
    with pytest.raises(ValueError, match="no GPU is visible"):
        host.rank_device("cuda", 0, 1, 0)


def _training_args(*argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    flags.add_training_args(parser)
    args = parser.parse_args(["--smoke", *argv])
    flags.resolve_training_args(parser, args)
    return args


@pytest.mark.parametrize(("gpus", "local_world_size", "device"), [(1, 2, "cpu"), (2, 2, "cuda"), (8, 2, "cuda")])
def test_a_training_lab_on_auto_follows_the_rule_for_its_launcher(gpus, local_world_size, device, monkeypatch):
    """What every rank of `distlab run ddp -n 2` on a host with `gpus` GPUs resolves --device auto to."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    for rank in range(local_world_size):
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
        for name, value in [("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", local_world_size),
                            ("LOCAL_WORLD_SIZE", local_world_size)]:
            monkeypatch.setenv(name, str(value))
        args = _training_args()
        assert args.device == device, f"rank {rank}"
        assert args.channels_last == (device == "cuda")  # channels_last only where the model is on a GPU
        if device == "cuda":
            monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
            assert models.pick_device(args, rank) == torch.device("cuda", rank)


def test_cuda_asked_for_with_more_ranks_than_gpus_shares_them(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    args = argparse.Namespace(device="cuda")
    assert [models.pick_device(args, r) for r in (0, 1)] == [torch.device("cuda", 0)] * 2


# ------------------------------------------------------------------------------------------ the clocks


def test_a_reading_on_a_cuda_device_waits_for_it_and_one_on_the_cpu_does_not(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    timing.now(torch.device("cpu"))
    assert synced == []
    timing.now(torch.device("cuda", 1))
    timing.TrainClock(torch.device("cuda", 1)).start_epoch()
    assert synced == [torch.device("cuda", 1)] * 2


def test_the_pipeline_stopwatches_read_the_device_clock(monkeypatch):
    """Each stage's forward and backward stopwatch reads timing.now (which waits for a GPU), never
    perf_counter alone: on a GPU that would time the kernels' launch, and the bubble with it."""
    from labs.pipeline import pipeline

    readings = []

    def clock(device):
        readings.append(device)
        return float(len(readings))

    monkeypatch.setattr(pipeline.timing, "now", clock)
    stage = pipeline.TimedStage(torch.nn.Linear(4, 4))
    stage(torch.randn(3, 4)).sum().backward()
    assert readings == [torch.device("cpu")] * 4  # forward start and end, backward start and end
    assert stage.forward_seconds == [1.0] and stage.backward_seconds == [1.0]


# ------------------------------------------------------------------------- Horovod's SyncBatchNorm


@needs_horovod
@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_horovod_sync_batchnorm_layers_are_on_the_models_device(device):
    """The meta device stands in for a GPU: any device but the CPU takes hvd.SyncBatchNorm, and a
    layer built after the move would be left on the CPU."""
    import horovod.torch as hvd

    from labs.common.batchnorm import GlobalBatchNorm2d
    from labs.horovod import train

    args = argparse.Namespace(stem="standard", sync_bn=True, channels_last=True)
    model = train.build_model(args, torch.device(device))
    layers = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert layers and all(isinstance(m, hvd.SyncBatchNorm if device == "meta" else GlobalBatchNorm2d)
                          for m in layers)
    misplaced = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type != device]
    assert not misplaced, f"on another device than {device}: {misplaced[:3]}"
    # Horovod refuses tensors that are not contiguous: the model stays so even with --channels-last.
    assert all(p.is_contiguous() for p in model.parameters())


# ------------------------------------------------------------------- the tensors handed to collectives


def recorded_run(monkeypatch, tmp_path, lab, world_size, lab_args, backend=None):
    """The lab run by distlab under the device recorder; its run, and every rank's recorded calls.
    DISTLAB_RECORD_LAB may name another program for the lab (the version before a fix, say)."""
    folder = tmp_path / "calls"
    monkeypatch.setenv("DISTLAB_RECORD_LAB", os.environ.get("DISTLAB_RECORD_LAB") or str(LABS[lab].path))
    monkeypatch.setenv("DISTLAB_RECORD_DIR", str(folder))
    run = run_lab(tmp_path / "results", lab, world_size, lab_args, backend=backend, timeout=240,
                  extra=["--program", str(RECORDER)])
    calls = [json.loads(line) for path in sorted(folder.glob("rank.*.jsonl")) for line in path.read_text().splitlines()]
    return run, calls


def misplaced(calls):
    """Each tensor handed to a collective that a GPU run would have had on the wrong device, or
    that Horovod refuses, with where the lab handed it over."""
    bad = []
    for call in calls:
        for tensor in call["tensors"]:
            wrong = (tensor["unplaced"] or tensor["device"] != call["chosen"]
                     or (call["op"].startswith("horovod") and not tensor["contiguous"]))
            if wrong:
                bad.append(f"{call['op']} {tensor} (lab chose {call['chosen']}) at {call['where']}")
    return bad


@pytest.mark.integration
@pytest.mark.parametrize(("lab", "lab_args"), [
    ("pipeline", ["--smoke"]),
    ("tensor_parallel", ["--smoke"]),
])
def test_every_tensor_a_lab_hands_to_a_collective_is_on_its_device(lab, lab_args, tmp_path, monkeypatch):
    run, calls = recorded_run(monkeypatch, tmp_path, lab, 2, lab_args)
    assert run.returncode == 0, run.output[-3000:]
    assert calls and all(call["chosen"] == "cpu" for call in calls)  # the recorder saw the lab's own calls
    assert not misplaced(calls), "\n".join(misplaced(calls))


@pytest.mark.integration
@needs_horovod
@pytest.mark.parametrize(("lab", "lab_args"), [
    # One epoch of 4 steps: the recorder's TorchFunctionMode sees every op, about 4x slower than plain.
    ("horovod", ["--smoke", "--channels-last", "--epochs", "1", "--train-size", "128", "--test-size", "64",
                 "--batch-size", "16"]),
    ("scaling", ["--smoke", "--channels-last"]),
])
def test_horovod_trains_with_channels_last_and_gets_only_contiguous_tensors(lab, lab_args, tmp_path,
                                                                             monkeypatch):
    """Horovod 0.28.1 refuses any tensor that is not contiguous; channels_last is the GPUs' default."""
    run, calls = recorded_run(monkeypatch, tmp_path, lab, 2, lab_args, backend="horovod")
    assert run.returncode == 0, run.output[-3000:]
    assert "Tensor is required to be contiguous" not in run.output
    assert run.record["status"] == "ok" and run.record["config"]["channels_last"] is True
    assert any(call["op"] == "horovod.broadcast_parameters" for call in calls)
    assert not misplaced(calls), "\n".join(misplaced(calls))


# ------------------------------------------------------------------------------- Horovod with NCCL

BUILD = REPO / "docker" / "horovod" / "build_horovod.py"
NCCL_WHEELS = REPO / ".nox" / "horovod-nccl-wheel"  # where `nox -s horovod-nccl` leaves its wheel


def _build_horovod():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_horovod", BUILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_wheel_cache_key_covers_every_gpu_option(tmp_path):
    build = _build_horovod()
    facts = {"torch": "2.14.1+cu130", "abi": "cp311"}
    flags = {"HOROVOD_WITH_PYTORCH": "1", "HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_BUILD_CUDA_CC_LIST": "80,90",
             "HOROVOD_NCCL_LINK": "SHARED"}
    gpu = {**facts, "cuda": "13.0", "nccl": "2.30.7"}
    key = build.cache_key(gpu, flags)
    assert "-cuda13.0-nccl2.30.7-" in key
    others = [build.cache_key({**gpu, "cuda": "13.1"}, flags), build.cache_key({**gpu, "nccl": "2.31.0"}, flags),
              build.cache_key(gpu, {**flags, "HOROVOD_BUILD_CUDA_CC_LIST": "90"}),
              build.cache_key(gpu, {**flags, "HOROVOD_NCCL_LINK": "STATIC"}),
              build.cache_key(facts, {k: v for k, v in flags.items() if "NCCL" not in k and "CUDA" not in k})]
    assert len({key, *others}) == 6


def test_a_gpu_build_without_cuda_stops_with_one_line_naming_the_fix(monkeypatch, capsys):
    build = _build_horovod()
    monkeypatch.setattr(build, "find_cuda", lambda: None)
    args = argparse.Namespace(python="python", cache_dir=Path("/nonexistent"))
    with pytest.raises(SystemExit) as stop:
        build.gpu_env(args, {})
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert "CUDA_HOME" in err and "HOROVOD_TORCH_CPU_ONLY=1 make setup" in err


@pytest.mark.skipif(not list(NCCL_WHEELS.glob("horovod-*.whl")),
                    reason="no Horovod wheel with NCCL was built here; `nox -s horovod-nccl` builds one (10-20 min)")
def test_the_nccl_build_links_nccl_and_says_so(tmp_path):
    """The extension needs libnccl.so.2 and reports NCCL built, loaded without a GPU driver."""
    import subprocess
    import sys
    import zipfile

    wheel = sorted(NCCL_WHEELS.glob("horovod-*.whl"))[-1]
    zipfile.ZipFile(wheel).extractall(tmp_path)
    extension = next(tmp_path.glob("horovod/torch/mpi_lib_v2*.so"))
    needed = subprocess.run(["readelf", "-d", str(extension)], capture_output=True, text=True, check=True).stdout
    assert "[libnccl.so.2]" in needed and "[libcudart.so.13]" in needed
    probe = ("import torch, horovod.torch as hvd; print(hvd.nccl_built(), hvd.cuda_built())")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    nccl, cuda = done.stdout.split()
    assert int(nccl) >= 2000 and cuda == "True"  # NCCL's version code, e.g. 23007 for 2.30.7
    check = subprocess.run([sys.executable, "-c", _build_horovod().CHECK_BUILD], capture_output=True, text=True,
                           env=env, timeout=120)
    assert "[X] NCCL" in check.stdout, check.stdout


# ------------------------------------------------------------------------- the one-GPU acceptance
# (its deadline, outbox, preflight and calibration: tests/test_gpu_acceptance.py)


@pytest.mark.parametrize("horovod", [True, False])
def test_the_one_gpu_plan_runs_every_nccl_lab_and_two_ranks_over_gloo_on_the_gpu(horovod, tmp_path):
    from harness.acceptance.plan import one_gpu_plan
    from harness.verdict.profiles import load_profile

    path = tmp_path / "plan.toml"
    path.write_text(one_gpu_plan(horovod))
    plan = load_profile(path)  # what calibrate reads: a valid template profile
    rows = plan.labs
    nccl_at_1 = {row.catalog_lab for row in rows.values() if row.backend == "nccl" and row.world_sizes == (1,)}
    assert nccl_at_1 == {"check", "ddp", "fsdp", "tensor_parallel", "pipeline", "allreduce_bench", "collectives",
                         "scaling"}
    assert rows["fsdp"].args[rows["fsdp"].args.index("--strategy") + 1] == "fsdp"  # FSDP2, the GPU-relevant one
    shared = [row for row in rows.values() if row.world_sizes == (2,)]
    assert {row.catalog_lab for row in shared} == {"check", "ddp"}
    assert all(row.backend == "gloo" and "--device" in row.args and "cuda" in row.args for row in shared)
    training_rows = [row for row in rows.values() if LABS[row.catalog_lab].data_parallel or row.lab == "scaling"]
    assert training_rows and all("bf16" in row.args for row in training_rows)
    assert ("horovod" in rows) == horovod


@pytest.mark.parametrize("horovod", [(True, "built with NCCL"), (False, "Horovod was built without NCCL")])
def test_the_one_gpu_acceptance_names_a_skipped_horovod_and_grades_what_it_calibrated(horovod, tmp_path):
    from harness.acceptance.steps import one_gpu_steps

    planned = one_gpu_steps("nvidia-h200-x1", tmp_path, horovod)
    names = [step.name for step in planned]
    assert names[0] == "doctor" and names[-3:] == ["calibrate nvidia-h200-x1", "grade against nvidia-h200-x1",
                                                   "claim spread"]
    skipped = [step.name + " " + step.note for step in planned if step.argv is None]
    assert skipped == ([] if horovod[0] else ["horovod ws=1 SKIPPED: Horovod was built without NCCL"])
    calibrate, grade, spread = planned[-3].argv, planned[-2].argv, planned[-1]
    assert spread.script.name == "gpu-claim-spread.py" and "--config=bf16:512" in spread.argv
    assert "--keep-going" in calibrate and calibrate[calibrate.index("--timeout") + 1] == "150"
    assert grade[grade.index("--profile") + 1] == str(tmp_path / "profiles" / "nvidia-h200-x1.toml")


def test_acceptance_dry_run_prints_every_row_step_and_phase_and_starts_nothing(capsys, tmp_path, monkeypatch):
    from harness.acceptance import preflight
    from harness.acceptance.deadline import DEADLINE_S, RESERVE_S
    from harness.acceptance.estimate import estimate
    from harness.acceptance.plan import planned_rows
    from harness.commands import cli

    no_gpu = {"python": "python3", "torch": "2.11.0", "cuda_visible": False, "why_no_cuda": "no NVIDIA driver here"}
    monkeypatch.setattr(preflight, "probe_torch", lambda: no_gpu)
    monkeypatch.setattr(preflight, "horovod_with_nccl", lambda: (False, "Horovod was built without NCCL"))
    assert cli.main(["acceptance", "--dry-run", "--results", str(tmp_path / "r")]) == 1  # no GPU: it would stop
    out = capsys.readouterr().out
    for row in planned_rows(False):
        assert f"plan row {row.name} " in out
    assert "horovod ws=1" in out and "SKIPPED" in out and "calibrate nvidia-h200-x1" in out and "grade against" in out
    assert "first CUDA load" in out and "cuDNN autotune" in out and "the real run would stop: no GPU" in out
    total = float(out.split("expected total ")[1].split()[0])
    assert total == sum(seconds for _, seconds in estimate(planned_rows(False)))
    assert total + RESERVE_S <= DEADLINE_S
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("torch_version", "wheel", "message"), [
    ("2.11.0+cu130", False, "no distlab wheel in"),
    ("2.10.1+cu128", True, "torch 2.10.1 is older than 2.11"),
])
def test_the_offline_gpu_acceptance_refuses_in_one_line(torch_version, wheel, message, tmp_path):
    """docker/gpu-acceptance.sh before it installs anything: the wheels from `make gpu-wheels`, a torch
    recent enough (a stand-in torch package gives the version)."""
    import subprocess
    import sys

    (tmp_path / "stub" / "torch").mkdir(parents=True)
    (tmp_path / "stub" / "torch" / "__init__.py").write_text(f"__version__ = {torch_version!r}\n")
    (tmp_path / "wheels").mkdir()
    if wheel:
        (tmp_path / "wheels" / "distlab-0.1.0-py3-none-any.whl").write_text("")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "stub"), "PYTHON": sys.executable,
           "WHEELS": str(tmp_path / "wheels"), "SITE": str(tmp_path / "site")}
    done = subprocess.run([str(REPO / "docker" / "gpu-acceptance.sh"), "--dry-run"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "site").exists()
