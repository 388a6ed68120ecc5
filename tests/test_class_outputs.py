"""What a class grade writes for a crashing student, from the verdicts of a real crash.

tests/fixtures/classgrade/crash-rank1/ holds what `distlab grade-class week4 --lab ddp --profile
cpu-smoke --no-sandbox` left for one submission: the course lab (labs/ddp/train.py) with
`raise RuntimeError('rank 1 gives up')` on rank 1 right after `init_process_group`. `verdicts.json` is
that grade's verdicts and its rate over the course lab's; `run/` the harness's account of its failed
run at world size 2 (run.json) and its ranks' logs, from which the grade finds what ended it. Every
output is built from them as `distlab grade-class` builds it: one account (account.account) of the
cause first, the checks not reached, and why each point was lost.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import jsonschema

from harness.classgrade import account, outputs, platforms, rubric
from harness.classgrade.account import Outcome
from harness.classgrade.feedback import feedback_html, feedback_markdown
from harness.classgrade.outcome import ending_of, ran_to_its_checks
from harness.verdict import evaluate
from harness.verdict.verdicts import LESSON, Sample, Verdict

FIXTURE = Path(__file__).resolve().parent / "fixtures/classgrade/crash-rank1"
GRADESCOPE_SCHEMA = json.loads((FIXTURE.parent.parent / "gradescope/results.schema.json").read_text())
WRONG_FIXES = ("DistributedSampler(dataset", "Wrap the model in DistributedDataParallel",
               "Call dist.init_process_group", "Look for work in the step loop")


def crashed(tmp_path: Path) -> tuple[Outcome, rubric.Rubric]:
    """The crash's outcome as outcome.outcome_of makes it: the real verdicts, scored by the shipped
    rubric, and the ending found in the real run's folder."""
    stored = json.loads((FIXTURE / "verdicts.json").read_text())
    verdicts = [Verdict(**v) for v in stored["verdicts"]]
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE / "run", run_dir)
    sample = Sample(str(run_dir), "failed", stored["reason"], 30.0, None)
    ending = ending_of("ddp", 2, sample, run_dir, "carol.py")
    shipped = rubric.load()
    return Outcome("carol", "graded", "", shipped.score(verdicts), verdicts, {}, [], 40.0, stored["rate_ratio"],
                   sandboxed=False, endings=[ending]), shipped


def passing() -> Outcome:
    shipped = rubric.load()
    verdicts = [Verdict("ddp", 2, "run", "1/1 ok", "all ok", True),
                Verdict("ddp", 2, "observed:shards_disjoint", "passed", "passed", True),
                Verdict("ddp", 2, "observed:buffers_identical", LESSON, "passed", None, "lesson: statistics apart")]
    return Outcome("alice", "graded", "", shipped.score(verdicts), verdicts, {}, [], 30.0, 1.02, sandboxed=False)


def test_the_ending_names_the_rank_its_exception_and_the_programs_line(tmp_path):
    outcome, _ = crashed(tmp_path)
    (ending,) = outcome.endings
    assert (ending.rank, ending.said) == (1, "RuntimeError: rank 1 gives up"), ending
    assert ending.where.startswith('File "carol.py", line ') and ending.where.endswith("in main"), ending


def test_a_crash_leads_its_feedback_and_its_consequences_are_not_reached_with_no_fix(tmp_path):
    outcome, shipped = crashed(tmp_path)
    feedback = feedback_markdown(outcome, shipped, "")
    headings = [line for line in feedback.splitlines() if line.startswith("## ")]
    assert headings[0] == "## What ended your run", feedback
    ended = feedback.split("## What ended your run", 1)[1].split("\n## ", 1)[0]
    assert "rank 1" in ended and "RuntimeError: rank 1 gives up" in ended and "carol.py" in ended, ended
    assert "world size 2" in ended and "The fix:" in ended  # run it at that world size, read that rank's log
    for wrong in WRONG_FIXES:
        assert wrong not in feedback, (wrong, feedback)  # no fix for what the crash left unjudged
    assert "## Not reached" in feedback and "observed:shards_disjoint (world size 2)" in feedback, feedback
    told = account.account(outcome, shipped, shown_only=True)
    assert [f.check for f in told.ended] == ["run"] and told.causes == [], told
    assert told.states["each rank its own shard"] == account.NOT_REACHED, told.states
    html = feedback_html(outcome, shipped, "")
    assert html.index("What ended your run") < html.index("Visible score: ") < html.index("Not reached")


def test_every_lost_point_says_why_in_every_output(tmp_path):
    outcome, shipped = crashed(tmp_path)
    told = account.account(outcome, shipped, shown_only=False)
    feedback = feedback_markdown(outcome, shipped, "")
    tests = {t["name"]: t for t in platforms.gradescope_results(outcome, shipped)["tests"]}
    for score in outcome.scores:
        if score.passed:
            continue
        reason = told.reasons[score.item.name]
        assert reason.startswith(f"{account.points(score.item.points - score.score)} point(s) lost: "), reason
        assert tests[score.item.name]["output"].startswith(reason)
        if shipped.shown(score.item):
            assert reason.replace("|", "\\|") in feedback, (reason, feedback)
    # Items that pay only when the runs went well say so, and are not "to fix".
    assert "Gloo" not in tests["runs to the end"]["output"], tests["runs to the end"]  # the cause, not its echo
    assert "rank 1: RuntimeError: rank 1 gives up" in tests["runs to the end"]["output"]
    for name in ("an honest record", "resumes where it stopped"):
        assert told.states[name] == account.NOT_REACHED and "pays only when every run ends well" in told.reasons[
            name], told.reasons[name]
        assert account.NOT_REACHED in tests[name]["tags"]


def test_the_gradebook_has_maxima_reasons_and_lessons(tmp_path):
    outcome, shipped = crashed(tmp_path)
    outputs.gradebook_csv(tmp_path / "gradebook.csv", shipped, [outcome, passing()])
    rows = list(csv.DictReader((tmp_path / "gradebook.csv").open(newline="")))
    maxima, carol, alice = rows
    assert maxima["id"] == outputs.MAXIMA and float(maxima["score"]) == shipped.max_score
    assert all(maxima[i.name] == (account.points(i.points) if i.points else "lesson (0 points)")
               for i in shipped.items)
    assert carol["reason"].startswith("run (world size 2): the run at world size 2 ended early: rank 1: "
                                      "RuntimeError: rank 1 gives up"), carol["reason"]
    lesson = "BatchNorm statistics averaged"  # 0 points: its column says what the grader taught
    assert (carol[lesson], alice[lesson]) == (account.NOT_REACHED, "lesson"), (carol, alice)


def test_one_score_everywhere_and_a_crash_never_ranks(tmp_path):
    outcome, shipped = crashed(tmp_path)
    assert outcome.rate_ratio is not None  # its world size 1 runs were timed beside the course lab's
    outputs.gradebook_csv(tmp_path / "gradebook.csv", shipped, [outcome])
    row = list(csv.DictReader((tmp_path / "gradebook.csv").open(newline="")))[1]
    gradescope = platforms.gradescope_results(outcome, shipped)
    prairielearn = platforms.prairielearn_results(outcome, shipped)
    total = outcome.score
    assert total is not None
    assert total != account.rounded(total)  # partial credit: 6.3571 points, shown 6.36 everywhere
    assert float(row["score"]) == gradescope["score"] == account.rounded(total)
    assert abs(prairielearn["score"] * shipped.max_score - account.rounded(total)) < 1e-5
    said = account.score_line(outcome, shipped)  # the visible score, named so, and the total it is part of
    assert said.startswith("Visible score: ") and said in feedback_markdown(outcome, shipped, "")
    assert prairielearn["message"].startswith(account.score_line(outcome, shipped, total=True))
    assert f"({account.points(total)} / {account.points(shipped.max_score)})" in prairielearn["message"]
    jsonschema.validate(gradescope, GRADESCOPE_SCHEMA)
    assert "leaderboard" not in gradescope and not outcome.finished
    assert "leaderboard" in platforms.gradescope_results(passing(), shipped)


def test_the_class_page_counts_the_crash_as_its_own_row_and_ranks_only_finished_runs(tmp_path):
    outcome, shipped = crashed(tmp_path)
    counts = outputs.failed_checks([outcome, passing()])
    assert counts == {account.ENDED: 1}, counts  # no speed row, no shard row: those were not reached
    summary = {"profile": "cpu-smoke", "lab": "ddp", "jobs": 1, "graded": 2, "ungradable": 0, "mean": "-",
               "wall_seconds": 1.0, "sandbox": "none"}
    page = outputs.class_page(tmp_path, shipped, [outcome, passing()], summary).read_text()
    assert "a run ended early" in page and "RuntimeError: rank 1 gives up" in page  # the row, and carol's why
    speed = page.split("<h2>Slowest and fastest</h2>", 1)[1].split("<h2>", 1)[0]
    assert "alice" in speed and "carol" not in speed, speed


def test_a_run_that_failed_its_own_check_went_to_its_end_and_a_crash_did_not():
    own = {"provenance": {"argv": ["train.py"]}, "status": "failed", "reason": "a check failed",
           "checks": {"order_changes_per_epoch": {"passed": False}}}
    assert ran_to_its_checks(Sample("r", "failed", "rank 0 exited with code 1", 9.0, own))
    raised = {**own, "checks": {}, "reason": "RuntimeError: [Gloo] connection closed by peer"}
    assert not ran_to_its_checks(Sample("r", "failed", "rank 1 exited with code 1", 9.0, raised))
    replaced = {**own, "lab_status": "ok"}  # the launcher's account replaced the program's: a rank died after
    assert not ran_to_its_checks(Sample("r", "failed", "rank 1 was killed by SIGKILL", 9.0, replaced))
    harness = {"provenance": {"written_by": "harness"}, "status": "failed", "checks": {}}
    assert not ran_to_its_checks(Sample("r", "failed", "timed out", 9.0, harness))


def test_a_failed_check_that_ended_the_labs_run_is_the_cause_and_the_speed_it_left_unmeasured_is_not_reached():
    """No set_epoch: the lab's own check fails, it exits 1 (the contract's "a check failed"), so the run
    fails and no run is left to time. The check is what to fix; the failed run follows it; the speed row
    is not reached, with no fix (not "look for work in the step loop"), and counts on no class page."""
    shipped = rubric.load()
    ended_by_check = "check order_changes_per_epoch failed (rank 0 exited with code 1 (launcher exit code 1))"
    verdicts = [Verdict("ddp", 2, "run", "0/1 ok", "all ok", False, ended_by_check),
                Verdict("ddp", 2, "observed:order_changes_per_epoch", "FAILED", "passed", False,
                        "rank 0 trained in the same order in epochs 0 and 1"),
                Verdict("ddp", 2, "img_per_sec_ratio", "not measured", ">= 0.406 x course lab", False,
                        f"no run finished well to measure img_per_sec in (1 run(s) failed; the first: "
                        f"{ended_by_check})")]
    bob = Outcome("bob", "graded", "", shipped.score(verdicts), verdicts, {}, [], 30.0, None, sandboxed=False)
    told = account.account(bob, shipped, shown_only=False)
    assert [f.check for f in told.fixes] == ["observed:order_changes_per_epoch", "run"], told.fixes
    assert [f.check for f in told.not_reached] == ["img_per_sec_ratio"] and told.states["speed"] == "not reached"
    assert told.reasons["an honest record"].endswith("pays only when every run ends well; a run did not end well "
                                                     "(see What to fix)"), told.reasons
    assert outputs.failed_checks([bob]) == {"observed:order_changes_per_epoch": 1}
    assert "Look for work in the step loop" not in json.dumps(platforms.gradescope_results(bob, shipped))


def test_the_course_lab_in_the_class_profile_earns_every_point_though_the_two_host_cell_cannot_run():
    """cpu-class in the class sandbox: the two-host cell is "not run" (the sandbox's network is loopback
    only). The course lab's real verdicts (fixtures/classgrade/course-lab-cpu-class) earn all 16 points:
    a cell that cannot run here is no run that ended badly, so "an honest record" (paid only when every
    run ends well, for no claim found false) pays. It lost its point before. A cell the grade was
    stopped before is no run that ended well: there the item still pays nothing."""
    shipped = rubric.load()
    stored = json.loads((FIXTURE.parent / "course-lab-cpu-class/verdicts.json").read_text())
    verdicts = [Verdict(**v) for v in stored["verdicts"]]
    not_run = [v for v in verdicts if v.check == "run" and v.passed is None]
    assert [(v.lab, v.measured) for v in not_run] == [("ddp-two-hosts", "not run")], not_run
    scores = {s.item.name: s.score for s in shipped.score(verdicts)}
    assert sum(scores.values()) == shipped.max_score == 16 and scores["an honest record"] == 1, scores
    stopped = [v if v not in not_run else Verdict(v.lab, v.world_size, "run", "not run", "all ok", None,
                                                  evaluate.NO_RUN_ENDED) for v in verdicts]
    assert {s.item.name: s.score for s in shipped.score(stopped)}["an honest record"] == 0
