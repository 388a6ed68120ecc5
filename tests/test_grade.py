"""Grading: bands, confidence intervals, profile schema and selection, reports."""

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import needs_horovod

from harness.commands import calibrate
from harness.report import pages
from harness.verdict import profiles
from harness.verdict.evaluate import band_verdict, evaluate_across, evaluate_cell, grade_verdicts
from harness.verdict.expectations import Band, LabExpectation, Profile
from harness.verdict.profiles import ProfileError, load_profile
from harness.verdict.stats import mean_ci, t95
from harness.verdict.verdicts import Sample, Verdict

REPO = Path(__file__).resolve().parent.parent


def sample(status="ok", wall=10.0, **metrics) -> Sample:
    checks = metrics.pop("checks", {"params_identical": {"passed": True}})
    return Sample("run", status, None if status == "ok" else "boom", wall,
                  {"metrics": metrics, "checks": checks, "status": status})


def test_confidence_interval_matches_student_t():
    interval = mean_ci([10.0, 12.0, 14.0])
    # mean 12, sd 2, t(2) = 4.303: half width 4.303 * 2 / sqrt(3)
    assert interval.mean == 12.0
    assert math.isclose(interval.half_width, 4.303 * 2 / math.sqrt(3), rel_tol=1e-9)
    assert mean_ci([5.0]).low == mean_ci([5.0]).high == 5.0
    assert t95(11) == t95(10) > t95(12)  # between table rows the wider (safer) quantile is used
    with pytest.raises(ValueError):
        mean_ci([])


def test_throughput_is_judged_on_its_interval_so_noise_neither_passes_nor_fails_a_program():
    band = Band("img_per_sec", expected={2: 100.0}, at_least_fraction=0.8)
    assert band_verdict("ddp", 2, band, [sample(img_per_sec=v) for v in (88, 90, 92)]).passed
    # One slow outlier, or two noisy runs whose 95% interval reaches far above and below 80: not
    # comparable (issue 48: never FAIL while the interval reaches the floor), never passed.
    outlier = band_verdict("ddp", 2, band, [sample(img_per_sec=v) for v in (40, 85, 90)])
    assert outlier.passed is None and outlier.measured == "not comparable" and "reaches the floor 80" in outlier.detail
    assert band_verdict("ddp", 2, band, [sample(img_per_sec=v) for v in (40, 100)]).passed is None
    assert band_verdict("ddp", 2, band, [sample(img_per_sec=v) for v in (60, 61, 62)]).passed is False
    assert band_verdict("ddp", 4, band, [sample(img_per_sec=1)]).passed is None  # no expectation at 4


def test_more_repeats_narrow_the_interval_until_it_decides():
    band = Band("img_per_sec", expected={1: 100.0}, at_least_fraction=0.8)
    # A program whose true rate is 75 (below the threshold of 80), measured with noise: one lucky run
    # decides nothing (no spread is known), five still reach 80, ten fail it.
    assert band_verdict("ddp", 1, band, [sample(img_per_sec=85)]).passed is None
    five = (85, 74, 72, 76, 70)
    assert band_verdict("ddp", 1, band, [sample(img_per_sec=v) for v in five]).passed is None
    ten = (*five, 75, 74, 73, 76, 75)
    assert band_verdict("ddp", 1, band, [sample(img_per_sec=v) for v in ten]).passed is False


def test_ratio_bands_compare_with_the_reference_measured_in_the_same_grade():
    band = Band("img_per_sec", at_least_ratio={1: 0.5, 2: 0.4})
    fast = [sample(img_per_sec=v) for v in (80, 84, 90)]
    assert band_verdict("ddp", 1, band, fast, reference=100.0).passed  # [0.73, 0.98] over 0.5
    verdict = band_verdict("ddp", 1, band, fast, reference=200.0)  # the same program on a 2x faster CPU ...
    assert verdict.passed is False and verdict.measured == "0.423"  # ... is judged against that CPU's loop
    assert "against the reference's 200" in verdict.detail and "[0.365, 0.490]" in verdict.detail
    assert band_verdict("ddp", 2, band, fast, reference=200.0).passed is None  # [0.365, 0.490] reaches 0.4
    assert band_verdict("ddp", 4, band, fast, reference=100.0).passed is None  # no expectation at 4
    missing = band_verdict("ddp", 1, band, fast, reference=None)  # the reference loop itself failed
    assert missing.passed is False and "reference loop did not run" in missing.detail


def test_min_max_and_value_tolerance_bands():
    assert band_verdict("ddp", 1, Band("final_accuracy", min=0.5, max=1.0), [sample(final_accuracy=0.6)]).passed
    assert not band_verdict("ddp", 1, Band("final_accuracy", min=0.5), [sample(final_accuracy=0.4)]).passed
    assert band_verdict("x", 1, Band("m", value=1.0, tolerance=0.1), [sample(m=1.05)]).passed
    assert not band_verdict("x", 1, Band("m", value=1.0, tolerance=0.1), [sample(m=1.2)]).passed
    missing = band_verdict("x", 1, Band("m", min=0), [sample(other=1)])
    assert not missing.passed and "lacks metrics.m" in missing.detail


def test_cell_checks_status_required_checks_and_time():
    exp = LabExpectation("ddp", (1, 2), time_budget_s=20, required_checks=("params_identical", "shards_disjoint"))
    verdicts = {v.check: v for v in evaluate_cell(exp, 2, [sample(wall=25.0)])}
    assert verdicts["run"].passed
    assert verdicts["check:params_identical"].passed
    assert not verdicts["check:shards_disjoint"].passed  # a program that does not report it fails
    assert "has no check 'shards_disjoint'" in verdicts["check:shards_disjoint"].detail
    assert not verdicts["time"].passed
    failing = evaluate_cell(exp, 2, [sample(checks={"params_identical": {"passed": False, "digests": 2,
                                                                         "ranks_apart": [0, 1]}})])
    said = {v.check: v for v in failing}["check:params_identical"]
    # In words, never the record's dict as Python prints it ("{'digests': 2, ...}") in a student's feedback.
    assert not said.passed and said.detail == "the record's own check failed: digests 2; ranks apart 0, 1"
    crashed = evaluate_cell(exp, 2, [sample(status="failed")])
    assert not crashed[0].passed and crashed[0].detail == "boom"


def test_accuracy_invariance_and_efficiency_across_world_sizes():
    exp = LabExpectation("ddp", (1, 2, 4), accuracy_delta=0.05, efficiency_min={2: 0.8, 4: 0.8})
    cells = {1: [sample(final_accuracy=0.80, img_per_sec=100) for _ in range(3)],
             2: [sample(final_accuracy=0.78, img_per_sec=180) for _ in range(3)],
             4: [sample(final_accuracy=0.70, img_per_sec=200) for _ in range(3)]}
    verdicts = {(v.world_size, v.check): v for v in evaluate_across(exp, cells)}
    assert verdicts[(2, "accuracy_vs_ws1")].passed
    assert not verdicts[(4, "accuracy_vs_ws1")].passed
    assert verdicts[(2, "efficiency")].measured == "0.900" and verdicts[(2, "efficiency")].passed
    assert verdicts[(4, "efficiency")].measured == "0.500" and not verdicts[(4, "efficiency")].passed


def test_a_data_parallel_row_is_compared_with_the_single_device_rows_world_size_1():
    # ddp graded at 2 and 4 only; the baseline's world size 1 stands for its own: the same global batch
    # must reach the baseline's accuracy, and speed-up is over the baseline's throughput, each over
    # its own reference loop.
    profile = Profile("p", Path("p.toml"), "", False, False, {}, {}, labs={
        "baseline": LabExpectation("baseline", (1,), reference="train_loop"),
        "ddp": LabExpectation("ddp", (2, 4), accuracy_delta=0.05, efficiency_min={2: 0.8, 4: 0.8},
                              reference="train_loop", single_device="baseline")})
    done = {("baseline", 1): [sample(final_accuracy=0.90, img_per_sec=80) for _ in range(2)],
            ("ddp", 2): [sample(final_accuracy=0.88, img_per_sec=120) for _ in range(2)],
            ("ddp", 4): [sample(final_accuracy=0.80, img_per_sec=120) for _ in range(2)]}
    loops = {("baseline", 1): 100.0, ("ddp", 2): 150.0, ("ddp", 4): 200.0}
    verdicts = {(v.lab, v.world_size, v.check): v for v in grade_verdicts(profile, ["baseline", "ddp"], done, loops)}
    assert verdicts["ddp", 2, "accuracy_vs_ws1"].passed
    assert "0.880 at 2 vs 0.900 at 1 (baseline)" in verdicts["ddp", 2, "accuracy_vs_ws1"].detail
    assert not verdicts["ddp", 4, "accuracy_vs_ws1"].passed  # 0.10 below the baseline
    # (120 / 80) / 2 = 0.75, over the loop's own (150 / 100) / 2 = 0.75: 1.0; at 4, 0.375 / 0.5 = 0.75.
    assert verdicts["ddp", 2, "efficiency"].measured == "1.000" and verdicts["ddp", 2, "efficiency"].passed
    assert verdicts["ddp", 4, "efficiency"].measured == "0.750" and not verdicts["ddp", 4, "efficiency"].passed
    assert "(T(1): the baseline's), each run over its reference's rate" in verdicts["ddp", 2, "efficiency"].detail
    assert ("ddp", 1, "accuracy_vs_ws1") not in verdicts
    # Without the baseline's runs (another --world-sizes), nothing to compare with: said, not passed.
    alone = {(v.world_size, v.check): v for v in grade_verdicts(profile, ["ddp"], {("ddp", 2): done["ddp", 2]}, loops)}
    assert alone[2, "accuracy_vs_ws1"].passed is None and alone[2, "efficiency"].passed is None


def test_grading_a_data_parallel_lab_brings_its_single_device_row_along(tmp_path):
    from harness.grading.plan import plan_grade

    plan = plan_grade(load_profile(REPO / "harness/profiles/cpu-grade.toml"), labs=["ddp"], results_root=tmp_path)
    assert plan.labs == ["baseline", "ddp", "ddp-local-bn"]
    assert plan.cells() == [("baseline", 1), ("ddp", 2), ("ddp", 4), ("ddp-local-bn", 4)]


def test_efficiency_against_a_reference_loop_divides_out_what_the_machine_does_to_n_processes():
    # Four ranks on two cores: the loop itself only doubles (efficiency 0.5), so the lab's 0.5 is all
    # the cores allow, and nothing lost to communication; a lab at 0.3 lost 40% to it.
    exp = LabExpectation("ddp", (1, 4), efficiency_min={4: 0.8}, reference="train_loop")
    loops = {1: 100.0, 4: 200.0}
    cells = {1: [sample(img_per_sec=v) for v in (79, 80, 81)], 4: [sample(img_per_sec=v) for v in (159, 160, 161)]}
    verdict = next(v for v in evaluate_across(exp, cells, references=loops) if v.check == "efficiency")
    assert verdict.measured == "1.000" and verdict.passed
    assert "each run over its reference's rate: over the reference's own scaling" in verdict.detail
    cells[4] = [sample(img_per_sec=v) for v in (95, 96, 97)]
    verdict = next(v for v in evaluate_across(exp, cells, references=loops) if v.check == "efficiency")
    assert verdict.measured == "0.600" and not verdict.passed
    # Without the loop's rates (it failed), the plain efficiency, said as such.
    plain = next(v for v in evaluate_across(exp, cells, references={4: 200.0}) if v.check == "efficiency")
    assert plain.measured == "0.300" and plain.detail.startswith("T(4) / (4 T(1)) with T = img_per_sec; 95% interval")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


GOOD = """
name = "p"
[measured]
where = "here"
how = "by hand"
date = "2026-11-30"
[match]
gpus = 0
[labs.ddp]
world_sizes = [1, 2]
[labs.ddp.metrics.img_per_sec]
expected = { "1" = 100.0 }
at_least_fraction = 0.5
"""


@pytest.mark.parametrize(("edit", "message"), [
    (("world_sizes = [1, 2]", "world_sizes = []"), "key 'labs.ddp.world_sizes': expected a non-empty list"),
    (("at_least_fraction = 0.5", "at_least_fraction = 1.5"), "key 'labs.ddp.metrics.img_per_sec.at_least_fraction'"
                                                             ": expected a number in [0.0, 1.0], got 1.5"),
    (('"1" = 100.0', '"one" = 100.0'), "key 'labs.ddp.metrics.img_per_sec.expected.one'"),
    (("[labs.ddp]", "[labs.nosuchlab]"), "key 'labs.nosuchlab': expected a lab name"),
    (('where = "here"\n', ""), "key 'measured.where': expected a string"),
    (("gpus = 0", 'gpus = "none"'), "key 'match.gpus': expected a GPU count"),
    (("world_sizes = [1, 2]", "world_sizes = [1, 2]\nbogus = 1"), "key 'labs.ddp.bogus'"),
    (("name = ", "name = = "), "not valid TOML"),
    (("world_sizes = [1, 2]", 'world_sizes = [2]\nsingle_device = "ddp"'),
     "key 'labs.ddp.single_device': expected a lab row of this profile graded at world size 1, got 'ddp'"),
    (("world_sizes = [1, 2]", 'world_sizes = [1, 2]\nsingle_device = "baseline"\n[labs.baseline]\nworld_sizes = [1]'),
     "key 'labs.ddp.world_sizes': expected no world size 1 (row baseline's stands for it: single_device)"),
])
def test_an_invalid_profile_names_file_key_and_expectation(tmp_path, edit, message):
    path = write(tmp_path, GOOD.replace(*edit))
    with pytest.raises(ProfileError) as error:
        load_profile(path)
    assert str(path) in str(error.value)
    assert message in str(error.value)


def test_profile_selection_by_fingerprint(tmp_path):
    (tmp_path / "cpu.toml").write_text(GOOD.replace('name = "p"', 'name = "cpu"'))
    (tmp_path / "h100.toml").write_text(GOOD.replace('name = "p"', 'name = "h100"').replace(
        "gpus = 0", 'gpus = 8\ngpu_model = "H100"'))
    (tmp_path / "smoke.toml").write_text(GOOD.replace('name = "p"', 'name = "smoke"\nauto_select = false'))
    cpu_host = {"gpus": 0, "gpu_models": [], "cores": 2}
    h100_host = {"gpus": 8, "gpu_models": ["NVIDIA H100 80GB HBM3"] * 8, "cores": 112}
    assert profiles.resolve(None, cpu_host, tmp_path).name == "cpu"
    assert profiles.resolve(None, h100_host, tmp_path).name == "h100"
    assert profiles.resolve("smoke", cpu_host, tmp_path).name == "smoke"  # explicit beats auto_select
    for count in (1, 2):  # an 8-GPU profile fits a host with fewer GPUs of its model ...
        host = {"gpus": count, "gpu_models": ["NVIDIA H100 80GB HBM3"] * count, "cores": 16}
        assert profiles.resolve(None, host, tmp_path).name == "h100"
    with pytest.raises(ProfileError, match="no profile fits this host .4 GPUs.*profiles: cpu, h100, smoke.*calibrate"):
        profiles.resolve(None, {"gpus": 4, "gpu_models": ["NVIDIA A100"] * 4, "cores": 64}, tmp_path)
    with pytest.raises(ProfileError, match="no profile 'nope'; profiles: cpu, h100, smoke"):
        profiles.resolve("nope", cpu_host, tmp_path)


def test_shipped_profiles_and_plans_are_valid_and_say_where_they_were_measured():
    paths = profiles.available() + sorted((profiles.PROFILE_DIR / "plans").glob("*.toml"))
    assert paths
    for path in paths:
        profile = load_profile(path)
        assert profile.measured["where"] and profile.measured["how"]
        if not profile.provisional:
            assert profile.measured["date"][:2] == "20", f"{path}: a measured profile needs its date"


def test_report_writes_valid_junit_and_html_with_embedded_plots(tmp_path):
    verdicts = [Verdict("ddp", 1, "run", "1/1 ok", "all ok", True),
                Verdict("ddp", 2, "efficiency", "0.500", ">= 0.8", False, "T(2) / (2 T(1))"),
                Verdict("ddp", 4, "img_per_sec", "1", "n/a", None, "no expectation")]
    done = {("ddp", 1): [sample(img_per_sec=100.0, test_accuracy=[0.3, 0.5])],
            ("ddp", 2): [sample(img_per_sec=100.0, test_accuracy=[0.3, 0.45])]}
    summary = {"profile": "p", "provisional": False, "runs": 2, "wall_seconds": 3.0}
    paths = pages.write_report(tmp_path / "r", summary, verdicts, done)
    suites = ET.parse(paths["junit"]).getroot().findall("testsuite")  # one per lab and world size
    assert [s.get("name") for s in suites] == ["ddp.ws1", "ddp.ws2", "ddp.ws4"]
    assert [sum(int(s.get(key)) for s in suites) for key in ("tests", "failures", "errors", "skipped")] == [3, 1, 0, 1]
    failure = suites[1].find(".//testcase/failure")
    assert "efficiency: measured 0.500, expected >= 0.8" in failure.get("message")
    page = paths["html"].read_text()
    assert page.count("data:image/png;base64,") == 2  # accuracy per epoch, throughput + efficiency
    assert "<td>FAIL</td>" in page
    assert "**FAIL**" in paths["markdown"].read_text()
    assert (tmp_path / "r" / "throughput.png").stat().st_size > 1000


def test_the_throughput_plot_shows_the_harnesss_timing_and_efficiency_over_the_single_device_row():
    from harness.report.plots import throughput_series

    lying = sample(img_per_sec=1000.0)  # the record's claim
    lying.measured["img_per_sec"] = 150.0  # what the harness timed
    done = {("baseline", 1): [sample(img_per_sec=100.0)], ("ddp", 2): [lying], ("ddp", 4): [sample(img_per_sec=200.0)]}
    series = throughput_series(done, {"ddp": "baseline"})
    sizes, means, _, efficiencies, label = series["ddp"]
    assert (sizes, means, efficiencies, label) == ([2, 4], [150.0, 200.0], [0.75, 0.5], "ddp (T(1): baseline)")
    assert throughput_series(done, {})["ddp"][3] is None  # no world size 1 to divide by: no efficiency curve
    assert series["baseline"][3] == [1.0] and series["baseline"][4] == "baseline"


def test_calibration_derives_bands_from_the_measured_spread():
    cells = {1: [sample(wall=10, img_per_sec=v, final_accuracy=a) for v, a in ((100, 0.80), (110, 0.82), (90, 0.81))],
             2: [sample(wall=12, img_per_sec=v, final_accuracy=0.8) for v in (180, 190, 170)]}
    table = calibrate.derive_lab({"world_sizes": [1, 2], "args": ["--smoke"]}, "img_per_sec", cells)
    assert table["metrics"]["img_per_sec"]["expected"] == {"1": 100.0, "2": 180.0}
    # (mean - 3 sd) / mean at world size 1: (100 - 30) / 100 = 0.7; at 2: (180 - 30) / 180 = 0.833 -> min 0.7
    assert table["metrics"]["img_per_sec"]["at_least_fraction"] == 0.7
    assert table["efficiency_min"] == {"2": round(0.5 * 180 / 200, 3)}
    assert table["metrics"]["final_accuracy"]["min"] == round(0.80 - 0.1, 3)
    assert table["accuracy_delta"] == 0.05  # the course's rule, not the measured gap
    assert table["time_budget_s"] == 8 * 12 + 60
    assert table["required_checks"] == ["params_identical"]
    assert json.loads(json.dumps(table)) == table  # plain data only (no Interval, no Path): ready for TOML


def test_calibration_of_a_cpu_lab_writes_ratios_to_its_reference_not_img_per_sec():
    cells = {1: [sample(img_per_sec=v, final_accuracy=0.9) for v in (80, 90, 85)],
             2: [sample(img_per_sec=v, final_accuracy=0.89) for v in (120, 130, 140)]}
    table = calibrate.derive_lab({"world_sizes": [1, 2], "reference": "train_loop"}, "img_per_sec", cells,
                                 {1: 100.0, 2: 160.0})
    band = table["metrics"]["img_per_sec"]
    assert "expected" not in band  # no absolute figure: it would not hold on another CPU
    assert band["at_least_ratio"] == {"1": round(0.6 * 85 / 100, 3), "2": round(0.6 * 130 / 160, 3)}
    # Efficiency over the loop's own, as the grade judges it: (130 / 170) / (160 / 200).
    assert table["efficiency_min"] == {"2": round(0.5 * (130 / 170) / (160 / 200), 3)}
    # Faster than the bare loop is noise: the floor is 0.6 of the loop's rate, never more.
    faster = calibrate.derive_lab({"world_sizes": [1], "reference": "train_loop"}, "img_per_sec",
                                  {1: cells[1]}, {1: 50.0})
    assert faster["metrics"]["img_per_sec"]["at_least_ratio"] == {"1": 0.6}


def test_calibration_of_a_data_parallel_row_measures_against_the_single_device_runs():
    baseline = [sample(img_per_sec=v, final_accuracy=0.95) for v in (80, 90)]
    cells = {2: [sample(img_per_sec=v, final_accuracy=a) for v, a in ((120, 0.96), (130, 0.94))]}
    table = calibrate.derive_lab({"world_sizes": [2], "reference": "train_loop", "single_device": "baseline"},
                                 "img_per_sec", cells, {1: 100.0, 2: 160.0}, single_device=baseline)
    assert table["metrics"]["img_per_sec"]["at_least_ratio"] == {"2": round(0.6 * 125 / 160, 3)}
    # (125 / 85) / 2 over the loop's own (160 / 100) / 2
    assert table["efficiency_min"] == {"2": round(0.5 * (125 / 170) / (160 / 200), 3)}
    assert table["accuracy_delta"] == 0.05


def test_a_gpu_profile_grades_the_world_sizes_the_visible_gpus_can_hold(tmp_path):
    from harness.grading.plan import GradePlan

    profile = load_profile(REPO / "harness/profiles/h100-80gb-sxm-8.toml")
    for gpus, sizes in ((1, [1]), (2, [1, 2]), (8, [1, 2, 4, 8])):  # ... with one rank per GPU
        plan = GradePlan(profile, ["ddp"], None, 1, {}, tmp_path, None, gpus=gpus)
        assert [ws for _, ws in plan.cells()] == sizes


def test_world_sizes_select_among_the_profiles_cells_and_add_their_arguments(tmp_path):
    from harness.grading.plan import GradePlan

    path = write(tmp_path, GOOD.replace("world_sizes = [1, 2]", 'world_sizes = [1, 2]\nworld_size_args = '
                                        '{ "2" = ["--batch-size", "16"] }'))
    profile = load_profile(path)
    exp = profile.labs["ddp"]
    assert exp.args_at(1) == [] and exp.args_at(2) == ["--batch-size", "16"]
    plan = GradePlan(profile, ["ddp"], [2, 4], 1, {}, tmp_path, None)
    assert plan.cells() == [("ddp", 2)]  # no expectations at 4: not run
    assert GradePlan(profile, ["ddp"], None, 1, {}, tmp_path, None).cells() == [("ddp", 1), ("ddp", 2)]


@needs_horovod  # the runs are stand-ins, but the horovod cell's request needs horovodrun to be built
def test_each_run_of_a_cell_follows_a_reference_run_of_its_own_at_the_profiles_threads(tmp_path, monkeypatch):
    from harness.grading import execute, samples
    from harness.grading.plan import GradePlan
    from harness.run.state import RunResult

    profile = load_profile(REPO / "harness/profiles/plans/cpu-grade.toml")
    assert profile.threads_per_rank == 1
    plan = GradePlan(profile, ["baseline", "ddp", "horovod", "allreduce_bench", "ddp-local-bn"], [1, 2], 2,
                           {}, tmp_path, None)
    ref, base1 = plan.reference("baseline", 1), plan.reference_request("baseline", 1)
    assert ref.name == "train_loop" and base1.world_size == 1 and base1.launcher == "python" and not base1.observe
    assert base1.threads == plan.request("baseline", 1).threads == 1  # the profile's threads, lab and reference alike
    assert plan.request("ddp", 2).threads == plan.reference_request("ddp", 2).threads == 1
    # As many loop ranks as the lab has, side by side: one process times N got a whole core under load
    # while the lab's N ranks shared what was left.
    ddp2 = plan.reference_request("ddp", 2)
    assert (ddp2.world_size, ddp2.launcher, ddp2.backend) == (2, "torchrun", "gloo")
    assert any("{run_dir}" in arg for arg in plan.request("ddp", 2).lab_args)
    assert not any("{run_dir}" in arg for arg in ddp2.lab_args)  # the lab's checkpoint path is not its
    bench = plan.reference_request("allreduce_bench", 2)
    assert plan.reference("allreduce_bench", 2).name == "plain_allreduce"
    assert bench.world_size == 2 and bench.backend == "gloo"
    assert plan.reference("ddp-local-bn", 4) is None  # no throughput band: no reference to run

    started = []

    def run_lab(request, echo, on_line):
        started.append((request.lab, request.world_size))
        return RunResult(tmp_path, 0, "ok", None, {"metrics": {"img_per_sec": 10.0}}, None, 1.0)

    monkeypatch.setattr(execute, "run_lab", run_lab)
    monkeypatch.setattr(samples, "observed_sample", lambda result, exp, request, evaluator: samples.sample_of(result))
    done, references = {}, {}
    execute.execute(plan, done, references)
    # Reference, run, reference, run: a load that comes and goes touches a run and its reference alike.
    assert started[:4] == [("train_loop", 1), ("baseline", 1)] * 2
    assert started[4:8] == [("train_loop", 2), ("ddp", 2)] * 2
    assert started[8:12] == [("train_loop", 2), ("horovod", 2)] * 2
    assert len(references["ddp", 2]) == len(done["ddp", 2]) == 2
    assert references["ddp", 2] is not references["horovod", 2]  # each cell its own reference runs
    assert ("ddp", 1) not in done  # the baseline's world size 1 stands for the data-parallel labs'
    assert not any(lab == "ddp-local-bn" for lab, _ in references)


def test_the_training_reference_refuses_several_ranks_without_gloo(tmp_path):
    import subprocess
    import sys

    from harness.verdict.references import REFERENCES

    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "TORCHELASTIC_RUN_ID": "x", "RANK": "0",
           "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    done = subprocess.run([sys.executable, str(REFERENCES["train_loop"].program), "--smoke"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "add --backend gloo" in done.stderr


def test_a_students_program_is_timed_against_the_course_lab_in_the_same_cell(tmp_path):
    from harness.grading.plan import plan_grade
    from harness.verdict.references import PROGRAM_RATIO_FLOOR

    student = tmp_path / "my_ddp.py"
    student.write_text("print('a program')\n")
    plan = plan_grade(load_profile(REPO / "harness/profiles/cpu-smoke.toml"), labs=["baseline", "ddp"],
                      programs={"ddp": student}, results_root=tmp_path)
    assert plan.request("ddp", 2).program == student.resolve()
    ref, course = plan.reference("ddp", 2), plan.reference_request("ddp", 2)
    # Launched like the program (the same launcher and backend), but the course's lab, observed alike.
    assert ref.name == "course-ddp" and course.program == REPO / "labs/ddp/train.py" and course.observe
    assert (course.launcher, course.backend) == (plan.request("ddp", 2).launcher, "gloo")
    ratio = next(band for band in plan.profile.labs["ddp"].bands if band.at_least_ratio)
    assert ratio.at_least_ratio == {1: PROGRAM_RATIO_FLOOR, 2: PROGRAM_RATIO_FLOOR}
    # The rows without a program keep the profile's plain loop and its calibrated floor.
    assert plan.reference("baseline", 1).name == "train_loop"
    shipped = profiles.load_profile(REPO / "harness/profiles/cpu-smoke.toml").labs["baseline"].bands
    assert plan.profile.labs["baseline"].bands == shipped


def test_a_ratio_is_over_each_runs_ratio_to_the_reference_measured_around_it():
    band = Band("img_per_sec", at_least_ratio={2: 0.7})
    # The machine got busier run by run: the program's rate fell, and its neighbours' with it. Each
    # pair says 0.8; the mean of the references (70) against the median run (64) would say 0.91, and
    # a run against a reference measured under another load says anything.
    runs = [sample(img_per_sec=v) for v in (80.0, 64.0, 40.0)]
    for run, reference in zip(runs, (100.0, 80.0, 50.0), strict=True):
        run.reference = reference
    verdict = band_verdict("ddp", 2, band, runs, reference=70.0)
    assert verdict.passed and verdict.measured == "0.800"
    assert "geometric mean of 3 paired ratio(s) (0.800, 0.800, 0.800)" in verdict.detail
    runs[1].reference = 160.0  # one pair measured across a burst of load: 0.4, and the interval says so
    burst = band_verdict("ddp", 2, band, runs, reference=70.0)
    assert burst.passed is None and "measured 0.635" in burst.detail  # not comparable: never failed on a burst
    runs[0].reference = 200.0  # two of three
    assert band_verdict("ddp", 2, band, runs, reference=70.0).passed is None
    for run in runs:
        run.reference = 2 * run.measured.get("img_per_sec", run.record["metrics"]["img_per_sec"])  # 0.5 each
    assert band_verdict("ddp", 2, band, runs, reference=70.0).passed is False


def test_a_students_runs_are_bracketed_by_the_course_labs_and_paired_with_both_neighbours(tmp_path, monkeypatch):
    from harness.grading import execute, samples
    from harness.grading.plan import plan_grade
    from harness.run.state import RunResult
    from harness.verdict.pairing import pair_references
    from harness.verdict.references import PROGRAM_PAIRS

    student = tmp_path / "my_ddp.py"
    student.write_text("print('a program')\n")
    plan = plan_grade(load_profile(REPO / "harness/profiles/cpu-smoke.toml"), labs=["ddp"], programs={"ddp": student},
                      world_sizes=[2], results_root=tmp_path)
    assert plan.bracketed("ddp") and plan.runs("ddp") == PROGRAM_PAIRS == 3
    assert not plan.bracketed("baseline") and plan.runs("baseline") == 1  # the course's own rows: --repeats
    rates = iter([100.0, 50.0, 80.0, 40.0, 60.0, 30.0, 40.0])  # lab, program, lab, program, lab, program, lab
    started = []

    def run_lab(request, echo, on_line):
        started.append("program" if request.program == student.resolve() else request.lab)
        return RunResult(tmp_path, 0, "ok", None, {"metrics": {"img_per_sec": next(rates)}}, None, 1.0)

    monkeypatch.setattr(execute, "run_lab", run_lab)
    monkeypatch.setattr(samples, "observed_sample", lambda result, exp, request, evaluator: samples.sample_of(result))
    monkeypatch.setattr(samples, "timed", lambda result, metric: samples.sample_of(result))
    done, references = {}, {}
    execute.execute(plan, done, references)
    lab = started[0]
    assert started == [lab, "program"] * 3 + [lab]
    pair_references(plan.reference, done, references)
    assert [s.reference for s in done["ddp", 2]] == [90.0, 70.0, 50.0]  # the mean of the runs around each


def test_a_lesson_row_reports_being_worse_and_fails_only_for_what_fails_any_row():
    lesson = LabExpectation("ddp-local-bn", (1, 4), time_budget_s=100, program_lab="ddp", accuracy_delta=0.05,
                            bands=(Band("final_accuracy", min=0.9),), lesson="BatchNorm over 8 images is noisy.")
    worse = [sample(final_accuracy=0.7, wall=10.0)]
    cell = {v.check: v for v in evaluate_cell(lesson, 4, worse)}
    assert cell["final_accuracy"].passed is None and cell["final_accuracy"].detail.startswith("lesson: BatchNorm")
    across = {v.check: v for v in evaluate_across(lesson, {1: [sample(final_accuracy=0.95)], 4: worse})}
    assert across["accuracy_vs_ws1"].passed is None and across["accuracy_vs_ws1"].measured == "-0.250"
    # A crash, or a blown time budget, fails it like any row.
    crashed = {v.check: v for v in evaluate_cell(lesson, 4, [sample("failed", wall=150.0, final_accuracy=0.7)])}
    assert crashed["run"].passed is False and crashed["time"].passed is False


@pytest.mark.parametrize("said, failure, runs", [
    ("RuntimeError: rank 1 gives up", (1, 1, None), 1),  # the program's own exception: it would end every run so
    # What the machine can cause in a correct program is run again as planned:
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
     "[127.0.0.1]:41952", (1, 1, None), 3),
    ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address",
     (1, 1, None), 3),
    ("RuntimeError: rank 1 gives up", (1, None, "SIGKILL"), 3),  # killed: by the sandbox's limits, or the OOM killer
])
def test_a_program_that_raises_its_own_exception_is_not_run_again_and_a_machines_failure_is(tmp_path, monkeypatch,
                                                                                              said, failure, runs):
    """Issue 49: a deterministic crash was run three times with four runs of the course lab around it.
    The run row fails on its first run whatever the others show, and no speed is measured without a
    run that went well; a failure the machine could have caused may go well the next time."""
    from harness.grading import execute, samples
    from harness.grading.plan import plan_grade
    from harness.run.launchers import Failure
    from harness.run.state import RunResult

    student = tmp_path / "my_ddp.py"
    student.write_text("print('a program')\n")
    plan = plan_grade(load_profile(REPO / "harness/profiles/cpu-smoke.toml"), labs=["ddp"], programs={"ddp": student},
                      world_sizes=[2], results_root=tmp_path)
    started = []

    def run_lab(request, echo, on_line):
        run_dir = tmp_path / f"run-{len(started)}"
        run_dir.mkdir()
        started.append("program" if request.program == student.resolve() else request.lab)
        if started[-1] != "program":
            return RunResult(run_dir, 0, "ok", None, {"metrics": {"img_per_sec": 10.0}}, None, 1.0)
        (run_dir / "rank.0.log").write_text("RuntimeError: Connection closed by peer\n")  # rank 0: the echo
        (run_dir / "rank.1.log").write_text(f"Traceback (most recent call last):\n  File \"my_ddp.py\", line 3, "
                                            f"in <module>\n    raise\n{said}\n")
        return RunResult(run_dir, 1, "failed", "rank 1 exited with code 1", None, Failure(*failure), 1.0)

    monkeypatch.setattr(execute, "run_lab", run_lab)
    monkeypatch.setattr(samples, "observed_sample", lambda result, exp, request, evaluator: samples.sample_of(result))
    monkeypatch.setattr(samples, "timed", lambda result, metric: samples.sample_of(result))
    events = []
    done, references = {}, {}
    execute.execute(plan, done, references, on_event=events.append)
    lab = started[0]
    assert started == ([lab, "program"] * 3 + [lab] if runs == 3 else [lab, "program"])
    assert len(done["ddp", 2]) == runs
    # The progress counts what runs: "run k of n" never ends short of its n.
    ended = [e for e in events if e["event"] == "ended"]
    assert ended[-1]["run"] == events[-1]["of"] == len(started)
    if runs == 1:
        assert any(e.get("why") == "ddp ws=2: not run again, the program raised RuntimeError: rank 1 gives up"
                   for e in events)
        verdicts = {v.check: v for v in evaluate_cell(plan.profile.labs["ddp"], 2, done["ddp", 2])}
        assert verdicts["run"].measured == "0/1 ok" and verdicts["run"].passed is False
