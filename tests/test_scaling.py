"""labs/scaling and `distlab scale`: the arithmetic on known answers, bad input, and real runs at 1 and 2 ranks."""

import base64
import json
import math
import os
import re
from pathlib import Path

import pytest
from conftest import needs_horovod

from harness.commands import cli, scale
from harness.report import plots
from harness.run import record as records
from harness.usage import UsageError
from harness.verdict import stats
from labs.common.host import gpu_count

# --------------------------------------------------------------------------------- the arithmetic


def test_efficiency_and_speedup_against_one_rank():
    assert stats.speedup(180.0, 100.0) == pytest.approx(1.8)
    assert stats.efficiency(180.0, 2, 100.0) == pytest.approx(0.9)
    assert stats.efficiency(400.0, 4, 100.0) == pytest.approx(1.0)


def test_efficiency_against_a_larger_baseline_is_per_rank_throughput_ratio():
    # 2 ranks make 180 img/s (90 each); 8 ranks making 630 (78.75 each) are 87.5% as efficient.
    assert stats.efficiency(630.0, 8, 180.0, base_world_size=2) == pytest.approx(78.75 / 90)


def test_amdahl_fit_recovers_a_known_serial_fraction():
    sizes = [1, 2, 4, 8, 16]
    speedups = [stats.amdahl_speedup(n, 0.1) for n in sizes]
    assert stats.fit_amdahl(sizes, speedups) == pytest.approx(0.1, abs=1e-6)


def test_amdahl_fit_relative_to_a_larger_baseline():
    sizes = [2, 4, 8]
    speedups = [stats.amdahl_speedup(n, 0.05) / stats.amdahl_speedup(2, 0.05) for n in sizes]
    assert stats.fit_amdahl(sizes, speedups, base_world_size=2) == pytest.approx(0.05, abs=1e-6)


def test_amdahl_fit_with_two_points_is_exact_and_bounded():
    # S(2) = 1 / (s + (1 - s) / 2)  =>  s = 2 / S - 1
    assert stats.fit_amdahl([1, 2], [1.0, 1.6]) == pytest.approx(2 / 1.6 - 1, abs=1e-6)
    assert stats.fit_amdahl([1, 2], [1.0, 2.3]) == pytest.approx(0.0, abs=1e-9)  # superlinear: s stays >= 0
    assert stats.fit_amdahl([1, 2], [1.0, 0.7]) == pytest.approx(1.0, abs=1e-6)  # slower than one rank


def test_amdahl_fit_is_least_squares_on_noisy_speedups():
    sizes = [1, 2, 4, 8]
    speedups = [1.0, 1.9, 3.3, 5.0]
    fitted = stats.fit_amdahl(sizes, speedups)

    def error(s):
        return sum((m - stats.amdahl_speedup(n, s)) ** 2 for n, m in zip(sizes, speedups, strict=True))

    assert all(error(fitted) <= error(fitted + d) for d in (-1e-4, 1e-4))


def test_rows_give_mean_ci_speedup_and_efficiency():
    def run(ws, total):
        return {"img_per_sec": total, "img_per_sec_per_rank": total / ws, "per_rank_batch": 8,
                "global_batch": 8 * ws, "step_seconds": 0.1, "step_seconds_no_sync": 0.08, "comm_seconds": 0.02,
                "allreduce_seconds": 0.05, "comm_fraction": 0.2, "overlap": None if ws == 1 else 0.6}

    rows, serial = scale.scaling_rows({1: [run(1, t) for t in (10, 12, 14)], 2: [run(2, t) for t in (18, 20, 22)]})
    one, two = rows
    assert one["img_per_sec"]["mean"] == pytest.approx(12)
    half_width = 4.303 * 2 / math.sqrt(3)  # t(0.975, 2 dof) x sd / sqrt(n)
    assert (one["img_per_sec"]["ci95_low"], one["img_per_sec"]["ci95_high"]) == pytest.approx(
        (12 - half_width, 12 + half_width))
    assert two["speedup"] == pytest.approx(20 / 12)
    assert two["efficiency"] == pytest.approx(20 / (2 * 12))
    assert two["img_per_sec_per_rank"]["mean"] == pytest.approx(10)
    assert (one["overlap"], two["overlap"]) == (None, pytest.approx(0.6))
    assert serial == pytest.approx(2 / (20 / 12) - 1, abs=1e-6)


def test_one_repeat_has_no_interval():
    rows, serial = scale.scaling_rows({1: [{"img_per_sec": 5.0, "img_per_sec_per_rank": 5.0, "per_rank_batch": 1,
                                            "global_batch": 1}]})
    assert rows[0]["img_per_sec"]["n"] == 1 and serial is None


# ------------------------------------------------------------------------------------- batch sizes


def test_weak_scaling_keeps_the_per_rank_batch():
    assert scale.rank_batches("weak", [1, 2, 4], 32, None) == {1: 32, 2: 32, 4: 32}
    assert scale.rank_batches("weak", [1, 2], None, None) == {1: None, 2: None}  # the lab's default


def test_strong_scaling_splits_the_global_batch():
    assert scale.rank_batches("strong", [1, 2, 4], None, 128) == {1: 128, 2: 64, 4: 32}


@pytest.mark.parametrize(("mode", "batch", "global_batch", "message"), [
    ("strong", None, 6, "does not split evenly over world size(s) 4; choose a multiple of 4"),
    ("strong", None, None, "needs --global-batch"),
    ("strong", 8, 64, "--batch is for --mode weak"),
    ("weak", None, 64, "--global-batch is for --mode strong"),
])
def test_batch_settings_that_cannot_work(mode, batch, global_batch, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        scale.rank_batches(mode, [1, 2, 4], batch, global_batch)


def test_records_must_show_the_batches_asked_for():
    def metrics(per_rank, total):
        return [{"per_rank_batch": per_rank, "global_batch": total}]

    asked = {1: 8, 2: 4}
    assert scale.batch_mismatches("strong", asked, 8, {1: metrics(8, 8), 2: metrics(4, 8)}) == []
    problems = scale.batch_mismatches("strong", asked, 8, {1: metrics(8, 8), 2: metrics(8, 16)})
    assert problems == ["world size 2: per-rank batch 8, asked 4", "world size 2: global batch 16, asked 8"]
    assert scale.batch_mismatches("weak", {1: None, 2: None}, None, {1: metrics(8, 8), 2: metrics(4, 8)}) == [
        "weak scaling ran different per-rank batches: 1: 8, 2: 4"]


# ------------------------------------------------------------------------------------ host capacity


def test_cpu_allows_four_times_the_cores_and_says_when_oversubscribed():
    scale.check_capacity([1, 2, 8], threads=1, cores=2, gpus=0, on_gpu=False)
    scale.check_capacity([1, 4], threads=2, cores=2, gpus=0, on_gpu=False)
    with pytest.raises(UsageError, match="world size 9 x 1 thread.*this host has 2"):
        scale.check_capacity([1, 9], threads=1, cores=2, gpus=0, on_gpu=False)
    assert [scale.oversubscribed(ws, 1, 2) for ws in (1, 2, 3)] == [False, False, True]


def test_gpu_runs_need_a_gpu_per_rank():
    scale.check_capacity([1, 2], threads=1, cores=2, gpus=2, on_gpu=True)
    with pytest.raises(UsageError, match="world size 4 needs 4 GPU"):
        scale.check_capacity([1, 2, 4], threads=1, cores=64, gpus=2, on_gpu=True)


# --------------------------------------------------------------------------- bad input, end to end

TOO_MANY = str(4 * (os.cpu_count() or 1) + 1)


@pytest.mark.parametrize(("argv", "message"), [
    (["--world-sizes", ""], "empty"),
    (["--world-sizes", "2,1"], "increasing"),
    (["--world-sizes", "1,2,2"], "increasing"),
    (["--world-sizes", "0,1"], "at least 1"),
    (["--world-sizes", "1,two"], "comma-separated"),
    (["--world-sizes", f"1,{TOO_MANY}"], "oversubscribed"),
    (["--world-sizes", "1,2,4", "--mode", "strong", "--global-batch", "6"], "does not split evenly"),
    (["--world-sizes", "1,2", "--lab", "horovod", "--backend", "gloo"], "--backend is for --lab ddp"),
    (["--world-sizes", "1,2", "--", "--batch-size", "8"], "--batch-size after -- is set by distlab scale"),
    (["--world-sizes", "1,2", "--launcher", "srun"], "launcher"),
])
def test_bad_input_is_one_line_exit_2_and_starts_nothing(tmp_path, capsys, argv, message):
    results = tmp_path / "results"
    assert cli.main(["scale", "--results", str(results), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not results.exists()


def test_nccl_without_gpus_is_refused(tmp_path, capsys):
    if gpu_count():
        pytest.skip("GPUs are visible here")
    assert cli.main(["scale", "--world-sizes", "1,2", "--backend", "nccl", "--results", str(tmp_path / "r")]) == 2
    assert "nccl" in capsys.readouterr().err and not (tmp_path / "r").exists()


# ------------------------------------------------------------------------- real runs, 1 and 2 ranks

SMOKE = ["--", "--smoke", "--steps", "2"]


@pytest.fixture(autouse=True)
def _no_step_summary(monkeypatch):
    """Studies run here must not land on CI's own job summary page; the test of it sets its own."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def _study(results: Path) -> Path:
    (study,) = (results / "scale").iterdir()
    return study


def _records(study: Path) -> list[dict]:
    return [records.load(path) for path in sorted(study.glob("scaling/*/record.json"))]


def _decimals(cell: str) -> int:
    return len(cell.rstrip("%").split(".")[1]) if "." in cell else 0


def assert_shows(cell: str, value: float, unit: float = 1.0) -> None:
    """The cell is the measured value x unit, rounded to the digits it shows (a % cell: x 100)."""
    expected = value * (100 if cell.endswith("%") else unit)
    assert abs(float(cell.rstrip("%")) - expected) <= 0.5 * 10 ** -_decimals(cell) + 1e-9, (cell, expected)


def markdown_table(markdown: str, first_column: str) -> list[dict[str, str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    start = next(i for i, line in enumerate(lines) if line.split("|")[1].strip() == first_column)
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != len(header):
            break
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def assert_scale_report(study: Path, summary: dict, step_summary: Path) -> None:
    """report.md holds the table of world sizes with summary.json's numbers; report.html embeds every
    plot; the step summary got the Markdown."""
    markdown = (study / "report.md").read_text()
    assert markdown.startswith("# distlab scale: passed")
    table = markdown_table(markdown, "world size")
    assert [int(r["world size"]) for r in table] == [r["world_size"] for r in summary["rows"]]
    for shown, row in zip(table, summary["rows"], strict=True):
        assert (int(shown["batch/rank"]), int(shown["global batch"])) == (row["per_rank_batch"], row["global_batch"])
        assert_shows(shown["img/s"], row["img_per_sec"]["mean"])
        assert_shows(shown["img/s per rank"], row["img_per_sec_per_rank"]["mean"])
        assert_shows(shown["speedup"], row["speedup"])
        assert_shows(shown["efficiency"], row["efficiency"])
        for column, name in (("step ms", "step_seconds"), ("compute ms", "step_seconds_no_sync"),
                             ("comm ms", "comm_seconds"), ("all-reduce alone ms", "allreduce_seconds")):
            assert_shows(shown[column], row[name], unit=1e3)
        assert_shows(shown["comm share"], row["comm_fraction"])
        low, high = (float(x) for x in shown["95% CI"].split(" to "))
        assert (low, high) == pytest.approx((row["img_per_sec"]["ci95_low"], row["img_per_sec"]["ci95_high"]),
                                            abs=0.051)
        assert int(shown["repeats"]) == row["img_per_sec"]["n"]
    assert f"{summary['amdahl_serial_fraction']:.3f}" in markdown
    plots = ["throughput", "speedup", "efficiency", "compute_comm"]
    assert all(f"![{name}]({name}.png)" in markdown for name in plots)

    page = (study / "report.html").read_text()
    embedded = re.findall(r"<img alt='([a-z_]+)' src='data:image/png;base64,([A-Za-z0-9+/=]+)'>", page)
    assert [name for name, _ in embedded] == plots
    for name, data in embedded:
        assert base64.b64decode(data) == (study / f"{name}.png").read_bytes()
    assert page.index("<table>") < page.index("<img")  # the summary first, then the plots
    assert all(f"<td>{r['world_size']}</td>" in page for r in summary["rows"])
    assert step_summary.read_text() == "earlier steps' summary\n" + markdown  # appended, not overwritten


@pytest.mark.integration
def test_weak_scaling_ddp_at_one_and_two_ranks(tmp_path, capsys, monkeypatch):
    results = tmp_path / "results"
    step_summary = tmp_path / "step_summary.md"
    step_summary.write_text("earlier steps' summary\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    drawn = {}
    save = plots.save

    def keep(fig, path):  # the data each figure draws: line and error-bar points by label, bar heights
        ax = fig.axes[0]
        lines = {line.get_label(): line for line in ax.get_lines()}
        lines.update({container.get_label(): container.lines[0] for container in ax.containers
                      if hasattr(container, "has_yerr")})
        drawn[path.stem] = {label: ([float(x) for x in line.get_xdata()], [float(y) for y in line.get_ydata()])
                            for label, line in lines.items() if not label.startswith("_")}
        drawn[path.stem]["bars"] = [patch.get_height() for patch in ax.patches]
        return save(fig, path)

    monkeypatch.setattr(plots, "save", keep)
    code = cli.main(["scale", "--lab", "ddp", "--world-sizes", "1,2", "--repeats", "2", "--batch", "2",
                       "--results", str(results), *SMOKE])
    out = capsys.readouterr().out
    assert code == 0, out
    study = _study(results)
    summary = json.loads((study / "summary.json").read_text())
    runs = _records(study)
    assert len(runs) == 4 and all(r["status"] == "ok" for r in runs)
    assert all(all(check["passed"] for check in r["checks"].values()) for r in runs)
    by_size = {ws: [r["metrics"] for r in runs if r["provenance"]["world_size"] == ws] for ws in (1, 2)}
    assert {ws: [(m["per_rank_batch"], m["global_batch"]) for m in ms] for ws, ms in by_size.items()} == {
        1: [(2, 2), (2, 2)], 2: [(2, 4), (2, 4)]}
    assert all(r["provenance"]["threads_per_rank"] == 1 and r["provenance"]["launcher"] == "torchrun" for r in runs)

    # Efficiency from the records themselves: T(2) / (2 T(1)), T the mean img/s over repeats.
    t1 = sum(m["img_per_sec"] for m in by_size[1]) / 2
    t2 = sum(m["img_per_sec"] for m in by_size[2]) / 2
    one, two = summary["rows"]
    assert two["efficiency"] == pytest.approx(t2 / (2 * t1), rel=1e-12)
    assert two["speedup"] == pytest.approx(t2 / t1, rel=1e-12)
    assert one["img_per_sec"]["n"] == 2 and one["img_per_sec"]["ci95_low"] <= t1 <= one["img_per_sec"]["ci95_high"]
    # Overlap: the share of the lone all-reduce hidden behind compute, 1 - comm / all-reduce clamped to
    # [0, 1], from each record's own timings, averaged over the repeats; one rank has nothing to hide.
    hidden = [min(1.0, max(0.0, 1 - m["comm_seconds"] / m["allreduce_seconds"])) for m in by_size[2]]
    assert one["overlap"] is None and two["overlap"] == pytest.approx(sum(hidden) / 2, rel=1e-12)
    assert 0 <= two["comm_fraction"] < 1 and two["allreduce_seconds"] > 0
    assert summary["amdahl_serial_fraction"] is not None and summary["threads_per_rank"] == 1
    # What each plot draws is the summary's numbers (plots.save kept every figure's data): measured
    # against ideal linear scaling from world size 1, and each step split into compute and comm.
    means = [row["img_per_sec"]["mean"] for row in (one, two)]
    assert drawn["throughput"]["measured"] == ([1, 2], pytest.approx(means, rel=1e-12))
    assert drawn["throughput"]["ideal (linear)"] == ([1, 2], pytest.approx([means[0], 2 * means[0]], rel=1e-12))
    assert drawn["efficiency"]["measured"] == ([1, 2], pytest.approx([1.0, two["efficiency"]], rel=1e-12))
    compute = [row["step_seconds_no_sync"] * 1e3 for row in (one, two)]
    comm = [max(0.0, row["comm_seconds"]) * 1e3 for row in (one, two)]
    assert drawn["compute_comm"]["bars"] == pytest.approx(compute + comm, rel=1e-12)
    assert f"results: {study}" in out
    assert_scale_report(study, summary, step_summary)


@pytest.mark.integration
def test_strong_scaling_splits_the_global_batch_in_real_runs(tmp_path, capsys):
    results = tmp_path / "results"
    # At 2 ranks only: the study's one run shows the split (the weak study above runs world size 1).
    code = cli.main(["scale", "--world-sizes", "2", "--mode", "strong", "--global-batch", "4", "--repeats", "1",
                       "--results", str(results), *SMOKE])
    assert code == 0, capsys.readouterr().out
    runs = _records(_study(results))
    assert [(r["provenance"]["world_size"], r["metrics"]["per_rank_batch"], r["metrics"]["global_batch"])
            for r in runs] == [(2, 2, 4)]


@pytest.mark.integration
@needs_horovod
def test_horovod_scaling_with_fp16_compression(tmp_path, capsys):
    results = tmp_path / "results"
    code = cli.main(["scale", "--lab", "horovod", "--world-sizes", "2", "--repeats", "1", "--batch", "2",
                       "--results", str(results), *SMOKE, "--fp16-allreduce"])
    assert code == 0, capsys.readouterr().out
    study = _study(results)
    (two,) = _records(study)
    assert two["provenance"]["launcher"] == "horovodrun" and two["provenance"]["world_size"] == 2
    assert two["checks"]["allreduce_value"]["passed"] and two["checks"]["params_identical"]["passed"]
    assert two["metrics"]["allreduce_bytes"] == two["metrics"]["parameters"] * 2  # fp16 on the wire
    summary = json.loads((study / "summary.json").read_text())
    assert summary["levers"]["fp16_allreduce"] is True and summary["backend"] == "horovod"
