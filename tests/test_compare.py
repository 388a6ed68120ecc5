"""`distlab compare` (harness/commands/compare.py): the lecture's table generated from runs.

The table's arithmetic on records made here (what each column is a ratio of), the complexity
measured on the real programs, one real study in smoke mode (DDP and FSDP2 through torchrun at
world size 2, then its table rebuilt from the stored runs), and the bad inputs that
must stop with one line and exit 2. The whole study (every tool at world sizes 1 and 2) is
`distlab compare`; labs/PARALLELISM.md has its table and how long it took.
"""

from __future__ import annotations

import json

import pytest

from harness.commands import cli, compare


def run_of(tool: str, world_size: int, step_seconds: float, peaks: list[int]) -> dict:
    return {"tool": tool, "run": f"{tool}/ws{world_size}", "complexity": {"added": 0},
            "metrics": {"world_size": world_size, "step_seconds": step_seconds, "samples_per_second": 64 / step_seconds,
                        "peak_tensor_bytes_per_rank": peaks}}


def test_each_row_is_measured_against_ddp_at_its_own_world_size():
    rows = compare.table_rows([
        run_of("deepspeed-zero3", 2, 0.04, [3 * 2**20, 2 * 2**20]),
        run_of("ddp", 2, 0.02, [4 * 2**20, 4 * 2**20]),
        run_of("ddp", 1, 0.01, [8 * 2**20]),
        run_of("fsdp2", 1, 0.02, [8 * 2**20]),
    ])
    # Ordered by world size, then as the lecture lists the tools.
    assert [(r["tool"], r["world_size"]) for r in rows] == [("ddp", 1), ("fsdp2", 1), ("ddp", 2),
                                                            ("deepspeed-zero3", 2)]
    by = {(r["tool"], r["world_size"]): r for r in rows}
    assert by["deepspeed-zero3", 2]["throughput_vs_ddp"] == pytest.approx(0.5)  # twice DDP's step at size 2
    assert by["fsdp2", 1]["throughput_vs_ddp"] == pytest.approx(0.5)  # against size 1's DDP, not size 2's
    # Peak memory: the largest rank's, and its ratio to DDP's.
    assert by["deepspeed-zero3", 2]["peak_bytes_per_rank"] == 3 * 2**20
    assert by["deepspeed-zero3", 2]["memory_vs_ddp"] == pytest.approx(0.75)
    assert compare.cells(by["deepspeed-zero3", 2])[:4] == ["DeepSpeed ZeRO-3", "2", "3.00", "0.75"]


def test_without_ddp_at_a_world_size_there_is_no_ratio_rather_than_a_wrong_one():
    rows = compare.table_rows([run_of("fsdp2", 2, 0.02, [2**20])])
    assert rows[0]["throughput_vs_ddp"] is None and compare.cells(rows[0])[6] == "-"


def test_complexity_is_the_lines_each_program_adds_to_the_baseline(tmp_path):
    added = {name: compare.lines_added(compare.PROGRAMS / tool.program)["added"]
             for name, tool in compare.TOOLS.items()}
    assert added["single"] == 0  # the baseline against itself
    assert all(added[name] > 0 for name in added if name != "single")
    # ZeRO-1 is DDP with its optimizer replaced: one import more, the optimizer's line changed.
    assert added["zero1"] == added["ddp"] + 2
    assert added["deepspeed-zero1"] > added["fsdp2"] > added["ddp"]
    # Comments, blank lines and the docstring are not code: adding them adds nothing.
    commented = tmp_path / "commented.py"
    baseline = compare.BASELINE.read_text().replace('"""The comparison', '"""A longer docstring.\n\nThe comparison')
    commented.write_text(baseline.replace("        losses = []\n", "        # why: a comment\n\n        losses = []\n"))
    assert commented.read_text() != compare.BASELINE.read_text()
    assert compare.lines_added(commented) == {"added": 0, "removed": 0,
                                               "lines": len(compare.code_lines(compare.BASELINE))}


@pytest.mark.parametrize(("args", "message"), [
    (["--tools", "ddp,megatron"], "unknown tool 'megatron'; choose from: single, ddp, horovod"),
    (["--world-sizes", "0"], "argument --world-sizes"),
    (["--threads", "0"], "argument --threads"),
    (["--", "--smoke"], "distlab compare takes no lab arguments (--smoke); use --smoke or --tools"),
    (["--from", "nowhere"], "nowhere holds no summary.json; give a folder `distlab compare` wrote"),
    (["--tools", "single", "--world-sizes", "2"], "--tools single runs at world size 1 only; add 1 to --world-sizes"),
], ids=["tool", "world-size", "threads", "lab-args", "from", "single-at-2"])
def test_bad_input_gets_one_line_and_exit_2(capsys, tmp_path, args, message):
    assert cli.main(["compare", "--results", str(tmp_path), *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("distlab: error: ") and message in lines[0]
    assert not (tmp_path / "compare").exists()  # nothing started, nothing written


def test_a_summary_of_something_else_is_refused(capsys, tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"schema": "distlab-scale", "rows": []}))
    assert cli.main(["compare", "--from", str(tmp_path)]) == 2
    assert "is not a `distlab compare` summary" in capsys.readouterr().err


@pytest.mark.integration
def test_a_study_in_smoke_mode_writes_the_table_from_its_runs(capsys, tmp_path):
    # FSDP2 beside DDP: the sharded tool against the reference, without DeepSpeed's start-up (seconds
    # of imports and its op build per rank); every tool ran in the study labs/PARALLELISM.md shows.
    assert cli.main(["compare", "--smoke", "--world-sizes", "2", "--tools", "ddp,fsdp2",
                     "--results", str(tmp_path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    study = tmp_path / "compare" / summary["results"].rsplit("/", 1)[-1]
    assert summary["status"] == "ok" and [(r["tool"], r["world_size"]) for r in summary["rows"]] == [
        ("ddp", 2), ("fsdp2", 2)]
    ddp, fsdp2 = summary["rows"]
    assert ddp["throughput_vs_ddp"] == 1.0 and fsdp2["throughput_vs_ddp"] > 0
    # Counted on the ranks (133,904 parameters): DDP holds 4 + 4 + 8 bytes of each, FSDP2 half of
    # that (measured 2.06 and 1.04 MiB); the rest is the batch (16 KiB) and small buffers: 5%.
    assert len(ddp["peak_bytes_by_rank"]) == 2 == len(fsdp2["peak_bytes_by_rank"])
    assert ddp["peak_bytes_per_rank"] == pytest.approx(16 * 133_904, rel=0.05)
    assert fsdp2["peak_bytes_per_rank"] == pytest.approx(8 * 133_904, rel=0.05)
    assert fsdp2["memory_vs_ddp"] == pytest.approx(0.5, rel=0.05)
    for row in summary["rows"]:  # each row from its own run's record, kept in the study
        record = json.loads((study / row["run"] / "record.json").read_text())
        assert record["metrics"]["step_seconds"] == row["step_seconds"]
        assert record["provenance"]["launcher"] == "torchrun"
    for name in ("summary.json", "compare.md", "compare.html", "compare.png"):
        assert (study / name).is_file(), name
    table = (study / "compare.md").read_text()
    assert "| PyTorch DDP | 2 |" in table and "| FSDP2 (fully_shard) | 2 |" in table
    # The table again from the stored runs, nothing run: the same rows.
    before = {p.name for p in study.iterdir()}
    assert cli.main(["compare", "--from", str(study), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["rows"] == summary["rows"] and {p.name for p in study.iterdir()} == before
