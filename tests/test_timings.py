"""Where a grade's time goes (`distlab grade --timings`): the phases computed from recorded stamps, the
rows and totals, the table and the JSON summary's "timings". Recorded data only: no timing is asserted."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from harness.grading import timings
from harness.observe import timeline
from harness.observe.observations import Observations, RankObservation
from harness.report.timings import timings_table
from harness.verdict.verdicts import Sample

REPO = Path(__file__).resolve().parents[1]
STAMPS = {"began": 100.0, "launched": 100.5, "exited": 130.0, "accounted": 131.0}
RANK = {"observer_loaded": 102.0, "torch_imported": 105.0, "process_group_called": 106.0, "process_group": 107.0,
        "first_batch": 110.0,
        "last_step": 125.0, "exit": 128.0}


def rank(number: int, stamps: dict[str, float]) -> RankObservation:
    return RankObservation(number, [], 0, [], [], None, [], timeline=stamps)


def test_a_runs_phases_are_the_differences_of_its_milestones_and_add_up_to_its_time():
    phases = timeline.phases_of(STAMPS, [RANK])
    assert phases == {"prepare": 0.5, "launcher": 1.5, "torch": 3.0, "imports": 1.0, "rendezvous": 1.0, "data": 3.0,
                      "training": 15.0, "after_training": 3.0, "exit": 2.0, "accounts": 1.0}
    assert sum(phases.values()) == STAMPS["accounted"] - STAMPS["began"]


def test_the_slowest_rank_sets_each_milestone():
    late = {**RANK, "process_group": 108.5, "last_step": 126.0}
    seen = Observations(Path("."), ranks={0: rank(0, RANK), 1: rank(1, late)})
    assert timeline.slowest_rank(seen) == late


def test_a_missing_or_impossible_stamp_gives_its_time_to_the_next_phase():
    no_group = {k: v for k, v in RANK.items() if not k.startswith("process_group")}  # no process group
    phases = timeline.phases_of(STAMPS, [no_group])
    assert phases["imports"] == phases["rendezvous"] == 0.0 and phases["data"] == 5.0
    # A rank's stamp before the one before it, or past the launcher's end: its own clock, not the run's.
    backwards = {**RANK, "first_batch": 104.0, "last_step": 500.0}
    phases = timeline.phases_of(STAMPS, [backwards])
    assert phases["data"] == 0.0 and phases["training"] == 0.0 and phases["after_training"] == 21.0
    assert sum(phases.values()) == pytest.approx(31.0)
    assert timeline.phases_of({}, [RANK]) == {}  # never launched: nothing to say
    # No rank stamped anything (a run without an observer, a program without torch): the launch is one phase.
    for attempts in ([], [{}]):
        phases = timeline.phases_of(STAMPS, attempts)
        assert phases["launcher"] == 29.5 and phases["exit"] == 0.0


def test_a_restarted_run_counts_both_attempts_phase_by_phase():
    second = {k: v + 30.0 for k, v in RANK.items()}  # the resumed attempt, after the stopped one
    stamps = {**STAMPS, "exited": 160.0, "accounted": 161.0}
    phases = timeline.phases_of(stamps, [RANK, second])
    assert phases["torch"] == 6.0 and phases["training"] == 30.0
    assert phases["launcher"] == 1.5 + (132.0 - 128.0)  # torchrun's restart: the stopped exit to the next start
    assert sum(phases.values()) == 61.0
    assert timeline.add({"torch": 1.0}, {"torch": 2.0, "data": 1.0}) == {"torch": 3.0, "data": 1.0}


def grade_rows() -> list[dict]:
    done = {("ddp", 1): [Sample("a", "ok", None, 30.0, None, phases={"training": 20.0, "evaluate": 2.0})],
            ("ddp-resume", 2): [Sample("b", "ok", None, 60.0, None, phases={"training": 40.0, "torch": 6.0}),
                                Sample("c", "failed", "x", 10.0, None, phases={"launcher": 10.0})]}
    references = {("ddp", 2): [Sample("d", "ok", None, 5.0, None, phases={"training": 4.0})]}
    return timings.run_rows(done, references)


def test_one_row_per_run_with_every_phase_and_the_grades_totals_and_unaccounted_share():
    rows = grade_rows()
    assert [(r["cell"], r["run"], r["reference"]) for r in rows] == [
        ("ddp@1", 1, False), ("ddp-resume@2", 1, False), ("ddp-resume@2", 2, False), ("ddp@2", 1, True)]
    assert all(list(r["phases"]) == [*timeline.PHASES, timeline.EVALUATE] for r in rows)
    assert [r["seconds"] for r in rows] == [22.0, 46.0, 10.0, 4.0]
    spent = timings.grade_timings(rows, {"plan": 1.0, "judge": 0.5, "write": 0.5}, 100.0)
    assert spent["phase_totals"]["training"] == 64.0 and spent["runs_seconds"] == 82.0
    assert spent["grade_steps"] == {"plan": 1.0, "judge": 0.5, "write": 0.5}
    assert spent["unaccounted_seconds"] == 16.0 and spent["unaccounted_share"] == 0.16
    json.dumps(spent)  # the JSON summary's, as is


def test_the_table_shows_each_run_the_totals_and_what_no_phase_accounts_for():
    spent = timings.grade_timings(grade_rows(), {"plan": 1.0, "judge": 0.5, "write": 0.5}, 100.0)
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(timings_table(spent, "where the time went"))
    text = out.getvalue()
    for label in ("ddp@1 run 1", "ddp-resume@2 run 2", "ddp@2 run 1 (reference)", "runs, all", "planning",
                  "judging", "writing outputs", "grade wall time", "16.0 (16%)", "train", "imp", "rdzv", "eval"):
        assert label in text, label


def test_the_grades_json_summary_has_the_timings_of_each_run(tmp_path, capsys):
    from harness.commands import grade as grade_command
    from harness.grading.judge import Grade
    from harness.grading.plan import GradePlan
    from harness.verdict.profiles import load_profile

    profile = load_profile(REPO / "harness/profiles/cpu-class.toml")
    plan = GradePlan(profile, ["ddp", "ddp-resume"], [1, 2], 1, {}, tmp_path, None)
    grade = Grade(plan, done={("ddp", 1): [Sample(str(tmp_path), "ok", None, 3.0, None, phases={"training": 2.0})],
                              ("ddp-resume", 2): [Sample(str(tmp_path), "ok", None, 5.0, None, phases={"data": 1.0})]},
                  wall_seconds=8.5, steps={"judge": 0.1})
    grade_command.report(grade, as_json=True, keep=True, show_timings=True)
    out = capsys.readouterr().out
    summary = json.loads(out[out.index('{\n  "profile"'):])
    assert [(r["cell"], r["run"]) for r in summary["timings"]["runs"]] == [("ddp@1", 1), ("ddp-resume@2", 1)]
    assert summary["timings"]["phase_totals"]["training"] == 2.0 and "write" in summary["timings"]["grade_steps"]
    # The report folder's summary.json keeps them, for a grade read later.
    stored = json.loads(Path(summary["report"]["markdown"]).with_name("summary.json").read_text())
    assert stored["timings"] == summary["timings"] and stored["runs_by_cell"]
    assert "where the time went" in out  # the table, asked for
    # In a log rich assumes 80 columns: every phase was cut to "…" (the cpu-class grade's, printed to a file).
    assert "…" not in out[:out.index('{\n  "profile"')] and "ddp-resume@2 run 1" in out


def test_a_class_jobs_timings_carry_its_sandboxs_setup_and_teardown_in_order():
    steps = {"sandbox_setup": 2.0, "plan": 0.1, "sandbox_teardown": 1.0}  # classgrade/job.py's, in its order
    spent = timings.grade_timings(grade_rows(), steps, 100.0, sandbox="sandbox mode bwrap")
    assert list(spent["grade_steps"]) == list(steps) and spent["sandbox"] == "sandbox mode bwrap"
    assert spent["unaccounted_seconds"] == pytest.approx(100.0 - 82.0 - 3.1)
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(timings_table(spent, "a job"))
    assert "sandbox setup" in out.getvalue() and "sandbox teardown" in out.getvalue()
