"""`distlab plan` (harness/commands/plan.py, harness/planning/memory.py): the lecture's 7B / 13B / 70B
examples, and the bad inputs that must stop with one line and exit 2. Its formula against the bytes the
fsdp lab counts on real ranks: tests/test_parallelism.py, on the runs it makes of each strategy."""

from __future__ import annotations

import json

import pytest

from harness.commands import cli
from harness.planning import memory as memory_plan

GB = 1e9


def test_7b_on_8_gpus_of_80gb_needs_zero(capsys):
    assert cli.main(["plan", "--params", "7e9", "--gpus", "8", "--gpu-memory", "80GB", "--optimizer", "adam",
                      "--precision", "bf16", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["bytes_per_param"] == {"param": 2, "grad": 2, "master": 4, "optimizer": 8}
    totals = {r["strategy"]: r["total_bytes"] / GB for r in result["strategies"]}
    # 16 bytes x 7e9 = 112 GB replicated; ZeRO-1: 4 x 7 + 12 x 7 / 8; ZeRO-2: 2 x 7 + 14 x 7 / 8; ZeRO-3: 112 / 8.
    assert totals == pytest.approx({"DDP": 112.0, "ZeRO-1": 38.5, "ZeRO-2": 26.25, "ZeRO-3/FSDP": 14.0,
                                    "tensor parallel": 14.0, "pipeline parallel": 14.0})
    fits = {r["strategy"]: r["fits"] for r in result["strategies"]}
    assert fits["DDP"] is False and fits["ZeRO-1"] is True
    assert result["recommendation"]["strategy"] == "ZeRO-1"
    assert "112.0 GB" in result["recommendation"]["reason"]


@pytest.mark.parametrize(("params", "gpus", "expected"), [
    ("1.3B", 8, "DDP"),  # 20.8 GB: a replica fits
    ("13B", 8, "ZeRO-1"),  # 208 GB replicated; 26 + 156/8 = 45.5 GB
    ("30B", 8, "ZeRO-3/FSDP"),  # ZeRO-2: 60 + 420/8 = 112.5 GB; ZeRO-3: 60 GB
    ("70B", 8, "does not fit"),  # 1120 GB / 8 = 140 GB even fully sharded
    ("70B", 32, "ZeRO-3/FSDP"),  # 35 GB
])
def test_the_recommendation_follows_the_model_size(params, gpus, expected):
    result = memory_plan.plan(memory_plan.parameter_count(params), gpus, 80 * GB)
    assert result["recommendation"]["strategy"] == expected


def test_70b_on_8_gpus_says_how_many_it_needs():
    result = memory_plan.plan(70_000_000_000, 8, 80 * GB)
    assert "use at least 16 GPUs" in result["recommendation"]["reason"]  # 1120 GB / 72 GB usable = 15.6


def test_activations_are_estimated_only_when_asked(capsys):
    assert cli.main(["plan", "--params", "7B", "--gpus", "8", "--gpu-memory", "80GB"]) == 0
    assert "activations" not in capsys.readouterr().out.splitlines()[3]  # the table's header
    result = memory_plan.plan(7_000_000_000, 8, 80 * GB, seq_len=4096, batch=1, layers=32, hidden=4096)
    ddp = result["strategies"][0]
    assert ddp["activation_bytes"] == 34 * 4096 * 1 * 4096 * 32  # 18.3 GB
    tensor = next(r for r in result["strategies"] if r["strategy"] == "tensor parallel")
    assert tensor["activation_bytes"] == ddp["activation_bytes"] / 8


@pytest.mark.parametrize(("args", "message"), [
    (["--params=-7e9"], "argument --params: '-7e9' must be more than 0"),
    (["--params", "7X"], "argument --params: unknown unit 'X' in '7X'"),
    (["--gpu-memory", "80PB"], "argument --gpu-memory: unknown unit 'PB' in '80PB'"),
    (["--gpus", "0"], "argument --gpus: 0 is less than 1"),
    (["--optimizer", "lion"], "argument --optimizer: invalid choice: 'lion'"),
    (["--seq-len", "4096"], "--seq-len and --batch go together"),
], ids=["negative", "unit", "memory-unit", "no-gpus", "optimizer", "seq-len-alone"])
def test_bad_values_get_one_line_and_exit_2(capsys, args, message):
    base = {"--params": "7e9", "--gpus": "8", "--gpu-memory": "80GB"}
    given = {a.split("=")[0] for a in args if a.startswith("--")}
    argv = [x for k, v in base.items() if k not in given for x in (k, v)] + args
    assert cli.main(["plan", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distlab: error: ") and message in lines[0]


def test_units_and_counts_are_read_as_written():
    assert memory_plan.parameter_count("7B") == memory_plan.parameter_count("7e9") == 7_000_000_000
    assert memory_plan.parameter_count("125M") == 125_000_000
    assert memory_plan.memory_size("80GB") == memory_plan.memory_size("80G") == memory_plan.memory_size("80") == 80e9
    assert memory_plan.memory_size("80GiB") == 80 * 2**30
    assert memory_plan.memory_size("24576MiB") == 24 * 2**30


def test_deepspeed_keeps_an_fp32_master_copy_in_fp32_and_each_row_names_its_tools(capsys):
    # labs/deepspeed counts it on real ranks (tests/test_parallelism.py): torch's fp32 Adam steps on
    # the parameters themselves, DeepSpeed's ZeRO on a flat fp32 copy of them, sharded from stage 1.
    assert cli.main(["plan", "--params", "1e9", "--gpus", "2", "--gpu-memory", "80GB", "--precision", "fp32",
                     "--tool", "deepspeed", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["bytes_per_param"] == {"param": 4, "grad": 4, "master": 4, "optimizer": 8}
    totals = {r["strategy"]: r["total_bytes"] / GB for r in result["strategies"]}
    # 4 + 4 + 12/2, 4 + 16/2, 20/2; DDP (no DeepSpeed) keeps no master copy in fp32.
    assert totals["ZeRO-1"] == pytest.approx(14.0) and totals["ZeRO-2"] == pytest.approx(12.0)
    assert totals["ZeRO-3/FSDP"] == pytest.approx(10.0) and totals["DDP"] == pytest.approx(16.0)
    torch_totals = {r["strategy"]: r["total_bytes"] / GB for r in memory_plan.plan(1_000_000_000, 2, 80 * GB,
                                                                              precision="fp32")["strategies"]}
    assert torch_totals["ZeRO-1"] == pytest.approx(12.0)
    tools = {r["strategy"]: r["tools"] for r in result["strategies"]}
    assert "DeepSpeed 1" in tools["ZeRO-1"] and "DeepSpeed 2" in tools["ZeRO-2"]
    assert "DeepSpeed 3" in tools["ZeRO-3/FSDP"] and "FSDP2" in tools["ZeRO-3/FSDP"]
