"""The parallelism labs (fsdp, tensor_parallel, pipeline) through real torchrun, 2 ranks on gloo.

Each is checked against what a broken implementation would get wrong: sharded training that
leaves the single-process trajectory, memory that is not divided as the formula says, a tensor-
parallel block or a pipeline that computes something else than the whole model, a bubble that is
not what GPipe's order gives; and the bad inputs that must stop with one line and exit code 2.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_deepspeed import TEST_TIMEOUT_S as DEEPSPEED_TIMEOUT_S

from harness.planning import memory as memory_plan

REPO = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
FSDP, TP, PIPELINE = "labs/fsdp/train.py", "labs/tensor_parallel/tensor_parallel.py", "labs/pipeline/pipeline.py"
TIMEOUT = 300  # seconds per launch: generous for a loaded 2-core machine

pytestmark = pytest.mark.integration


def torchrun(program: str, world_size: int, args: list[str], tmp_path: Path, name: str = "run"):
    """Launch like `distlab run` does on one host: a file rendezvous, nothing listening beyond loopback."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    record = run_dir / "record.json"
    command = [TORCHRUN, "--nnodes", "1", "--nproc-per-node", str(world_size), "--rdzv-backend", "c10d",
               "--rdzv-endpoint", str(run_dir / "rendezvous"), "--rdzv-conf", "store_type=file",
               "--local-addr", "127.0.0.1", str(REPO / program), "--backend", "gloo", "--record", str(record), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=REPO,
                          stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout + done.stderr, json.loads(record.read_text()) if record.exists() else None


@pytest.fixture
def refused(monkeypatch, capsys):
    """Call a lab's main(argv) in this process as rank 0 of a job of world_size ranks, for input it
    must refuse before joining the job (so nothing else is needed); return its exit code and the
    last line of its stderr."""

    def call(main, args: list[str], world_size: int = 1) -> tuple[int, str]:
        for name, value in dict(TORCHELASTIC_RUN_ID="refused", RANK="0", LOCAL_RANK="0",
                                WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size)).items():
            monkeypatch.setenv(name, value)
        with pytest.raises(SystemExit) as stop:
            main(args)
        return stop.value.code, capsys.readouterr().err.strip().splitlines()[-1]

    return call


def passed(record) -> dict[str, bool]:
    return {name: check["passed"] for name, check in record["checks"].items()}


def full_parameters(checkpoint: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """A sharded (DCP) checkpoint read whole, without any process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = tmp_path / f"{checkpoint.name}.pt"
    dcp_to_torch_save(checkpoint, whole)
    state = torch.load(whole, weights_only=False)
    return {k: v for k, v in state["model"].items()}


# ------------------------------------------------------------------------------------------------ fsdp

SMOKE_PARAMETERS = 133_904  # the smoke model: 4 blocks of 64 -> 256 -> 64, a 64 -> 16 head
FORMULA = {  # fp32 Adam, bytes per rank at world size 2: parameters, gradients, Adam's m and v
    "ddp": (4, 4, 8),
    "zero1": (4, 4, 8 / 2),
    "fsdp": (4 / 2, 4 / 2, 8 / 2),
}


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory):
    """The three strategies at world size 2, 5 steps each, their final parameters read from their
    sharded checkpoints; then fsdp's checkpoint resumed on 1 rank for 2 more steps."""
    tmp = tmp_path_factory.mktemp("fsdp")
    runs, params = {}, {}
    for strategy in ("ddp", "zero1", "fsdp"):
        runs[strategy] = torchrun(FSDP, 2, ["--smoke", "--strategy", strategy, "--checkpoint",
                                            str(tmp / f"{strategy}.ck")], tmp, strategy)
        if runs[strategy][0] == 0:
            params[strategy] = full_parameters(tmp / f"{strategy}.ck", tmp)
    runs["resumed"] = torchrun(FSDP, 1, ["--smoke", "--strategy", "fsdp", "--steps", "7", "--checkpoint",
                                         str(tmp / "fsdp.ck"), "--resume"], tmp, "resumed")
    return tmp, runs, params


@pytest.mark.long
@pytest.mark.xdist_group("fsdp_runs")
@pytest.mark.parametrize("strategy", ["ddp", "zero1", "fsdp"])
def test_each_strategy_takes_the_single_process_steps_with_the_memory_of_its_formula(fsdp_runs, strategy):
    _, runs, _ = fsdp_runs
    returncode, output, record = runs[strategy]
    assert returncode == 0, output
    assert record["status"] == "ok" and passed(record) == {
        "params_match_single_process": True, "memory_matches_formula": True, "shards_add_up_to_one_copy": True}
    metrics = record["metrics"]
    assert metrics["parameters"] == SMOKE_PARAMETERS
    # The oracle really compared something: training moved the parameters, and the replay agrees.
    assert metrics["oracle_parameters_moved"] > 1e-3
    assert metrics["oracle_relative_difference"] < 1e-2
    # Counted from the tensors each rank holds, against this test's own formula.
    expected = [SMOKE_PARAMETERS * b for b in FORMULA[strategy]]
    for rank in metrics["memory_measured_bytes_per_rank"]:
        got = [rank["param_bytes"], rank["grad_bytes"], rank["optimizer_bytes"]]
        assert sum(got) == pytest.approx(sum(expected), rel=0.10)
        if strategy != "zero1":  # ZeRO-1 hands out whole tensors: its optimizer split is only near even
            assert got == pytest.approx(expected, rel=0.01)
    assert "4 + 4 + 8" in output or "(4 + 4 + 8)/2" in output  # the formula is printed beside the bytes


@pytest.mark.long
@pytest.mark.timeout(DEEPSPEED_TIMEOUT_S)  # the first of these may be what launches tests/test_deepspeed.py's runs
@pytest.mark.xdist_group("fsdp_runs")
@pytest.mark.parametrize(("lab", "strategy", "row"), [
    ("fsdp", "ddp", "DDP"), ("fsdp", "zero1", "ZeRO-1"), ("fsdp", "fsdp", "ZeRO-3/FSDP"),
    ("deepspeed", "1", "ZeRO-1"), ("deepspeed", "2", "ZeRO-2"), ("deepspeed", "3", "ZeRO-3/FSDP"),
])
def test_the_planners_formula_is_what_real_ranks_hold(request, tmp_path_factory, lab, strategy, row):
    # `distlab plan` (harness/planning/memory.py) tells users what each rank will hold: the same runs, its rows.
    if lab == "fsdp":
        _, runs, _ = request.getfixturevalue("fsdp_runs")
        metrics = runs[strategy][2]["metrics"]
    else:  # tests/test_deepspeed.py's run of the three stages (cached: one launch for both files)
        if importlib.util.find_spec("deepspeed") is None:
            pytest.skip("DeepSpeed is the `deepspeed` extra: `make setup` installs it")
        from test_deepspeed import deepspeed_runs

        trained, _ = deepspeed_runs(tmp_path_factory.getbasetemp() / "deepspeed")
        assert trained.returncode == 0, trained.why()
        metrics = {"parameters": trained.record["metrics"]["parameters"],
                   **trained.record["metrics"]["stages"][strategy]}
    states = memory_plan.model_state_bytes(metrics["parameters"], 2, "adam", "fp32", tool="torch" if lab == "fsdp"
                                    else "deepspeed")[row]
    # fp32 training: torch's parameters are the master copy; DeepSpeed's ZeRO keeps one of its own.
    assert states["master"] == (0 if lab == "fsdp" else metrics["parameters"] * 4 / 2)
    for rank in metrics["memory_measured_bytes_per_rank"]:
        assert rank["param_bytes"] == pytest.approx(states["param"], rel=0.01)
        assert rank.get("master_bytes", 0) == pytest.approx(states["master"], rel=0.01)
        # ZeRO-1 (torch) gives whole tensors to ranks, so its optimizer split is only near even.
        assert rank["optimizer_bytes"] == pytest.approx(states["optimizer"],
                                                        rel=0.10 if (lab, row) == ("fsdp", "ZeRO-1") else 0.01)
        if lab == "fsdp":
            assert rank["grad_bytes"] == pytest.approx(states["grad"], rel=0.01)
            assert rank["total_bytes"] == pytest.approx(sum(states.values()), rel=0.10)
        else:
            # DeepSpeed keeps each rank's partition of the reduced gradients whole tensors at a
            # time (up to one 64 KiB weight more than an even split); at stage 1 as at stage 2,
            # with one micro-batch per step, so the ZeRO-1 row's full gradient is an upper bound.
            even, cut = metrics["parameters"] * 4 / 2, 256 * 64 * 4
            assert even * 0.99 <= rank["grad_bytes"] <= even + cut
            assert rank["grad_bytes"] <= states["grad"] + cut


@pytest.mark.long
@pytest.mark.xdist_group("fsdp_runs")
@pytest.mark.parametrize("strategy", ["zero1", "fsdp"])
def test_sharded_strategies_end_with_ddps_parameters(fsdp_runs, strategy):
    _, runs, params = fsdp_runs
    assert runs["ddp"][0] == 0 and runs[strategy][0] == 0
    ddp, sharded = params["ddp"], params[strategy]
    assert ddp.keys() == sharded.keys() and len(ddp) == 4 * 6 + 2
    # Measured here: bit for bit equal at world size 2 (two gradients add up the same in any order).
    # More ranks may sum in another order: 1e-5 allows that, after 5 Adam steps of lr 1e-3 each of
    # which moves a parameter by up to 1e-3, as a skipped gradient all-reduce would.
    assert max((ddp[k] - sharded[k]).abs().max().item() for k in ddp) < 1e-5


@pytest.mark.long
@pytest.mark.xdist_group("fsdp_runs")
def test_a_sharded_checkpoint_resumes_at_another_world_size(fsdp_runs, tmp_path):
    tmp, runs, params = fsdp_runs
    returncode, output, record = runs["resumed"]
    assert returncode == 0, output
    assert record["metrics"]["first_step"] == 5 and record["metrics"]["world_size"] == 1
    # Steps 6 and 7 on one rank, after 5 on two: the single-process replay of all 7 agrees, which it
    # cannot if the checkpoint lost Adam's moments or step count, or a shard.
    assert passed(record)["params_match_single_process"]
    assert record["metrics"]["oracle_relative_difference"] < 1e-2
    resumed = full_parameters(tmp / "fsdp.ck", tmp_path)
    assert max((resumed[k] - params["fsdp"][k]).abs().max().item() for k in resumed) > 1e-4  # it did train on


@pytest.mark.long
@pytest.mark.xdist_group("fsdp_runs")
def test_resuming_another_models_checkpoint_is_refused_and_leaves_it_alone(fsdp_runs, refused):
    from labs.fsdp.train import main

    tmp, runs, _ = fsdp_runs
    checkpoint = tmp / "ddp.ck"
    before = {p.name: p.stat().st_mtime_ns for p in checkpoint.iterdir()}
    assert refused(main, ["--smoke", "--dim", "32", "--checkpoint", str(checkpoint), "--resume"], 2) == (2, (
        f"error: {checkpoint} was saved from another model (blocks.0.norm.weight: [64] there, [32] here); "
        "resume with the --dim/--hidden/--layers/--classes it was saved with, or drop --resume"))
    assert refused(main, ["--smoke", "--layers", "3", "--checkpoint", str(checkpoint), "--resume"])[1].startswith(
        f"error: {checkpoint} was saved from another model (blocks.3.down.bias: not in this one)")
    # A fresh run never writes over a checkpoint either.
    code, message = refused(main, ["--smoke", "--checkpoint", str(checkpoint)])
    assert code == 2 and "already exists and is never overwritten; add --resume" in message
    assert {p.name: p.stat().st_mtime_ns for p in checkpoint.iterdir()} == before


def test_an_unknown_strategy_is_refused(refused):
    from labs.fsdp.train import main

    code, message = refused(main, ["--smoke", "--strategy", "zero3"])
    assert code == 2
    assert "error: argument --strategy: invalid choice: 'zero3'" in message and "'fsdp'" in message


# ------------------------------------------------------------------------------------- tensor parallel


def test_tensor_parallel_block_equals_the_single_process_block(tmp_path):
    returncode, output, record = torchrun(TP, 2, ["--smoke"], tmp_path)
    assert returncode == 0, output
    assert passed(record) == {"dtensor_matches_single_process": True, "by_hand_matches_single_process": True}
    metrics = record["metrics"]
    for version in ("dtensor", "by_hand"):
        differences = metrics[f"{version}_max_relative_difference"]
        # Forward and backward were both compared: output, input gradient, every weight's gradient.
        assert {"output", "input_grad", "grad norm.weight"} <= differences.keys()
        assert max(differences.values()) < 1e-5  # float32 rounding; measured up to 3.5e-7
        # Each rank holds half of up and down (the LayerNorm and down's bias are replicated).
        assert metrics[f"{version}_param_bytes_per_rank"] < 0.51 * metrics["single_process_param_bytes"]


def test_tensor_parallel_refuses_a_width_the_world_size_does_not_divide(tmp_path, refused):
    from labs.tensor_parallel.tensor_parallel import main

    record = tmp_path / "record.json"
    assert refused(main, ["--smoke", "--hidden", "255", "--record", str(record)], world_size=2) == (2, (
        "error: --hidden 255 does not divide over world size 2: each rank holds hidden/world_size columns; "
        "choose --hidden a multiple of 2"))
    assert json.loads(record.read_text())["status"] == "failed"


# -------------------------------------------------------------------------------------------- pipeline


def test_pipeline_by_hand_is_exact_and_its_bubble_follows_the_formula(tmp_path):
    returncode, output, record = torchrun(PIPELINE, 2, ["--micro-batches", "8", "--steps", "2"], tmp_path)
    assert returncode == 0, output
    metrics = record["metrics"]
    assert passed(record) == {"matches_single_process": True}
    assert metrics["param_max_abs_difference"] == metrics["grad_max_abs_difference"] == 0.0
    assert metrics["loss_max_abs_difference"] == 0.0 and len(metrics["train_loss"]) == 2
    assert metrics["bubble_fraction_formula"] == pytest.approx((2 - 1) / (8 + 2 - 1))
    # Neither bubble is bounded by the clock here (a busy machine stretches any step). What holds on
    # any machine is causal: the step by the clock is at least the step GPipe's order allows with the
    # compute times the stages measured, so the idle fraction by the clock is at least the schedule's.
    assert 0.0 < metrics["bubble_fraction_schedule"] < 1.0
    assert metrics["bubble_fraction"] >= metrics["bubble_fraction_schedule"] - 1e-9
    per_stage = metrics["bubble_fraction_per_stage"]
    assert len(per_stage) == 2 and metrics["bubble_fraction"] == pytest.approx(sum(per_stage) / 2)


def pipeline_module():
    spec = importlib.util.spec_from_file_location("pipeline_lab", REPO / PIPELINE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("stages", "micro_batches"), [(2, 8), (4, 4), (3, 1), (1, 5)])
def test_gpipe_order_with_equal_compute_times_idles_the_formula(stages, micro_batches):
    bubbles = pipeline_module().bubble_from_durations([[1.0] * micro_batches] * stages,
                                                      [[2.0] * micro_batches] * stages)
    assert bubbles == pytest.approx([(stages - 1) / (micro_batches + stages - 1)] * stages)


def test_gpipe_order_with_a_slower_last_stage_idles_the_first_stage_more():
    # By hand, 2 stages, 2 micro-batches, the last stage twice as slow: its forwards end at 3 and 5,
    # its backwards at 7 and 9, the first stage's backwards at 8 and 10: 4 of 10 s busy and 8 of 10.
    bubbles = pipeline_module().bubble_from_durations([[1.0, 1.0], [2.0, 2.0]], [[1.0, 1.0], [2.0, 2.0]])
    assert bubbles == pytest.approx([0.6, 0.2])


def test_pipeline_with_torch_pipelining_is_exact(tmp_path):
    returncode, output, record = torchrun(PIPELINE, 2, ["--smoke", "--schedule", "torch"], tmp_path)
    assert returncode == 0, output
    assert passed(record) == {"matches_single_process": True}
    assert record["metrics"]["param_max_abs_difference"] == 0.0


@pytest.mark.parametrize(("args", "message"), [
    (["--layers", "3"], "error: --layers 3 does not divide into 2 stages (world size); choose --layers a multiple "
                        "of 2 or another world size"),
    (["--micro-batches", "1", "--batch", "64"], "error: --micro-batches 1 is fewer than the 2 stages"),
], ids=["layers", "micro-batches"])
def test_pipeline_refuses_what_cannot_be_cut(tmp_path, refused, args, message):
    from labs.pipeline.pipeline import main

    record = tmp_path / "record.json"
    code, line = refused(main, ["--smoke", *args, "--record", str(record)], world_size=2)
    assert code == 2 and line.startswith(message)
    assert json.loads(record.read_text())["status"] == "failed"
