"""Gradescope's and PrairieLearn's results of a student, from the one account (account.py) every output shows.

    gradescope/<id>/results.json   Gradescope's autograder results (score, tests[] with visibility, Markdown feedback)
    prairielearn/<id>/results.json PrairieLearn's external grader results (gradable, score 0..1, tests[])
"""

from __future__ import annotations

from typing import Any

from harness.classgrade import lessons
from harness.classgrade.account import (
    NOT_REACHED,
    Account,
    Ending,
    Outcome,
    _saw,
    _visible_scores,
    account,
    not_comparable_lines,
    rounded,
    score_line,
)
from harness.classgrade.feedback import feedback_markdown
from harness.classgrade.rubric import Rubric, Score
from harness.report.pages import md_code, md_name

# Gradescope's results.json (gradescope-autograders.readthedocs.io, "Autograder Specifications") and
# PrairieLearn's external grader results (prairielearn.readthedocs.io, "External grading"), from the
# same outcome. Neither platform has a score for "could not be graded": Gradescope needs a number,
# so an ungradable submission scores 0 with a failed test and a tag naming it, and its status in
# extra_data (kept with the submission and in Gradescope's export), never a bare 0; PrairieLearn has
# its own `gradable: false` (no points awarded or lost, no attempt used).

UNGRADED = {"ungradable": "Ungradable", "error": "Not graded: the grader failed, not your program",
            "pending": "Not graded yet"}
LEADERBOARD = "rate / course lab"  # the rate_ratio the class page sorts by: higher is faster


def _failed_lines(score: Score, told: Account, lesson_root: str, endings: list[Ending]) -> list[str]:
    """A failed item's checks, what the grader saw, and each lesson's fix with its link (Markdown); a
    check not reached says so, with no fix of its own; a run that ended early, what ended it."""
    lines = []
    missed = {(f.check, f.world_size) for f in told.not_reached}
    ended = {(e.lab, e.world_size): e.headline() for e in endings}
    for v in score.failed:
        where = f" (world size {v.world_size})" if v.world_size else ""
        saw = ended.get((v.lab, v.world_size), _saw(v)) if v.check == "run" else _saw(v)
        lines.append(f"- **{md_name(v.check)}**{where}: {md_code(saw)}")  # what a program wrote, quoted
        lesson = lessons.lesson_for(v.check)
        if (v.check, v.world_size) in missed:
            lines.append(f"  - {NOT_REACHED}: a run ended before this could be judged; fix what ended it")
        elif lesson and not (v.check == "run" and told.ended):
            lines.append(f"  - the fix: {lesson.fix} Lesson: [{lesson.section}]({lesson_root}{lesson.section})")
    return lines



def _item_output(score: Score, told: Account, lesson_root: str, endings: list[Ending]) -> str:
    if score.passed and score.not_comparable:
        return "\n".join(f"- {md_code(line)}" for line in not_comparable_lines([score]))
    if score.passed:
        return "passed"
    return "\n".join([told.reasons[score.item.name], *_failed_lines(score, told, lesson_root, endings)])


def sandbox_mode(outcome: Outcome) -> str:
    """Which isolation graded it: "bwrap", "uid" (no namespaces) or "none" (Outcome.mode)."""
    return outcome.mode


def _extra_data(outcome: Outcome) -> dict[str, Any]:
    return {"distlab": {"status": outcome.status, "reason": outcome.reason, "sandbox": sandbox_mode(outcome),
                        "sandbox_findings": outcome.findings(), "rate_ratio": outcome.rate_ratio,
                        "run_seconds": outcome.seconds}}


def gradescope_results(outcome: Outcome, rubric: Rubric, lesson_root: str = "",
                       execution_time: float | None = None, feedback: str | None = None) -> dict[str, Any]:
    """Gradescope's results.json: the student's Markdown feedback as the top-level output (`md`; its
    default would render the text as HTML), one test per rubric item with the rubric's visibility
    (Gradescope applies its own due dates to after_due_date), a leaderboard entry where the rate
    was measured (shown only where the assignment enables leaderboards). `feedback`: that Markdown,
    where the caller made it already (outputs.write_student: once for every file of the student)."""
    feedback = feedback_markdown(outcome, rubric, lesson_root) if feedback is None else feedback
    results: dict[str, Any] = {"output": feedback, "output_format": "md",
                               "test_output_format": "md", "test_name_format": "text", "visibility": "visible",
                               "stdout_visibility": "hidden", "extra_data": _extra_data(outcome)}
    if execution_time is not None:
        results["execution_time"] = round(execution_time)
    if outcome.status != "graded":
        why = f"{UNGRADED.get(outcome.status, outcome.status)}: {md_code(outcome.reason)}"
        return {**results, "score": 0.0, "tests": [
            {"name": "gradable", "score": 0.0, "max_score": rubric.max_score, "status": "failed", "output": why,
             "tags": [outcome.status], "visibility": "visible"}]}
    # Gradescope knows "passed" and "failed"; a speed item the machine could not judge has neither (the
    # status is optional there) and says "not comparable" in its tags and output instead. An item not
    # reached (a run ended before its checks) fails, tagged so.
    told = account(outcome, rubric, shown_only=False)
    tests = [{"name": s.item.name, "score": rounded(s.score), "max_score": s.item.points,
              **({"status": "passed" if s.passed else "failed"} if s.state != "not comparable" else
                 {"tags": ["not comparable"]}),
              **({"tags": [NOT_REACHED]} if told.states[s.item.name] == NOT_REACHED and not s.passed else {}),
              "output": _item_output(s, told, lesson_root, outcome.endings), "visibility": s.item.visibility}
             for s in outcome.scores]
    results.update(score=rounded(outcome.score or 0.0), tests=tests)
    if outcome.rate_ratio is not None and outcome.finished:  # a run that did not end well never ranks
        results["leaderboard"] = [{"name": LEADERBOARD, "value": round(outcome.rate_ratio, 3), "order": "desc"}]
    return results


def prairielearn_results(outcome: Outcome, rubric: Rubric, lesson_root: str = "",
                         feedback: str | None = None) -> dict[str, Any]:
    """PrairieLearn's results.json: score as a fraction of the rubric's points, one test per item a
    student may see now (PrairieLearn shows every test it is given; the score counts them all).
    `feedback`: the student's Markdown feedback, as gradescope_results takes it."""
    feedback = feedback_markdown(outcome, rubric, lesson_root) if feedback is None else feedback
    if outcome.status != "graded":
        why = f"{UNGRADED.get(outcome.status, outcome.status)}: {outcome.reason}"
        return {"gradable": False, "format_errors": [why], "message": why, "output": feedback}
    shown = _visible_scores(outcome, rubric)
    earned = rounded(outcome.score or 0.0)  # the gradebook's points
    told = account(outcome, rubric, shown_only=True)
    return {"gradable": True, "score": round(earned / rubric.max_score, 6) if rubric.max_score else 0.0,
            "message": score_line(outcome, rubric, total=True) + (f"; {told.first()}" if told.first() else ""),
            "output": feedback, "tests": [
                {"name": s.item.name, "description": f"checks: {', '.join(s.item.checks)}", "points": rounded(s.score),
                 "max_points": s.item.points,
                 "message": {"ok": "passed"}.get(told.states[s.item.name], told.states[s.item.name]),
                 "output": _item_output(s, told, lesson_root, outcome.endings)} for s in shown]}


