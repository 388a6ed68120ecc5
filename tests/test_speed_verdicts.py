"""Speed verdicts on an interval (issue 48): one rule for every speed row, tried on recorded runs.

tests/fixtures/speed_pairs/pairs.json holds the harness's own rates of real runs and their reference
runs, in time order, with each run's cpu account, as `distlab bench verdict` left them on a 2-core
machine at 0 to 16 busy processes beside (capture.py there says how). No test here times anything:
the rule is applied to those numbers, and must never fail the course's lab or the all-reduce bench,
never pass the twice-slower mutant, and fail the mutant where the machine was quiet enough to tell.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from harness.run import cpu_time
from harness.verdict.evaluate import band_verdict, evaluate_cell, speed_undecided
from harness.verdict.expectations import Band, LabExpectation
from harness.verdict.pairing import pair_references
from harness.verdict.references import Reference
from harness.verdict.speed import BIASED, FAIL, NOT_COMPARABLE, PASS, UNDECIDED, Interference, speed_rule
from harness.verdict.stats import ratio_interval
from harness.verdict.verdicts import Sample

PAIRS = Path(__file__).resolve().parent / "fixtures" / "speed_pairs" / "pairs.json"


# --- what the kernel tells: steal time and the run queue (run/cpu_time.py) ---------------------------

def test_the_cpu_account_reads_steal_time_and_samples_the_run_queue(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_time.os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    stat = tmp_path / "stat"
    hertz = cpu_time.os.sysconf("SC_CLK_TCK")

    def write(steal: int) -> None:  # user nice system idle iowait irq softirq steal: cpu2 is not ours
        stat.write_text("".join(f"cpu{n} 0 0 0 0 0 0 0 {steal}\n" for n in (0, 1, 2)) + "cpu 0 0 0\n")

    write(0)
    start = cpu_time.read_clock(stat)
    write(hertz)  # one second stolen from each of cpu0 and cpu1
    end = cpu_time.read_clock(stat)
    end = cpu_time.CpuClock(start.at + 4.0, end.busy, start.ours, end.steal)
    assert cpu_time.steal_cores(start, end) == pytest.approx(0.5)  # 2 CPU-seconds in 4 s
    assert cpu_time.others_cores(start, end) == pytest.approx(0.5)  # stolen time is someone else's too

    loadavg = tmp_path / "loadavg"
    queue = cpu_time.RunQueue(loadavg)
    queue.sample()  # unreadable: nothing counted
    for runnable in (3, 5):
        loadavg.write_text(f"0.52 0.58 0.59 {runnable}/912 12345\n")
        queue.sample()
    assert queue.mean() == 4.0


# --- the rule ------------------------------------------------------------------------------------

QUIET = Interference(others_cores=0.1, run_queue=2.0, cores=2)
BUSY = Interference(others_cores=1.6, run_queue=9.0, cores=2, contended=True)


def test_an_interval_that_reaches_the_floor_is_never_a_fail():
    # Pairs 0.5 and 0.9 around a floor of 0.7: the median rule failed or passed them by luck.
    state, interval = speed_rule([0.5, 0.9, 0.55], 0.7, QUIET, alike=True)
    assert state == UNDECIDED and interval.low < 0.7 < interval.high
    assert speed_rule([0.66], 0.7, QUIET, alike=True)[0] == UNDECIDED  # one pair: no spread, no verdict
    assert ratio_interval([0.66]).high == math.inf


def test_an_interval_clear_of_the_floor_passes_or_fails():
    assert speed_rule([0.98, 1.0, 1.03], 0.7, BUSY, alike=True)[0] == PASS  # busy cores cannot make it pass wrongly
    assert speed_rule([0.49, 0.5, 0.52], 0.7, QUIET, alike=True)[0] == FAIL
    assert speed_rule([0.49, 0.5, 0.52], 0.7, BUSY, alike=True)[0] == FAIL  # the same work beside it: slowed alike


def test_below_a_plain_loop_s_floor_on_busy_cores_is_not_the_lab_s_fault():
    """Issue 48's make grade: the ddp lab at 0.319 of its plain loop against 0.35 with 1.5 to 1.9 of 2
    cores busy. Against a loop (not alike), busy cores leave it not comparable; quiet ones fail it."""
    assert speed_rule([0.31, 0.319, 0.33], 0.35, BUSY, alike=False)[0] == BIASED
    assert speed_rule([0.31, 0.319, 0.33], 0.35, QUIET, alike=False)[0] == FAIL


def test_a_not_comparable_row_shows_its_interval_interference_and_what_to_do():
    cpu = {"ranks_here": 2, "threads_per_rank": 1, "cores": 2, "cpus": 2, "others_cores": 0.2,
           "steal_cores": 0.0, "run_queue": 3.5}
    runs = [Sample("r", "ok", None, 10.0, None, measured={"img_per_sec": v}, reference=100.0, cpu=cpu)
            for v in (50.0, 90.0, 55.0)]
    verdict = band_verdict("ddp", 2, Band("img_per_sec", at_least_ratio={2: 0.7}), runs, alike=True)
    assert (verdict.measured, verdict.passed) == (NOT_COMPARABLE, None)
    assert "reaches the floor 0.7" in verdict.detail and "--repeats" in verdict.detail
    assert "95% interval [" in verdict.detail
    assert verdict.interference == "others kept 0.20 of 2 core(s) busy, run queue 3.5"


# --- the recorded runs ----------------------------------------------------------------------------

def recorded() -> list[dict]:
    return json.loads(PAIRS.read_text())


def judge(cell: dict) -> tuple[object, list[Sample]]:
    """The cell's speed verdict as a grade reaches it: each run paired with the reference runs around it."""
    metric = cell["metric"]

    def sample(run: dict) -> Sample:
        measured = {metric: run["rate"]} if run["status"] == "ok" else {}
        return Sample("r", run["status"], None, run["wall_seconds"], None, measured=measured, cpu=run["cpu"])

    runs, references = [sample(r) for r in cell["runs"]], [sample(r) for r in cell["references"]]
    reference = Reference("ref", Path("ref.py"), metric, like_lab=cell["alike"], summary="")
    pair_references(lambda *_: reference, {("row", 2): runs}, {("row", 2): references})
    ok = [s for s in runs if s.status == "ok"]
    return band_verdict("row", 2, Band(metric, at_least_ratio={2: cell["floor"]}), ok, alike=cell["alike"]), runs


def outcome(verdict) -> str:
    return {True: "pass", False: "fail", None: "not comparable"}[verdict.passed]


def test_the_recording_covers_every_subject_at_quiet_and_busy_loads():
    cells = recorded()
    assert {c["subject"] for c in cells} >= {"lab", "mutant", "allreduce"}
    assert {c["load"] for c in cells if c["subject"] == "mutant"} >= {0, 2}
    assert all(len(c["runs"]) >= 1 and c["references"] for c in cells)
    assert any(r["cpu"]["others_cores"] > 1.0 for c in cells for r in c["runs"])  # a busy machine is in it


@pytest.mark.parametrize("subject", ["lab", "copy", "allreduce"])
def test_the_course_lab_and_the_allreduce_bench_never_fail_a_recorded_speed_row(subject):
    for cell in (c for c in recorded() if c["subject"] == subject):
        verdict, _ = judge(cell)
        assert verdict.passed is not False, (cell["load"], verdict.detail)


def test_the_twice_slower_mutant_never_passes_and_fails_where_it_is_quiet_enough():
    seen = {}
    for cell in (c for c in recorded() if c["subject"] == "mutant"):
        verdict, _ = judge(cell)
        assert verdict.passed is not True, (cell["load"], verdict.detail)
        seen.setdefault(cell["load"], []).append(outcome(verdict))
    assert all(state == "fail" for load in (0, 2) for state in seen[load]), seen


def test_the_old_median_rule_failed_what_the_interval_leaves_not_comparable():
    """Shows the rule matters on these numbers: the median of the recorded ratios under the floor (the
    rule before issue 48 failed every such row) where the interval says not comparable."""
    flipped = []
    for cell in recorded():
        verdict, runs = judge(cell)
        ratios = [s.measured[cell["metric"]] / s.reference for s in runs if s.status == "ok" and s.reference]
        if ratios and sorted(ratios)[len(ratios) // 2] < cell["floor"] and verdict.passed is None:
            flipped.append((cell["subject"], cell["load"]))
    assert flipped, "no recorded cell that the median rule would have failed"


# --- more pairs while the interval reaches the floor (grading/execute.py) -----------------------------

DDP = LabExpectation("ddp", (2,), time_budget_s=600, reference="course-ddp", reference_alike=True,
                     bands=(Band("img_per_sec", at_least_ratio={2: 0.7}),))


def test_a_cell_asks_for_more_pairs_only_while_its_interval_reaches_the_floor():
    def runs(*ratios: float) -> list[Sample]:
        return [Sample("r", "ok", None, 10.0, None, measured={"img_per_sec": 100 * r}, reference=100.0,
                       cpu={"ranks_here": 2, "threads_per_rank": 1, "cores": 2, "others_cores": 0.1})
                for r in ratios]

    assert speed_undecided(DDP, 2, runs(0.66))  # one pair says nothing yet
    assert speed_undecided(DDP, 2, runs(0.5, 0.9, 0.55))
    assert not speed_undecided(DDP, 2, runs(0.49, 0.5, 0.52))  # decided: failed
    assert not speed_undecided(DDP, 2, runs(0.98, 1.0, 1.02))  # decided: passed
    crowded = runs(0.5, 0.9, 0.55)
    for s in crowded:
        s.cpu["threads_per_rank"] = 2  # its own ranks oversubscribed the cores: more pairs cannot help
    assert not speed_undecided(DDP, 2, crowded)


def test_the_grade_runs_extra_pairs_within_the_profile_s_budget(tmp_path, monkeypatch):
    """The grading stage's loop with the machine's runs replayed from a list (run_lab stands for the
    launch; everything else is the grade's own): a noisy start gets more pairs until the interval
    clears the floor; a budget of 0 gets none and leaves it not comparable."""
    from harness.grading import execute as execute_module
    from harness.grading import samples as samples_module
    from harness.grading.judge import run_grade
    from harness.grading.plan import plan_grade
    from harness.verdict.profiles import resolve

    program = tmp_path / "ddp.py"
    program.write_text("")
    # course lab, program, course lab, ... : the rates the machine gave, in order
    rates = iter([100, 50, 100, 90, 100, 55, 100, 50, 100, 51, 100, 50, 100, 49, 100, 50, 100])
    launched: list[str] = []

    class Result:
        ok, wall_seconds, reason, cpu = True, 10.0, None, {"ranks_here": 2, "threads_per_rank": 1, "cores": 2,
                                                            "others_cores": 0.1}

    def fake_run_lab(request, echo=False, on_line=None):
        launched.append(request.lab)
        return Result()

    def rate(result, *args, **kwargs):
        return Sample("r", "ok", None, 10.0, {"metrics": {}, "checks": {}}, measured={"img_per_sec": next(rates)},
                      cpu=Result.cpu)

    monkeypatch.setattr(execute_module, "run_lab", fake_run_lab)
    monkeypatch.setattr(samples_module, "observed_sample", rate)
    monkeypatch.setattr(samples_module, "timed", rate)
    monkeypatch.setattr(samples_module, "reference_sample", rate)
    monkeypatch.setattr(execute_module.accuracy, "Evaluator", lambda: _Nothing())
    profile = resolve("cpu-smoke", {})
    plan = plan_grade(profile, labs=["ddp"], world_sizes=[2], programs={"ddp": program}, results_root=tmp_path,
                      check_runs=False)
    grade = run_grade(plan)
    speed = next(v for v in grade.verdicts if v.check == "img_per_sec_ratio")
    assert speed.passed is False, speed.detail  # decided after extra pairs
    assert len(grade.done["ddp", 2]) > 3 and len(grade.references["ddp", 2]) == len(grade.done["ddp", 2]) + 1
    assert launched[-1] == launched[0]  # still bracketed: the course lab last

    import dataclasses
    rates = iter([100, 50, 100, 90, 100, 55, 100])
    plan = plan_grade(dataclasses.replace(profile, speed_budget_s=0.0), labs=["ddp"], world_sizes=[2],
                      programs={"ddp": program}, results_root=tmp_path, check_runs=False)
    grade = run_grade(plan)
    speed = next(v for v in grade.verdicts if v.check == "img_per_sec_ratio")
    assert speed.measured == NOT_COMPARABLE and len(grade.done["ddp", 2]) == 3


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --- a class's speed items: "not comparable" is a state of its own (classgrade) ----------------------

def test_a_class_s_speed_item_not_comparable_keeps_its_points_and_says_so(tmp_path):
    from harness.classgrade import rubric as rubric_module
    from harness.classgrade.account import Outcome
    from harness.classgrade.outputs import gradebook_csv
    from harness.classgrade.platforms import gradescope_results, prairielearn_results

    rubric = rubric_module.load()
    cpu = {"ranks_here": 2, "threads_per_rank": 1, "cores": 2, "cpus": 2, "others_cores": 1.7}
    runs = [Sample("r", "ok", None, 10.0, {"metrics": {"img_per_sec": v}, "checks": {}}, reference=100.0, cpu=cpu)
            for v in (50.0, 90.0, 55.0)]
    exp = LabExpectation("ddp", (2,), time_budget_s=600, reference="course-ddp", reference_alike=True,
                         bands=(Band("img_per_sec", at_least_ratio={2: 0.7}),))
    verdicts = evaluate_cell(exp, 2, runs, 100.0)
    scores = rubric.score(verdicts)
    speed = next(s for s in scores if s.item.name == "speed")
    assert speed.score == speed.item.points and speed.state == "not comparable"  # never zero points
    outcome = Outcome("alice", "graded", scores=scores, verdicts=verdicts)

    tests = {t["name"]: t for t in gradescope_results(outcome, rubric)["tests"]}
    assert "status" not in tests["speed"] and tests["speed"]["tags"] == ["not comparable"]
    assert "others kept 1.70 of 2 core(s) busy" in tests["speed"]["output"]
    assert tests["runs to the end"]["status"] == "passed"
    pl = {t["name"]: t for t in prairielearn_results(outcome, rubric)["tests"] if t["name"] == "speed"}
    assert pl == {} or pl["speed"]["message"] == "not comparable"  # hidden items are not shown there
    gradebook_csv(tmp_path / "gradebook.csv", rubric, [outcome])
    (row,) = [r for r in csv.DictReader((tmp_path / "gradebook.csv").open()) if r["id"] == "alice"]
    assert row["speed"] == "1" and "speed: ddp ws=2 img_per_sec_ratio not comparable:" in row["reason"]
