"""What a class grade writes: the gradebook, the class page, each student's feedback, Gradescope's files.

    gradebook.csv              a row of maxima, then one row per student: id, score, max, status, one column per
                               rubric item, reason (the first cause)
    class.html                 the scores' distribution, the checks failed most often first (a run that ended
                               early is a row of its own), slowest and fastest (of runs that all ended well)
    feedback/<id>.html, .md    what ended a run first; each item's points and why it lost any; each failed check:
                               what the harness saw, what it means, the fix, the lesson; the checks not reached
    gradescope/<id>/results.json   Gradescope's autograder results (score, tests[] with visibility, Markdown feedback)
    prairielearn/<id>/results.json PrairieLearn's external grader results (gradable, score 0..1, tests[])

Feedback shows the items a student may see now (rubric visibility); the gradebook and the class
page are the staff's and show everything. What each output says of a student's faults comes from one
account (`account`): the cause first, the checks a failed run left unjudged "not reached" with no fix
of their own, and why every item lost what it lost; the score is shown one way (`points`,
`score_line`). Every page of a grade run without the sandbox says so.
"""

from __future__ import annotations

import csv
import html
import io
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.classgrade import lessons
from harness.classgrade.rubric import Rubric, Score
from harness.console import printable
from harness.files import write_bytes, write_json
from harness.report.pages import figures, md_cell, md_code, md_html, md_name, page
from harness.verdict.verdicts import Verdict, is_lesson

UNSANDBOXED = ("Graded WITHOUT the sandbox (--no-sandbox): submissions ran with the grader's rights; "
               "limits, network and file isolation were not enforced.")
UID_ONLY = ("Graded in the uid sandbox (--sandbox uid, where namespaces are refused): each submission ran as a "
            "uid of its own with its limits, the grader's files private to it; the network and the host's "
            "world-readable files were not hidden (docs/threat-model.md).")


def html_text(text: object) -> str:
    """Text a program could have written, in HTML: escaped, and its control and bidirectional
    characters shown, not obeyed (a right-to-left override would reorder the page's words)."""
    return html.escape(printable(str(text)))


def mode_banner(mode: str) -> str:
    """What every page of a grade says of its sandbox: nothing for bubblewrap's, else what it lacked."""
    return {"bwrap": "", "uid": UID_ONLY, "none": UNSANDBOXED}.get(mode, UNSANDBOXED)


@dataclass(frozen=True)
class Ending:
    """What ended a cell's runs before the program's own end (a crash, a hang, a stop), as the harness
    saw it: the rank, its last exception (else the run's reason), and where in the program, the last
    line of the rank's traceback that names it. The checks of that cell were not reached."""

    lab: str
    world_size: int | None
    rank: int | None
    said: str  # the rank's last exception line, else the run's reason
    where: str = ""  # 'File "train.py", line 114, in main' from the rank's log, where it has one

    def short(self) -> str:
        return f"the run{f' at world size {self.world_size}' if self.world_size else ''} ended early"

    def headline(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "a rank"
        return f"{self.short()}: {who}: {self.said}" + (f" ({self.where})" if self.where else "")


@dataclass
class Outcome:
    """One student's grade, as every output shows it."""

    id: str
    status: str  # "graded" | "ungradable" | "pending" (not graded yet)
    reason: str = ""
    scores: list[Score] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    sandbox: dict[str, Any] = field(default_factory=dict)  # breaches, refusals, forged (job.py)
    crashes: list[tuple[str, str]] = field(default_factory=list)  # (lesson key, what was seen)
    seconds: float | None = None  # the program's runs, wall time (mean)
    rate_ratio: float | None = None  # its harness-timed rate over the course lab's beside it, where measured
    sandboxed: bool = True
    mode: str = ""  # the sandbox it was graded in: "bwrap", "uid" or "none" ("" : by `sandboxed`)
    key: str = ""  # what its files are named (submissions.key_of): the id where it is a plain student id
    endings: list[Ending] = field(default_factory=list)  # what ended a cell's runs early (classroom.outcome_of)

    def __post_init__(self) -> None:
        self.key = self.key or self.id
        self.mode = self.mode or ("bwrap" if self.sandboxed else "none")

    @property
    def score(self) -> float | None:
        return sum(s.score for s in self.scores) if self.status == "graded" else None

    @property
    def finished(self) -> bool:
        """Graded, and every run ended well: only then does its speed rank it (class page, leaderboard)."""
        runs = [v for v in self.verdicts if v.check == "run"]
        return self.status == "graded" and bool(runs) and all(v.passed is not False for v in runs) \
            and not self.endings

    def findings(self) -> list[str]:
        """The sandbox's account, one sentence each: breaches first, then refusals, then forgery, then
        what it left in its folder that the grader never opened."""
        account = self.sandbox or {}
        return ([f"stopped: {text}" for text in account.get("breaches", [])]
                + [f"the sandbox refused it: it {text}" for text in account.get("refusals", [])]
                + [f"tampering: {text}" for text in account.get("forged", [])]
                + [f"left in its folder: {text}" for text in account.get("left", [])]
                + [f"left outside its folder: {text}" for text in account.get("outside", [])])


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet takes for a formula (OWASP's list)


def csv_cell(text: str) -> str:
    """Text for a spreadsheet cell as text: one that would start a formula (`=HYPERLINK(...)`, `@SUM(...)`)
    gets a leading apostrophe, which every spreadsheet reads as "this is text"."""
    return f"'{text}" if text.startswith(FORMULA_START) else text


MAXIMA = "Points Possible"  # the id of the gradebook's row of maxima (Canvas's name for it; no student id has a space)


def why(outcome: Outcome, rubric: Rubric) -> str:
    """A graded outcome's reason in one line, for staff (the gradebook, the class page): its first cause,
    then the sandbox's account; where nothing failed, each speed row not comparable."""
    first = account(outcome, rubric, shown_only=False).first()
    said = [first, *(text for text in outcome.findings() if text not in first)]
    return "; ".join(text for text in said if text) or "; ".join(not_comparable_lines(outcome.scores))


def gradebook_csv(path: Path, rubric: Rubric, outcomes: list[Outcome]) -> None:
    """One row per student, the columns an LMS imports, after a row of each column's maximum: an
    ungradable submission has no score (never a silent 0). The reason is the first cause (Account.first);
    an item worth no points (a lesson) says "lesson" where the grader taught it, "ok" where none was
    needed, "not reached" where a run ended before it."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow([csv_cell(name) for name in ["id", "score", "max", "status", *(i.name for i in rubric.items),
                                                  "reason"]])
    writer.writerow([MAXIMA, points(rubric.max_score), points(rubric.max_score), "maxima",
                     *(points(i.points) if i.points else "lesson (0 points)" for i in rubric.items),
                     "the most each column pays"])
    for outcome in outcomes:
        told = account(outcome, rubric, shown_only=False)
        items = [(points(s.score) if s.item.points else told.states[s.item.name]) for s in outcome.scores] \
            if outcome.status == "graded" else [""] * len(rubric.items)
        reason = outcome.reason or why(outcome, rubric)
        writer.writerow([csv_cell(outcome.id), "" if outcome.score is None else points(outcome.score),
                         points(rubric.max_score), outcome.status, *items, csv_cell(" ".join(reason.split()))])
    write_bytes(path, text.getvalue().encode())


# ------------------------------------------------------------------------------------- feedback

@dataclass(frozen=True)
class Finding:
    check: str
    world_size: int | None
    saw: str
    lesson: lessons.Lesson | None
    costs: bool = True  # False: a lesson (verdicts.is_lesson), taught at no cost


NOT_REACHED = "not reached"
ENDED = "run"  # the lesson of a run that ended early: the class page's row for crashes, hangs and stops


def rounded(value: float) -> float:
    """Points as every output gives them: two decimals at most (6.3333 is 6.33 everywhere)."""
    return round(value, 2)


def points(value: float) -> str:
    return f"{rounded(value):g}"


@dataclass(frozen=True)
class Account:
    """Why a student's grade is what it is, decided once for every output (feedback, gradebook, class
    page, Gradescope, PrairieLearn). What ended the runs comes first (a crash lesson, the sandbox's
    stop, the rank and its last exception); then each failed check judged on runs that went to their
    end, with its fix; then the checks that could not be judged because a run ended early or never
    finished well ("not reached"), which have no fix of their own: fixing what ended the run is theirs.
    Every item that lost points says why, in `reasons`."""

    ended: list[Finding]
    causes: list[Finding]
    not_reached: list[Finding]
    states: dict[str, str]  # item name -> "ok", "to fix", "not reached" or "not comparable"
    reasons: dict[str, str]  # item name -> why it lost points ("" where it lost none)

    @property
    def fixes(self) -> list[Finding]:
        """What to fix, in order: what ended the runs, then the failed checks."""
        return self.ended + self.causes

    def first(self) -> str:
        """The first cause in one line: the gradebook's reason, the class page's "why"."""
        found = next((f for f in self.fixes if f.costs), None)
        if found is None:
            return ""
        where = f" (world size {found.world_size})" if found.world_size else ""
        return " ".join(f"{found.check}{where}: {found.saw}".split())


def _saw(v: Verdict) -> str:
    return v.detail or f"measured {v.measured}, expected {v.expected}"


def _not_reached(v: Verdict, outcome: Outcome) -> bool:
    """A failed check that could not be judged: its cell's runs ended early (or, for a check across world
    sizes, a cell of its lab did), or it measures what only a run that finished well has."""
    cut = {(e.lab, e.world_size) for e in outcome.endings}
    return ((v.lab, v.world_size) in cut or (v.world_size is None and v.lab in {lab for lab, _ in cut})
            or (v.passed is False and v.measured == "not measured"))


def account(outcome: Outcome, rubric: Rubric | None, shown_only: bool) -> Account:
    """The outcome's account (Account), of the items the reader may see (`shown_only`, by the rubric) or
    of every verdict (for staff: a failed check no item scores is counted too)."""
    scores = [s for s in outcome.scores if not shown_only or (rubric is not None and rubric.shown(s.item))]
    scored = {id(v) for s in outcome.scores for v in s.judged}
    unscored = [] if shown_only else [v for v in outcome.verdicts if v.passed is False and id(v) not in scored]
    ended = [Finding(key, None, saw, lessons.LESSONS.get(key)) for key, saw in outcome.crashes]
    ended += [Finding(ENDED, e.world_size, e.headline(), lessons.LESSONS[ENDED]) for e in outcome.endings]
    found = outcome.findings()
    stops = [text for text in found if text.startswith("stopped: ")]  # the sandbox stopped a run: it ended it
    ended = [Finding("sandbox", None, text, lessons.LESSONS["sandbox"]) for text in stops] + ended
    causes: list[Finding] = []
    missed: list[Finding] = []
    seen: set[tuple[str, int | None]] = set()
    failed_run: list[Finding] = []
    states: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for score in scores:
        unjudged = [v for v in score.failed if _not_reached(v, outcome) or (v.check == "run" and outcome.endings)]
        judged = [v for v in score.failed if v not in unjudged]
        for v in score.failed:
            if (v.check, v.world_size) in seen:
                continue
            seen.add((v.check, v.world_size))
            if v.check == "run" and outcome.endings:
                continue  # said by the ending, with the rank and its exception
            finding = Finding(v.check, v.world_size, _saw(v), lessons.lesson_for(v.check), not is_lesson(v))
            if v in unjudged:
                missed.append(Finding(v.check, v.world_size, _saw(v), None))
            elif v.check == "run":
                failed_run.append(finding)  # a consequence where a check failed: it ends the lab's run
            else:
                causes.append(finding)
        states[score.item.name], reasons[score.item.name] = _item_state(score, judged, unjudged, outcome)
    for v in unscored:
        if (v.check, v.world_size) in seen or (v.check == "run" and outcome.endings):
            continue
        seen.add((v.check, v.world_size))
        finding = Finding(v.check, v.world_size, _saw(v), lessons.lesson_for(v.check))
        (missed if _not_reached(v, outcome) else failed_run if v.check == "run" else causes).append(finding)
    causes += [Finding("sandbox", None, text, lessons.LESSONS["sandbox"]) for text in found if text not in stops]
    causes += failed_run  # last: what it follows from is read first
    return Account(ended, causes, missed, states, reasons)


def _item_state(score: Score, judged: list[Verdict], unjudged: list[Verdict], outcome: Outcome) -> tuple[str, str]:
    """An item's state and, where it lost points, why (the student's words)."""
    ending = next((f"{e.short()} (see What ended your run)" for e in outcome.endings), "")
    if not score.item.points:  # a lesson: taught, not reached, or none needed; it costs nothing
        return ("lesson", "") if judged else (NOT_REACHED, ending) if unjudged else (score.state, "")
    if score.passed:
        return score.state, ""
    lost = f"{points(score.item.points - score.score)} point(s) lost: "
    if ending and any(v.check == "run" for v in unjudged):  # the run itself: what ended it is the cause
        return "to fix", f"{lost}{ending}"
    if judged:
        names = ", ".join(dict.fromkeys(f"{v.check}" + (f" at world size {v.world_size}" if v.world_size else "")
                                        for v in judged))
        return "to fix", f"{lost}failed {names} (see What to fix)"
    if unjudged:
        return NOT_REACHED, f"{lost}not reached: " + (ending or _saw(unjudged[0]))
    runs = [v for v in outcome.verdicts if v.check == "run" and v.passed is False]
    if score.item.absent_passes:  # paid for nothing found wrong, where the runs themselves went well
        why = ending or ("a run did not end well (see What to fix)" if runs else "no run of the program ended well")
        return NOT_REACHED, f"{lost}not reached: this item pays only when every run ends well; {why}"
    return NOT_REACHED, f"{lost}not reached: none of its checks was judged" + (f"; {ending}" if ending else
                                                                                " (the runs ended before them)")


def findings(outcome: Outcome, rubric: Rubric, shown_only: bool) -> list[Finding]:
    """What to fix, in the order the feedback shows it (Account.fixes)."""
    return account(outcome, rubric, shown_only).fixes


def _visible_scores(outcome: Outcome, rubric: Rubric) -> list[Score]:
    return [s for s in outcome.scores if rubric.shown(s.item)]


def score_line(outcome: Outcome, rubric: Rubric, total: bool = False) -> str:
    """The score as every student-facing output says it, in plain text: the visible score, and where
    items are not shown yet, that they count in the total, which is the gradebook's (and Gradescope's and
    PrairieLearn's score). `total`: say the total earned too, where the platform shows it anyway
    (PrairieLearn's score); feedback never does (it would tell what the hidden items earned)."""
    shown = _visible_scores(outcome, rubric)
    earned, most = sum(s.score for s in shown), sum(s.item.points for s in shown)
    hidden = len(outcome.scores) - len(shown)
    if not hidden:
        return f"Score: {points(earned)} / {points(most)}"
    of_total = f"{points(outcome.score or 0.0)} / " if total else ""
    return (f"Visible score: {points(earned)} / {points(most)} on the items shown to you now; {hidden} item(s) "
            f"not shown yet count in the total ({of_total}{points(rubric.max_score)})")


def _fix_lines(f: Finding, lesson_root: str) -> list[str]:
    where = f" (world size {f.world_size})" if f.world_size else ""
    lines = [f"### {md_name(f.check)}{where}", "", f"- What the grader saw: {md_code(f.saw)}"]
    if f.lesson:
        lines += [f"- What it means: {f.lesson.meaning}", f"- The fix: {f.lesson.fix}",
                  f"- Lesson: [{f.lesson.section}]({lesson_root}{f.lesson.section})"]
    return lines + [""]


NOT_REACHED_SAYS = ("The grader could not judge these, because a run ended early or none finished well: "
                    "they have no fix of their own. Fix what ended the run; they are judged again then.")


def feedback_markdown(outcome: Outcome, rubric: Rubric, lesson_root: str) -> str:
    shown = _visible_scores(outcome, rubric)
    told = account(outcome, rubric, shown_only=True)
    # What a program wrote (its errors, its folder's names) is quoted as code: it can add no heading,
    # no score line, no link and no HTML to the page.
    lines = [f"# {md_name(outcome.id)}: {rubric.name}", ""]
    if mode_banner(outcome.mode):
        lines += [f"**{mode_banner(outcome.mode)}**", ""]
    if outcome.status != "graded":
        lines += [f"**Ungradable**: {md_code(outcome.reason)}", ""]
    if told.ended:  # the cause first: what ended the runs, before any score or consequence
        lines += ["## What ended your run", ""]
        for f in told.ended:
            lines += _fix_lines(f, lesson_root)
    if outcome.status == "graded":
        lines += [f"**{score_line(outcome, rubric)}**", "", "| item | points | | why |", "|---|---|---|---|"]
        lines += [f"| {md_cell(s.item.name)} | {points(s.score)} / {points(s.item.points)} | "
                  f"{told.states[s.item.name]} | {md_cell(told.reasons[s.item.name])} |" for s in shown]
        lines.append("")
        incomparable = not_comparable_lines(shown)
        if incomparable:
            lines += ["## Speed not comparable", "", *(f"- {md_code(line)}" for line in incomparable), ""]
    if told.causes:
        lines += ["## What to fix", ""]
        for f in told.causes:
            lines += _fix_lines(f, lesson_root)
    if told.not_reached and outcome.status == "graded":
        lines += ["## Not reached", "", NOT_REACHED_SAYS, ""]
        lines += [f"- {md_name(f.check)}" + (f" (world size {f.world_size})" if f.world_size else "")
                  + f": {md_code(f.saw)}" for f in told.not_reached]
        lines.append("")
    if outcome.status == "graded" and not told.fixes:
        lines += ["Every check you can see passed.", ""]
    return "\n".join(lines) + "\n"


def _fix_rows(found: list[Finding], lesson_root: str) -> str:
    e = html_text
    rows = []
    for f in found:
        lesson = f.lesson
        link = f"<a href='{e(lesson_root + lesson.section)}'>{e(lesson.section)}</a>" if lesson else ""
        size = f"<br><small>world size {f.world_size}</small>" if f.world_size else ""
        rows.append(f"<tr><td><b>{e(f.check)}</b>{size}</td><td class='said'>{e(f.saw)}</td>"
                    f"<td>{md_html(lesson.meaning) if lesson else ''}</td>"
                    f"<td>{md_html(lesson.fix) if lesson else ''}</td><td>{link}</td></tr>")
    return ("<table><tr><th>check</th><th>what the grader saw</th><th>what it means</th><th>the fix</th>"
            "<th>lesson</th></tr>" + "".join(rows) + "</table>")


def feedback_html(outcome: Outcome, rubric: Rubric, lesson_root: str) -> str:
    e = html_text
    shown = _visible_scores(outcome, rubric)
    told = account(outcome, rubric, shown_only=True)
    parts = [f"<h1>{e(outcome.id)}: {e(rubric.name)}</h1>"]
    if mode_banner(outcome.mode):
        parts.append(f"<p class='fail'><b>{e(mode_banner(outcome.mode))}</b></p>")
    if outcome.status != "graded":
        parts.append(f"<p class='fail'><b>Ungradable</b>: {e(outcome.reason)}</p>")
    if told.ended:
        parts.append("<h2>What ended your run</h2>" + _fix_rows(told.ended, lesson_root))
    if outcome.status == "graded":
        parts.append(f"<p>{e(score_line(outcome, rubric))}</p>"
                     "<table><tr><th>item</th><th>points</th><th></th><th>why</th></tr>" + "".join(
                         f"<tr class='{'pass' if s.passed else 'fail'}'><td>{e(s.item.name)}</td>"
                         f"<td>{points(s.score)} / {points(s.item.points)}</td><td>{e(told.states[s.item.name])}</td>"
                         f"<td>{e(told.reasons[s.item.name])}</td></tr>" for s in shown) + "</table>")
    if told.causes:
        parts.append("<h2>What to fix</h2>" + _fix_rows(told.causes, lesson_root))
    if told.not_reached and outcome.status == "graded":
        parts.append(f"<h2>Not reached</h2><p>{e(NOT_REACHED_SAYS)}</p><ul>" + "".join(
            f"<li><b>{e(f.check)}</b>{f' (world size {f.world_size})' if f.world_size else ''}: {e(f.saw)}</li>"
            for f in told.not_reached) + "</ul>")
    if outcome.status == "graded" and not told.fixes:
        parts.append("<p>Every check you can see passed.</p>")
    return page(e(f"{outcome.id}: {rubric.name}"), "\n".join(parts))


# ------------------------------------------------------------------- Gradescope and PrairieLearn
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


def not_comparable_lines(scores: list[Score]) -> list[str]:
    """Each speed row an item could not judge: why, with the interference measured and what to do."""
    return [f"{s.item.name}: {v.lab} ws={v.world_size} {v.check} {v.detail}" for s in scores for v in s.not_comparable]


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
                       execution_time: float | None = None) -> dict[str, Any]:
    """Gradescope's results.json: the student's Markdown feedback as the top-level output (`md`; its
    default would render the text as HTML), one test per rubric item with the rubric's visibility
    (Gradescope applies its own due dates to after_due_date), a leaderboard entry where the rate
    was measured (shown only where the assignment enables leaderboards)."""
    results: dict[str, Any] = {"output": feedback_markdown(outcome, rubric, lesson_root), "output_format": "md",
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


def prairielearn_results(outcome: Outcome, rubric: Rubric, lesson_root: str = "") -> dict[str, Any]:
    """PrairieLearn's results.json: score as a fraction of the rubric's points, one test per item a
    student may see now (PrairieLearn shows every test it is given; the score counts them all)."""
    feedback = feedback_markdown(outcome, rubric, lesson_root)
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


# ------------------------------------------------------------------------------------ class page

def _histogram(outcomes: list[Outcome], rubric: Rubric, out: Path) -> Path | None:
    scores = [o.score for o in outcomes if o.score is not None]
    if not scores:
        return None
    from harness.report.plots import pyplot  # one matplotlib setup (Agg) for every PNG

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3))
    top = max(rubric.max_score, 1)
    ax.hist(scores, bins=min(20, max(5, int(top))), range=(0, top), color="#4a7ebb", edgecolor="white")
    ax.set_xlabel(f"score (of {top:g})")
    ax.set_ylabel("students")
    ax.yaxis.get_major_locator().set_params(integer=True)  # students are counted whole
    ax.set_title(f"{len(scores)} graded, {sum(o.status == 'ungradable' for o in outcomes)} ungradable")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def failed_checks(outcomes: list[Outcome]) -> Counter[str]:
    """How many students failed each check (once per student, at any world size): the pitfall first.

    Counted as each student's feedback tells it (Account): what ended a run (a known crash, a sandbox
    stop, else "run": a crash, hang or stop, a row of its own), then each failed check judged on runs
    that went to their end. A failed run is counted only where nothing else says why (a failed
    observed check makes the lab's ranks exit non-zero), and a check not reached never is: counting
    the consequences would put them at the top of the page, above the pitfall that caused them."""
    counts: Counter[str] = Counter()
    for o in outcomes:
        told = account(o, None, shown_only=False)
        named = [f.check if f.check != "sandbox" else "sandbox: " + f.saw.split(":", 1)[0] for f in told.fixes
                 if f.costs]  # a lesson is taught, not counted
        causes = [name for name in named if name != "run"] or named
        counts.update(set(causes))
    return counts


# The class page's name of a row where the check's own is not one a reader knows.
PITFALL_NAMES = {ENDED: "a run ended early (a rank crashed, hung or was stopped)"}


def _lesson(check: str) -> lessons.Lesson | None:
    return lessons.LESSONS["sandbox"] if check.startswith("sandbox: ") else lessons.lesson_for(check)


def class_page(out_dir: Path, rubric: Rubric, outcomes: list[Outcome], summary: dict[str, Any]) -> Path:
    e = html_text
    image = _histogram(outcomes, rubric, out_dir / "scores.png")
    counts = failed_checks(outcomes)
    pitfalls = "".join(
        f"<tr><td>{e(PITFALL_NAMES.get(check, check))}</td><td>{n}</td>"
        f"<td>{md_html(lesson.fix) if (lesson := _lesson(check)) else ''}</td></tr>"
        for check, n in counts.most_common())
    # Only a program whose runs all ended well ranks: a crash's wall time says nothing of its speed.
    timed = sorted((o for o in outcomes if o.seconds is not None and o.finished),
                   key=lambda o: (o.rate_ratio if o.rate_ratio is not None else -(o.seconds or 0.0)))
    def speed_row(o: Outcome) -> str:
        ratio = f"{o.rate_ratio:.2f}" if o.rate_ratio is not None else "-"
        return f"<tr><td>{e(o.id)}</td><td>{ratio}</td><td>{o.seconds:.1f}</td></tr>"
    speed = "".join(speed_row(o) for o in (timed[:3] + [o for o in timed[-3:] if o not in timed[:3]]))
    students = "".join(
        f"<tr class='{'fail' if o.status != 'graded' else ''}'>"
        f"<td><a href='feedback/{e(o.key)}.html'>{e(o.id)}</a></td>"
        f"<td>{'' if o.score is None else points(o.score)}</td><td>{e(o.status)}</td>"
        f"<td class='said'>{e(o.reason or (why(o, rubric) if o.status == 'graded' else '; '.join(o.findings())))}"
        "</td></tr>"
        for o in outcomes)
    said = mode_banner(summary.get("sandbox", "bwrap" if summary.get("sandboxed", True) else "none"))
    banner = f"<p class='fail'><b>{e(said)}</b></p>" if said else ""
    profile = f"<b>{e(summary['profile'])}</b>" + (f" ({e(summary['profile_file'])})" if summary.get("profile_file")
                                                    else "")
    body = f"""<h1>{e(rubric.name)}: {len(outcomes)} submission(s)</h1>{banner}
<p>Lab <b>{e(summary['lab'])}</b>, profile {profile}, {summary['jobs']} job(s) side by side;
{summary['graded']} graded, {summary['ungradable']} ungradable; mean score {summary['mean']} of {rubric.max_score:g};
{'regraded from the stored runs in ' if summary.get('regraded') else ''}{summary['wall_seconds']:.0f} s.</p>
<h2>Scores</h2>{figures([image]) if image else '<p>No submission was graded.</p>'}
<h2>Checks failed, the most common first</h2>
<table><tr><th>check</th><th>students</th><th>the fix</th></tr>{pitfalls or '<tr><td colspan=3>none</td></tr>'}</table>
<h2>Slowest and fastest</h2>
<p>Rate over the course lab's, run beside it in the same conditions (where the profile times it); wall time of
the program's runs. Only programs whose runs all ended well are ranked.</p>
<table><tr><th>student</th><th>rate / course lab</th><th>seconds</th></tr>{speed}</table>
<h2>Every submission</h2>
<table><tr><th>student</th><th>score</th><th>status</th><th>why / what the sandbox saw</th></tr>{students}</table>
"""
    path = out_dir / "class.html"
    write_bytes(path, page(e(f"class grade: {rubric.name}"), body).encode())
    return path


def write_student(out_dir: Path, outcome: Outcome, rubric: Rubric, lesson_root: str) -> None:
    (out_dir / "feedback").mkdir(parents=True, exist_ok=True)
    write_bytes(out_dir / "feedback" / f"{outcome.key}.md", feedback_markdown(outcome, rubric, lesson_root).encode())
    write_bytes(out_dir / "feedback" / f"{outcome.key}.html", feedback_html(outcome, rubric, lesson_root).encode())
    for platform, results in (("gradescope", gradescope_results(outcome, rubric, lesson_root)),
                              ("prairielearn", prairielearn_results(outcome, rubric, lesson_root))):
        write_json(out_dir / platform / outcome.key / "results.json", results)
