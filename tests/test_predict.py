"""`distlab predict`: the alpha-beta formulas, worked by hand, the fits and calibration, the CLI."""

from __future__ import annotations

import json

import pytest

from harness.commands import cli, predict
from harness.planning import step_model
from harness.planning.step_model import Host, Link, Step
from harness.usage import UsageError

PNG = b"\x89PNG\r\n\x1a\n"
LINK = Link("test", alpha=1e-5, beta=1e-9)  # 10 us per step, 1 GB/s


# ------------------------------------------------------------------------------ collectives by hand


@pytest.mark.parametrize(("p", "ring", "tree"), [
    (1, 0.0, 0.0),  # one rank sends nothing
    (2, 2 * 1e-5 + 1e6 * 1e-9, 2 * 1e-5 + 2e6 * 1e-9),  # ring: 2(1) alpha + 2(1/2) n beta; tree: 2 log2(2) alpha
    (4, 6e-5 + 1.5e-3, 4e-5 + 2e-3),  # 2(3) alpha + 2(3/4) n beta;  2(2) alpha + 2 n beta
    (5, 8e-5 + 1.6e-3, 6e-5 + 2e-3),  # log2(5) rounds up to 3 hops of the tree
])
def test_allreduce_costs_are_the_ring_and_tree_formulas(p, ring, tree):
    assert step_model.ring_allreduce(1e6, p, LINK) == pytest.approx(ring)
    assert step_model.tree_allreduce(1e6, p, LINK) == pytest.approx(tree)


def test_all_gather_and_reduce_scatter_are_each_half_a_ring_all_reduce():
    assert step_model.ring_allgather(1e6, 4, LINK) == pytest.approx(3e-5 + 0.75e-3)
    assert step_model.ring_reduce_scatter(1e6, 4, LINK) == pytest.approx(3e-5 + 0.75e-3)
    assert step_model.ring_allgather(1e6, 1, LINK) == 0.0


def test_the_ring_wins_on_bandwidth_and_the_tree_on_latency():
    # 1 KB at 1024 ranks: the ring pays 2 x 1023 steps (20.5 ms), the tree 2 x 10 (0.2 ms).
    assert step_model.allreduce(1e3, 1024, LINK) == pytest.approx(step_model.tree_allreduce(1e3, 1024, LINK))
    assert step_model.tree_allreduce(1e3, 1024, LINK) == pytest.approx(20 * 1e-5 + 2e3 * 1e-9)
    # 100 MB at 4 ranks: the ring moves 1.5 n, the tree 2 n.
    assert step_model.allreduce(1e8, 4, LINK) == pytest.approx(6e-5 + 0.15)


def test_gradients_are_cut_into_buckets_of_the_cap():
    assert step_model.buckets(300, 100) == [100, 100, 100]
    assert step_model.buckets(250, 100) == [100, 100, 50]
    assert step_model.buckets(50, 100) == [50]


# ------------------------------------------------------------------------------------ steps by hand
# compute 3 samples x 10 ms = 30 ms: forward 10 ms, backward 20 ms; 3 buckets of 100 bytes, each
# all-reduced over 2 ranks in 10 ms (ring: 2 (1/2) 100 x 1e-4), ready at 16.7, 23.3 and 30 ms.
STEP = Step("hand", compute_per_sample=0.01, grad_bytes=300, per_rank_batch=3, units=2)
SLOW = Link("slow", alpha=0.0, beta=1e-4)


def test_ddp_overlaps_buckets_with_the_backward():
    # ends: 16.7 + 10 = 26.7; max(23.3, 26.7) + 10 = 36.7; max(30, 36.7) + 10 = 46.7 ms
    full = step_model.ddp_step(STEP, 2, SLOW, Host(), bucket_bytes=100)
    assert full["step"] == pytest.approx(0.03 + 0.01 / 3 * 5)
    assert full["compute"] == pytest.approx(0.03) and full["comm_total"] == pytest.approx(0.03)
    none = step_model.ddp_step(STEP, 2, SLOW, Host(overlap=0.0), bucket_bytes=100)
    assert none["step"] == pytest.approx(0.06)  # every bucket after the backward: 30 + 3 x 10
    half = step_model.ddp_step(STEP, 2, SLOW, Host(overlap=0.5), bucket_bytes=100)
    assert half["step"] == pytest.approx(0.03 + 0.5 * 0.05 / 3 + 0.5 * 0.03)
    assert step_model.ddp_step(STEP, 1, SLOW, Host(), bucket_bytes=100)["step"] == pytest.approx(0.03)


def test_ranks_sharing_cores_slow_compute_and_communication_alike():
    host = Host(cores=2, threads=1, overlap=0.0)
    assert host.contention(2) == 1.0 and host.contention(4) == 2.0 and Host().contention(1024) == 1.0
    # 4 ranks on 2 cores: compute 60 ms; 3 buckets of ring 2 (3/4) 100 x 1e-4 = 15 ms, twice as slow: 90 ms
    shared = step_model.ddp_step(STEP, 4, SLOW, host, bucket_bytes=100)
    assert shared["compute"] == pytest.approx(0.06) and shared["step"] == pytest.approx(0.06 + 3 * 0.03)


def test_ranks_side_by_side_slow_the_compute_from_two_ranks_on():
    host = Host(side_by_side=1.5)
    assert step_model.ddp_step(STEP, 1, SLOW, host)["compute"] == pytest.approx(0.03)
    assert step_model.ddp_step(STEP, 2, SLOW, host)["compute"] == pytest.approx(0.045)
    assert step_model.fsdp_step(STEP, 2, SLOW, host)["compute"] == pytest.approx(0.045)


def test_fsdp_gathers_twice_and_scatters_once_per_unit():
    # 2 units of 150 bytes at 2 ranks: all-gather and reduce-scatter (1/2) 150 x 1e-4 = 7.5 ms each;
    # per unit forward 5 ms, backward 10 ms.
    # forward  = 7.5 + max(7.5, 5) + 5 = 20 ms; backward = 7.5 + max(15, 10) + 10 + 7.5 = 40 ms
    fsdp = step_model.fsdp_step(STEP, 2, SLOW, Host())
    assert fsdp["step"] == pytest.approx(0.06) and fsdp["comm_total"] == pytest.approx(2 * 3 * 0.0075)
    assert step_model.fsdp_step(STEP, 1, SLOW, Host())["step"] == pytest.approx(0.03)
    # without overlap every collective waits: 30 + 2 units x (7.5 + 7.5 + 7.5) = 75 ms
    assert step_model.fsdp_step(STEP, 2, SLOW, Host(overlap=0.0))["step"] == pytest.approx(0.075)


def test_table_rows_give_throughput_and_efficiency_over_one_rank():
    rows = step_model.table_rows(STEP, SLOW, Host(), [1, 2])
    one, two = rows
    assert one["ddp_efficiency"] == 1.0 and one["ddp_samples_per_s"] == pytest.approx(3 / 0.03)
    assert two["ddp_step_s"] == pytest.approx(step_model.ddp_step(STEP, 2, SLOW, Host())["step"])
    assert two["ddp_samples_per_s"] == pytest.approx(6 / two["ddp_step_s"])
    assert two["ddp_efficiency"] == pytest.approx(0.03 / two["ddp_step_s"])
    assert two["fsdp_efficiency"] == pytest.approx(0.03 / 0.06)


def test_published_tiers_carry_a_node_over_nvlink_and_more_over_infiniband():
    table = predict.load_table()
    links = predict.published_links(table, alpha_us=None)
    assert sorted(links) == [8, 1024]
    rows = step_model.table_rows(predict.published_step(table, "resnet18"), links, Host(), [1, 8, 16, 1024])
    assert [r["link"] for r in rows] == ["dgx-h100-nvlink", "dgx-h100-nvlink", "ib-ndr-400", "ib-ndr-400"]
    assert links[8].busbw_gbps == pytest.approx(460) and links[1024].busbw_gbps == pytest.approx(400)  # low ends
    for name, row in table["interconnects"].items():
        assert row["busbw_source"].count("https://") == 1, name  # every figure names where it was published
    seven = predict.published_step(table, "transformer-7b")
    assert seven.compute_per_sample == pytest.approx(6 * 7e9 * 4096 / (989.4e12 * 0.4), rel=1e-3)


# ------------------------------------------------------------------------------ fits and calibration


def test_the_link_fit_recovers_alpha_and_beta_of_the_ring():
    true = Link("true", alpha=5e-6, beta=2e-10)
    points = [(n, step_model.ring_allreduce(n, 4, true)) for n in (1024, 65536, 1 << 20, 16 << 20)]
    fitted = step_model.fit_link(points, 4)
    assert fitted.alpha == pytest.approx(5e-6, rel=1e-6) and fitted.beta == pytest.approx(2e-10, rel=1e-6)


def test_a_fit_needs_two_ranks_and_two_sizes():
    with pytest.raises(UsageError, match="one rank measures no communication"):
        step_model.fit_link([(8, 1.0), (16, 2.0)], 1)
    with pytest.raises(UsageError, match="fewer than 2 sizes"):
        step_model.fit_link([(8, 1.0)], 2)


def study(tmp_path, steps: dict[int, list[float]], no_sync: float = 0.03, cores: int = 2):
    """A scale study folder as `distlab scale` writes it: per world size, one run per step time given."""
    rows = []
    for ws, times in steps.items():
        runs = []
        for i, seconds in enumerate(times):
            run = tmp_path / f"ws{ws}-{i}"
            run.mkdir()
            metrics = {"step_seconds": seconds, "step_seconds_no_sync": no_sync, "img_per_sec": 3 * ws / seconds,
                       "per_rank_batch": 3, "allreduce_bytes": 300}
            (run / "record.json").write_text(json.dumps({"metrics": metrics}))
            runs.append(run.name)
        rows.append({"world_size": ws, "per_rank_batch": 3, "runs": runs})
    (tmp_path / "summary.json").write_text(json.dumps({"rows": rows, "threads_per_rank": 1, "cores": cores}))
    return predict.load_study(tmp_path)


def test_the_overlap_is_solved_from_the_two_rank_step(tmp_path):
    halfway = 0.03 + 0.5 * 0.05 / 3 + 0.5 * 0.03  # what h = 0.5 gives (test_ddp_overlaps...)
    measured = study(tmp_path, {1: [0.03], 2: [halfway, 5.0, halfway / 2]})  # the median of 3 repeats
    step = predict.measured_step(measured)
    assert (step.compute_per_sample, step.grad_bytes, step.per_rank_batch) == (0.01, 300, 3)
    host = predict.calibrate_host(measured, step, SLOW, bucket_bytes=100)
    assert host.overlap == pytest.approx(0.5) and host.side_by_side == 1.0 and (host.cores, host.threads) == (2, 1)


def test_a_study_without_one_rank_or_a_summary_is_refused(tmp_path):
    with pytest.raises(UsageError, match="not a distlab scale study"):
        predict.load_study(tmp_path)
    with pytest.raises(UsageError, match="no world size 1"):
        study(tmp_path, {2: [0.05], 4: [0.09]})


# ------------------------------------------------------------------------------------------- the CLI


def test_cluster_prediction_prints_its_inputs_and_writes_json_and_a_plot(tmp_path, capsys):
    assert cli.main(["predict", "--cluster", "--max-ranks", "64", "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "PREDICTION (not measured)" in out and "MFU 0.4" in out and "alayanew" in out and "assumed" in out
    (folder,) = tmp_path.iterdir()
    saved = json.loads((folder / "prediction.json").read_text())
    assert [p["name"] for p in saved["predictions"]] == ["resnet18", "transformer-7b"]
    assert [r["ranks"] for r in saved["predictions"][0]["rows"]] == [1, 2, 4, 8, 16, 32, 64]
    assert (folder / "efficiency.png").read_bytes().startswith(PNG)


@pytest.mark.parametrize(("argv", "says"), [
    ([], "give --scale STUDY and --bench RECORD"),
    (["--cluster", "--max-ranks", "1000"], "--max-ranks 1000: give a power of 2"),
    (["--cluster", "--check"], "--check needs --scale STUDY"),
    (["--scale", "nowhere", "--bench", "nothing.json"], "--scale nowhere: not a distlab scale study"),
])
def test_bad_input_is_one_line_and_exit_2(argv, says, tmp_path, capsys):
    assert cli.main(["predict", *argv, "--output", str(tmp_path / "out")]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_check_predicts_the_largest_world_size_from_the_two_smaller(tmp_path):
    # One 300-byte bucket: at 2 ranks it is all-reduced after the backward in 30 ms (2 (1/2) 300 x 1e-4),
    # so the 2-rank step is 60 ms with or without overlap. At 4 ranks on 2 cores everything is twice as
    # slow: compute 60 ms, the bucket 2 x 2 (3/4) 300 x 1e-4 = 90 ms: 150 ms predicted.
    measured = study(tmp_path, {1: [0.03], 2: [0.06], 4: [0.12]})
    result = predict.check(measured, SLOW)
    assert (result["world_size"], result["contention"]) == (4, 2.0)
    assert result["predicted_step_s"] == pytest.approx(0.15) and result["measured_step_s"] == 0.12
    assert result["error"] == pytest.approx(0.15 / 0.12 - 1)
    assert result["predicted_img_per_sec"] == pytest.approx(12 / 0.15)


def test_json_leaves_stdout_to_the_json(tmp_path, capsys):
    assert cli.main(["predict", "--cluster", "--max-ranks", "8", "--json", "--output", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["predictions"][1]["rows"][-1]["ranks"] == 8
    assert "PREDICTION (not measured)" in captured.err
