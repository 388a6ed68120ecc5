"""The bandwidth benchmark (labs/allreduce_bench) and the benchmark of the benchmark
(harness/benchmarks/allreduce.py)."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest
from conftest import needs

from harness.benchmarks import allreduce as bench_collectives
from harness.commands import cli
from labs.allreduce_bench import allreduce_bench as bench
from labs.allreduce_bench import nccl_tests
from labs.collectives.primitives import PRIMITIVES, lookup, round_count, unsupported
from labs.common.host import gpu_count
from labs.common.sizes import parse_size

TIMED = [p.name for p in PRIMITIVES if p.bus_factor is not None]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("text", "size"), [("8", 8), ("1K", 1024), ("8M", 8 << 20), ("1G", 1 << 30),
                                            ("64MiB", 64 << 20), ("2kb", 2048)])
def test_sizes_read_like_nccl_tests(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["1.5M", "-8", "M", "8T", ""])
def test_unreadable_sizes_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_size_sweep_is_geometric_and_inclusive():
    assert bench.sizes_between(1024, 8192, 2) == [1024, 2048, 4096, 8192]
    assert bench.sizes_between(1024, 8000, 4) == [1024, 4096]
    assert bench.sizes_between(64, 64, 2) == [64]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_bus_factors_are_the_ones_derived_in_performance_md(n):
    factors = {p.name: p.bus_factor(n) for p in PRIMITIVES if p.bus_factor}
    assert factors == pytest.approx({"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
                                     "reduce_scatter": (n - 1) / n, "all_to_all": (n - 1) / n,
                                     "broadcast": 1, "reduce": 1, "send_recv": 1})


@pytest.mark.parametrize(("argv", "says"), [
    (["-b", "1M", "-e", "1K"], "empty size range"),
    (["-b", "6", "-e", "64"], "-b 6 is not a multiple of the 4-byte float32 element"),
    (["-b", "8", "-e", "1004", "-d", "double"], "-e 1004 is not a multiple of the 8-byte float64 element"),
    (["-n", "0"], "at least one timed iteration"),
    (["-f", "1", "-b", "8", "-e", "64"], "step factor must be at least 2"),
    (["--collective", "allgatherv"], "unknown 'allgatherv'"),
    (["--collective", "barrier"], "no bandwidth"),
    (["-d", "int8"], "unknown 'int8'"),
    (["-o", "mean"], "invalid choice: 'mean'"),
    (["--backend", "ucc"], "invalid choice: 'ucc'"),
    (["-b", "lots"], "not a number of bytes"),
    (["--backend", "horovod", "--collective", "reduce"], "nothing to measure on horovod: Horovod has no reduce"),
    (["--backend", "mpi", "-o", "avg"], "nothing to measure on mpi: MPI has no average op"),
])
def test_bad_input_is_a_one_line_error(run_main, argv, says):
    code, err = run_main(bench.main, "allreduce_bench.py", *argv)
    assert code == 2
    assert says in err.strip().splitlines()[-1]


def assert_valid_bench_record(result, backend: str, world_size: int, collectives: list[str], sizes: list[int]) -> None:
    """Every row: busbw = algbw x factor, algbw = size / time, min <= avg <= max, no wrong element; n/a with reasons."""
    assert result.returncode == 0, result.output[-4000:]
    record = result.record
    metrics = record["metrics"]
    assert record["status"] == "ok" and record["checks"]["no_wrong_elements"]["passed"]
    assert metrics["world_size"] == world_size and metrics["collectives"] == collectives
    seen = set()
    for row in metrics["rows"]:
        primitive = lookup(row["collective"])
        assert row["count"] == round_count(primitive, row["count"], world_size)
        assert row["size"] == row["count"] * 4
        for mode in ("out-of-place", "in-place"):
            measured = row[mode]
            reason = unsupported(primitive, backend, mode, "float32", "sum" if primitive.reduces else None, world_size)
            if reason:
                assert measured == {"na": reason}
                assert metrics["not_available"][row["collective"]][mode] == reason
                continue
            seen.add((row["collective"], mode))
            assert measured["wrong"] == 0
            assert measured["time_us_min"] <= measured["time_us"] <= measured["time_us_max"]
            assert measured["algbw_gbps"] == pytest.approx(row["size"] / (measured["time_us"] * 1e-6) / 1e9)
            assert measured["busbw_gbps"] == pytest.approx(measured["algbw_gbps"] * primitive.bus_factor(world_size))
    for name in collectives:  # every size of the sweep, rounded down to whole chunks like nccl-tests, or skipped
        counts = [round_count(lookup(name), s // 4, world_size) for s in sizes]
        assert [r["size"] for r in metrics["rows"] if r["collective"] == name] == [c * 4 for c in counts if c]
        assert [s["size"] for s in metrics["skipped"] if s["collective"] == name] == [
            s for s, c in zip(sizes, counts, strict=True) if not c]
    assert {name for name, _ in seen} == set(collectives)  # each collective measured in at least one mode
    assert metrics["plot"] == "busbw.png"
    assert (result.run_dir / "busbw.png").read_bytes().startswith(PNG)
    for column in ("size", "count", "redop", "algbw", "busbw", "#wrong", "out-of-place", "in-place"):
        assert column in result.output


# World sizes 3 and 4 make the bus factors differ from 1 and 1/2, so a wrong factor cannot hide.
# Horovod's calls are checked by the collectives lab's tests; the bench code around them is the same.
@pytest.mark.integration
@pytest.mark.parametrize(("backend", "world_size"), [pytest.param(*case, marks=needs(None, case[0]))
                                                     for case in [("gloo", 4), ("mpi", 3)]])
def test_bench_writes_a_valid_record_for_every_collective(distlab_run, backend, world_size):
    timed = TIMED
    # 8 bytes is 2 float32 elements: too few to split across more ranks, so chunked collectives skip it.
    result = distlab_run("allreduce_bench", world_size, backend=backend,
                         lab_args=["-b", "8", "-e", "8K", "-f", "32", "-w", "1", "-n", "2",
                                   "--collective", ",".join(timed)])
    assert_valid_bench_record(result, backend, world_size, timed, [8, 256, 8192])


@pytest.mark.integration
def test_a_corrupted_result_fails_the_bench(distlab_run):
    result = distlab_run("allreduce_bench", 1, launcher="python", backend="gloo",
                         lab_args=["--smoke", "-e", "4K", "--collective", "all_reduce,all_gather", "--corrupt"])
    assert result.returncode == 1, result.output[-3000:]
    assert result.record["checks"]["no_wrong_elements"]["passed"] is False
    rows = result.record["metrics"]["rows"]
    wrong = [row[mode].get("wrong") for row in rows for mode in ("out-of-place", "in-place")]
    assert wrong == [None, 1, None, 1, 1, 1, 1, 1]  # n/a (torch all_reduce is in place only) or 1: the one overwritten
    assert "Out of bounds values : 6 FAILED" in result.output


def test_nccl_tests_output_is_read_in_place():
    stdout = """\
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
     1048576        262144     float     sum      -1    38.50   27.24   47.67      0    37.94   27.64   48.37      0
     2097152        524288     float     sum      -1    51.20   40.96   71.68      0    50.10   41.86   73.25      0
# Avg bus bandwidth    : 60.2
"""
    assert bench_collectives.parse_nccl_tests(stdout) == {1048576: 48.37, 2097152: 73.25}


def test_the_verdict_is_the_median_of_paired_ratios():
    library = bench_collectives.LIBRARIES["gloo"]
    # Per pair (bench, reference): at 1 MiB the ratios are 0.5, 1.0, 2.0 (one slow and one fast outlier);
    # at 2 MiB the machine slowed both sides alike in the second pair, and every ratio is 0.9.
    mib = 1 << 20
    pairs = [({mib: 1.0, 2 * mib: 0.9}, {mib: 2.0, 2 * mib: 1.0}),
             ({mib: 3.0, 2 * mib: 0.18}, {mib: 3.0, 2 * mib: 0.2}),
             ({mib: 2.0, 2 * mib: 0.9}, {mib: 1.0, 2 * mib: 1.0})]
    one, two = bench_collectives.compare(library, [mib, 2 * mib], pairs, target=0.95)["rows"]
    assert (one["ratio"], one["passed"], one["ratio_min"], one["ratio_max"]) == (1.0, True, 0.5, 2.0)
    assert (one["ratio_q1"], one["ratio_q3"]) == pytest.approx((0.75, 1.5))  # halfway to each neighbour of 1.0
    assert one["ratios"] == [0.5, 1.0, 2.0] and one["pairs"] == 3
    assert (one["bench_busbw_gbps"], one["reference_busbw_gbps"]) == (2.0, 2.0)
    # A 10% cost in every pair fails, even with one pair five times slower on both sides.
    assert two["ratio"] == pytest.approx(0.9) and two["passed"] is False
    assert two["ratio_min"] == pytest.approx(0.9) and two["ratio_max"] == pytest.approx(0.9)


def test_a_size_missing_from_a_run_is_compared_on_the_other_pairs():
    library = bench_collectives.LIBRARIES["mpi"]
    pairs = [({8: 1.0}, {8: 1.0, 16: 2.0}), ({8: 1.0, 16: 3.0}, {8: 2.0, 16: 3.0})]
    rows = bench_collectives.compare(library, [8, 16], pairs, 0.95)["rows"]
    assert [(r["size"], r["ratios"]) for r in rows] == [(8, [1.0, 0.5]), (16, [1.0])]
    assert rows[0]["ratio"] == 0.75 and rows[0]["passed"] is False and rows[1]["passed"] is True


@pytest.mark.integration
def test_benchmark_of_the_benchmark_reports_a_ratio_per_size(tmp_path):
    out = tmp_path / "bench.json"
    code = cli.main(["bench", "allreduce", "--libraries", "gloo,nccl", "-b", "64K", "-e", "128K", "-w", "1", "-n",
                     "3", "--pairs", "1", "--warmup-pairs", "0", "--out", str(out)])
    summary = json.loads(out.read_text())
    assert summary["target"] == bench_collectives.TARGET == 0.95  # the target the module's docstring states
    gloo, nccl = summary["results"]
    assert gloo["library"] == "gloo" and [r["size"] for r in gloo["rows"]] == [65536, 131072]
    for row in gloo["rows"]:
        assert row["bench_busbw_gbps"] > 0 and row["reference_busbw_gbps"] > 0
        assert row["ratios"] == [row["ratio"]] and row["pairs"] == 1  # one pair: its ratio is the median
        assert row["ratio"] == pytest.approx(row["bench_busbw_gbps"] / row["reference_busbw_gbps"])
        assert row["passed"] is (row["ratio"] >= 0.95)
    # nccl runs only with 2 GPUs and nccl-tests on PATH; otherwise it is skipped, saying why.
    if gpu_count() < 2:
        assert nccl == {"library": "nccl", "skipped": f"needs 2 GPUs, {gpu_count()} visible"}
    elif not shutil.which("all_reduce_perf"):
        assert nccl["library"] == "nccl" and "all_reduce_perf is not on PATH" in nccl["skipped"]
    else:
        assert [r["size"] for r in nccl["rows"]] == [65536, 131072] and "skipped" not in nccl
    measured = [row for result in summary["results"] for row in result.get("rows", [])]
    assert code == (0 if all(row["ratio"] >= 0.95 for row in measured) else 1)


# --------------------------------------------------------------------------------- --format nccl-tests
# The parser below follows nccl-tests' documented layout (src/util.cu: writeResultHeader,
# writeBenchmarkLinePreamble, writeBenchmarkLineBody, writeResultFooter), not the lab's code: a
# script written for all_reduce_perf must read the lab's output the same way.

NCCL_COLUMNS = ["size", "count", "type", "redop", "root",
                "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"]


def parse_all_reduce_perf(text: str) -> tuple[list[list[str]], str, str]:
    """(rows as 13 fields each, the out-of-bounds value, the average busbw) of one nccl-tests table."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip("#").split() == NCCL_COLUMNS)
    assert lines[start - 1].lstrip("#").split() == ["out-of-place", "in-place"]
    assert lines[start + 1].lstrip("#").split() == ["(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)", "(us)",
                                                    "(GB/s)", "(GB/s)"]
    rows, out_of_bounds, average = [], None, None
    for line in lines[start + 2:]:
        if line.startswith("# Out of bounds values"):
            out_of_bounds = line.split(":", 1)[1].strip()
        elif line.startswith("# Avg bus bandwidth"):
            average = line.split(":", 1)[1].strip()
            break
        elif not line.startswith("#"):
            rows.append(line.split())
    return rows, out_of_bounds, average


def printed_resolution(text: str) -> float:
    """Half a unit in the last place the text prints: how far the printed number may be from the value."""
    mantissa, _, exponent = text.strip().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (int(exponent or 0) - decimals)


def assert_printed_like_nccl_tests(text: str, value: float, width: int) -> None:
    """The field holds `value` to as many of 2 decimals as its width allows, as nccl-tests' getFloatStr
    prints by magnitude (a time of 10 ms or more keeps 1 decimal in 7 characters): so what is compared
    does not depend on how fast the machine ran."""
    assert len(text) <= width and "e" not in text, text  # an exponent only past 10^7 us or 10^6 GB/s
    decimals = len(text.partition(".")[2])
    assert decimals == 2 or len(f"{value:.{decimals + 1}f}") > width, (text, value)  # no decimal dropped needlessly
    assert float(text) == pytest.approx(value, abs=printed_resolution(text) * (1 + 1e-9))


@pytest.mark.parametrize(("text", "resolution"), [("  12.35", 0.005), ("10635.7", 0.05), (" 123457", 0.5),
                                                  ("1.2e+07", 5e5), ("  0.00", 0.005)])
def test_printed_resolution_is_half_the_last_printed_place(text, resolution):
    assert printed_resolution(text) == pytest.approx(resolution)


# The first case is the one a slower machine printed (10.6 ms per call at 64 KiB), which a test
# that assumed two decimals failed; the rest would pass a printer that drops decimals or misrounds.
@pytest.mark.parametrize(("text", "value", "width", "holds"), [
    ("10635.7", 10635.655, 7, True), ("  12.35", 12.345, 7, True), (" 123457", 123456.7, 7, True),
    ("   12.3", 12.345, 7, False), ("  12.34", 12.3561, 7, False), ("10635.6", 10635.655, 7, False)])
def test_a_printed_field_is_judged_by_its_own_decimals(text, value, width, holds):
    if holds:
        assert_printed_like_nccl_tests(text, value, width)
    else:
        with pytest.raises(AssertionError):
            assert_printed_like_nccl_tests(text, value, width)


@pytest.mark.parametrize(("value", "width", "text"), [(12.345, 7, "  12.35"), (123456.7, 7, " 123457"),
                                                      (1234567.0, 7, "1234567"), (12345678.0, 7, "1.2e+07"),
                                                      (0.004, 6, "  0.00"), (1234567.0, 6, " 1e+06")])
def test_numbers_fit_nccl_tests_widths(value, width, text):
    assert nccl_tests.fixed(value, width) == text


@pytest.mark.integration
def test_nccl_tests_format_is_read_by_an_all_reduce_perf_parser(distlab_run):
    sizes = [1024, 4096, 16384, 65536]
    result = distlab_run("allreduce_bench", 2, backend="gloo",
                         lab_args=["--format", "nccl-tests", "-b", "1K", "-e", "64K", "-f", "4", "-w", "1", "-n", "2"])
    assert result.returncode == 0, result.output[-4000:]
    assert result.run["launcher"] == "torchrun"
    log = (result.run_dir / "rank.0.log").read_text()
    rows, out_of_bounds, average = parse_all_reduce_perf(log)
    recorded = result.record["metrics"]["rows"]
    assert out_of_bounds == "0 OK" and len(rows) == len(recorded) == len(sizes)

    busbws = []
    for fields, row in zip(rows, recorded, strict=True):
        assert len(fields) == 13, fields  # no extra columns: no min/max, no collective name
        assert fields[:5] == [str(row["size"]), str(row["count"]), "float", "sum", "-1"]
        assert int(fields[0]) == 4 * int(fields[1])  # float: 4 bytes
        for half, mode in ((fields[5:9], "out-of-place"), (fields[9:13], "in-place")):
            measured = row[mode]
            if "na" in measured:  # torch's all_reduce has no out-of-place form: nothing invented for it
                assert half == ["N/A"] * 4
                continue
            assert int(half[3]) == measured["wrong"] == 0
            # Each field is the record's value as the format prints it; the record's own arithmetic holds.
            assert_printed_like_nccl_tests(half[0], measured["time_us"], 7)
            assert_printed_like_nccl_tests(half[1], measured["algbw_gbps"], 6)
            assert_printed_like_nccl_tests(half[2], measured["busbw_gbps"], 6)
            assert measured["algbw_gbps"] == pytest.approx(int(fields[0]) / (measured["time_us"] * 1e-6) / 1e9)
            assert measured["busbw_gbps"] == pytest.approx(measured["algbw_gbps"] * 2 * (2 - 1) / 2)  # 2(n-1)/n
            busbws.append(measured["busbw_gbps"])
    assert [r["size"] for r in recorded] == sizes and busbws
    # The Avg line is the mean busbw over every time measured, unrounded, printed with %g (6 digits).
    assert float(average) == pytest.approx(sum(busbws) / len(busbws), rel=1e-5)
    assert float(average) == pytest.approx(result.record["metrics"]["avg_busbw_gbps"], rel=1e-5)
