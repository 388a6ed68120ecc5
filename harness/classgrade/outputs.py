"""What a class grade writes: the gradebook, the class page, each student's feedback, Gradescope's files.

    gradebook.csv              one row per student: id, score, max, status, one column per rubric item, reason
    class.html                 the scores' distribution, the checks failed most often first, slowest and fastest
    feedback/<id>.html, .md    each failed check: what the harness saw, what it means, the fix, the lesson
    gradescope/<id>/results.json   Gradescope's autograder results (score, tests[] with visibility, Markdown feedback)
    prairielearn/<id>/results.json PrairieLearn's external grader results (gradable, score 0..1, tests[])

Feedback shows the items a student may see now (rubric visibility); the gradebook and the class
page are the staff's and show everything. Every page of a grade run without the sandbox says so.
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
from harness.verdict.verdicts import Verdict

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

    def __post_init__(self) -> None:
        self.key = self.key or self.id
        self.mode = self.mode or ("bwrap" if self.sandboxed else "none")

    @property
    def score(self) -> float | None:
        return sum(s.score for s in self.scores) if self.status == "graded" else None

    def findings(self) -> list[str]:
        """The sandbox's account, one sentence each: breaches first, then refusals, then forgery, then
        what it left in its folder that the grader never opened."""
        account = self.sandbox or {}
        return ([f"stopped: {text}" for text in account.get("breaches", [])]
                + [f"the sandbox refused it: it {text}" for text in account.get("refusals", [])]
                + [f"tampering: {text}" for text in account.get("forged", [])]
                + [f"left in its folder: {text}" for text in account.get("left", [])]
                + [f"left outside its folder: {text}" for text in account.get("outside", [])])


def number(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet takes for a formula (OWASP's list)


def csv_cell(text: str) -> str:
    """Text for a spreadsheet cell as text: one that would start a formula (`=HYPERLINK(...)`, `@SUM(...)`)
    gets a leading apostrophe, which every spreadsheet reads as "this is text"."""
    return f"'{text}" if text.startswith(FORMULA_START) else text


def gradebook_csv(path: Path, rubric: Rubric, outcomes: list[Outcome]) -> None:
    """One row per student, the columns an LMS imports: an ungradable submission has no score (never a silent 0)."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow([csv_cell(name) for name in ["id", "score", "max", "status", *(i.name for i in rubric.items),
                                                  "reason"]])
    for outcome in outcomes:
        items = [number(s.score) for s in outcome.scores] if outcome.status == "graded" else [""] * len(rubric.items)
        reason = outcome.reason or "; ".join([*outcome.findings(), *not_comparable_lines(outcome.scores)])
        writer.writerow([csv_cell(outcome.id), number(outcome.score), number(rubric.max_score), outcome.status, *items,
                         csv_cell(" ".join(reason.split()))])
    write_bytes(path, text.getvalue().encode())


# ------------------------------------------------------------------------------------- feedback

@dataclass(frozen=True)
class Finding:
    check: str
    world_size: int | None
    saw: str
    lesson: lessons.Lesson | None


def findings(outcome: Outcome, rubric: Rubric, shown_only: bool) -> list[Finding]:
    """Each failed check of an item the reader may see, with its lesson; then crashes and the sandbox's account.
    A failed run comes last where something else was found: that is what ended it, so it is read first."""
    found: list[Finding] = []
    seen: set[tuple[str, int | None]] = set()
    for score in outcome.scores:
        if shown_only and not rubric.shown(score.item):
            continue
        for v in score.failed:
            if (v.check, v.world_size) not in seen:
                seen.add((v.check, v.world_size))
                found.append(Finding(v.check, v.world_size, v.detail or f"measured {v.measured}, expected "
                                     f"{v.expected}", lessons.lesson_for(v.check)))
    for key, saw in outcome.crashes:
        found.append(Finding(key, None, saw, lessons.LESSONS.get(key)))
    for text in outcome.findings():
        found.append(Finding("sandbox", None, text, lessons.LESSONS["sandbox"]))
    causes = [f for f in found if f.check != "run"]
    return causes + [f for f in found if f.check == "run"] if causes else found


def _visible_scores(outcome: Outcome, rubric: Rubric) -> list[Score]:
    return [s for s in outcome.scores if rubric.shown(s.item)]


def feedback_markdown(outcome: Outcome, rubric: Rubric, lesson_root: str) -> str:
    shown = _visible_scores(outcome, rubric)
    # What a program wrote (its errors, its folder's names) is quoted as code: it can add no heading,
    # no score line, no link and no HTML to the page.
    lines = [f"# {md_name(outcome.id)}: {rubric.name}", ""]
    if mode_banner(outcome.mode):
        lines += [f"**{mode_banner(outcome.mode)}**", ""]
    if outcome.status != "graded":
        lines += [f"**Ungradable**: {md_code(outcome.reason)}", ""]
    else:
        earned, most = sum(s.score for s in shown), sum(s.item.points for s in shown)
        hidden = len(outcome.scores) - len(shown)
        lines += [f"Score: **{earned:g} / {most:g}**" + (f" ({hidden} item(s) not shown yet)" if hidden else ""), "",
                  "| item | points | |", "|---|---|---|"]
        lines += [f"| {md_cell(s.item.name)} | {s.score:g} / {s.item.points:g} | {s.state} |" for s in shown]
        lines.append("")
        incomparable = not_comparable_lines(shown)
        if incomparable:
            lines += ["## Speed not comparable", "", *(f"- {md_code(line)}" for line in incomparable), ""]
    found = findings(outcome, rubric, shown_only=True)
    if found:
        lines += ["## What to fix", ""]
        for f in found:
            where = f" (world size {f.world_size})" if f.world_size else ""
            lines += [f"### {md_name(f.check)}{where}", "", f"- What the grader saw: {md_code(f.saw)}"]
            if f.lesson:
                lines += [f"- What it means: {f.lesson.meaning}", f"- The fix: {f.lesson.fix}",
                          f"- Lesson: [{f.lesson.section}]({lesson_root}{f.lesson.section})"]
            lines.append("")
    elif outcome.status == "graded":
        lines += ["Every check you can see passed.", ""]
    return "\n".join(lines) + "\n"


def feedback_html(outcome: Outcome, rubric: Rubric, lesson_root: str) -> str:
    e = html_text
    shown = _visible_scores(outcome, rubric)
    parts = [f"<h1>{e(outcome.id)}: {e(rubric.name)}</h1>"]
    if mode_banner(outcome.mode):
        parts.append(f"<p class='fail'><b>{e(mode_banner(outcome.mode))}</b></p>")
    if outcome.status != "graded":
        parts.append(f"<p class='fail'><b>Ungradable</b>: {e(outcome.reason)}</p>")
    else:
        earned, most = sum(s.score for s in shown), sum(s.item.points for s in shown)
        hidden = len(outcome.scores) - len(shown)
        parts.append(f"<p>Score: <b>{earned:g} / {most:g}</b>{f' ({hidden} item(s) not shown yet)' if hidden else ''}"
                     "</p><table><tr><th>item</th><th>points</th><th></th></tr>" + "".join(
                         f"<tr class='{'pass' if s.passed else 'fail'}'><td>{e(s.item.name)}</td>"
                         f"<td>{s.score:g} / {s.item.points:g}</td><td>{e(s.state)}</td></tr>"
                         for s in shown) + "</table>")
    found = findings(outcome, rubric, shown_only=True)
    if found:
        rows = []
        for f in found:
            lesson = f.lesson
            link = (f"<a href='{e(lesson_root + lesson.section)}'>{e(lesson.section)}</a>" if lesson else "")
            size = f"<br><small>world size {f.world_size}</small>" if f.world_size else ""
            rows.append(f"<tr><td><b>{e(f.check)}</b>{size}</td><td class='said'>{e(f.saw)}</td>"
                        f"<td>{md_html(lesson.meaning) if lesson else ''}</td>"
                        f"<td>{md_html(lesson.fix) if lesson else ''}</td><td>{link}</td></tr>")
        parts.append("<h2>What to fix</h2><table><tr><th>check</th><th>what the grader saw</th><th>what it means</th>"
                     "<th>the fix</th><th>lesson</th></tr>" + "".join(rows) + "</table>")
    elif outcome.status == "graded":
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


def _failed_lines(score: Score, lesson_root: str) -> list[str]:
    """A failed item's checks, what the grader saw, and each lesson's fix with its link (Markdown)."""
    lines = []
    for v in score.failed:
        where = f" (world size {v.world_size})" if v.world_size else ""
        saw = v.detail or f"measured {v.measured}, expected {v.expected}"
        lines.append(f"- **{md_name(v.check)}**{where}: {md_code(saw)}")  # what a program wrote, quoted
        lesson = lessons.lesson_for(v.check)
        if lesson:
            lines.append(f"  - the fix: {lesson.fix} Lesson: [{lesson.section}]({lesson_root}{lesson.section})")
    return lines


def not_comparable_lines(scores: list[Score]) -> list[str]:
    """Each speed row an item could not judge: why, with the interference measured and what to do."""
    return [f"{s.item.name}: {v.lab} ws={v.world_size} {v.check} {v.detail}" for s in scores for v in s.not_comparable]


def _item_output(score: Score, lesson_root: str) -> str:
    if score.passed and score.not_comparable:
        return "\n".join(f"- {md_code(line)}" for line in not_comparable_lines([score]))
    if score.passed:
        return "passed"
    return "\n".join(_failed_lines(score, lesson_root)) or "not reached: the run ended before this was checked"


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
    # status is optional there) and says "not comparable" in its tags and output instead.
    tests = [{"name": s.item.name, "score": s.score, "max_score": s.item.points,
              **({"status": "passed" if s.passed else "failed"} if s.state != "not comparable" else
                 {"tags": ["not comparable"]}),
              "output": _item_output(s, lesson_root), "visibility": s.item.visibility} for s in outcome.scores]
    results.update(score=outcome.score, tests=tests)
    if outcome.rate_ratio is not None:
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
    earned = outcome.score or 0.0
    hidden = len(outcome.scores) - len(shown)
    return {"gradable": True, "score": round(earned / rubric.max_score, 6) if rubric.max_score else 0.0,
            "message": f"{earned:g} of {rubric.max_score:g} points" + (f" ({hidden} item(s) not shown yet)"
                                                                      if hidden else ""),
            "output": feedback, "tests": [
                {"name": s.item.name, "description": f"checks: {', '.join(s.item.checks)}", "points": s.score,
                 "max_points": s.item.points,
                 "message": {"ok": "passed", "to fix": "to fix"}.get(s.state, s.state),
                 "output": _item_output(s, lesson_root)} for s in shown]}


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

    A run that did not end well is counted only where nothing else says why. A failed observed
    check makes the lab's ranks exit non-zero, a known crash (DDP's unused-parameter error) ends
    the run, and so does a sandbox breach. Counting "run" for those as well would put the
    consequence at the top of the page, above the pitfall that caused it."""
    counts: Counter[str] = Counter()
    for o in outcomes:
        failed = {v.check for v in o.verdicts if v.passed is False}
        causes = (failed - {"run"}) | {key for key, _ in o.crashes} | {
            "sandbox: " + text.split(":", 1)[0] for text in o.findings()}
        counts.update(causes or failed)
    return counts


def _lesson(check: str) -> lessons.Lesson | None:
    return lessons.LESSONS["sandbox"] if check.startswith("sandbox: ") else lessons.lesson_for(check)


def class_page(out_dir: Path, rubric: Rubric, outcomes: list[Outcome], summary: dict[str, Any]) -> Path:
    e = html_text
    image = _histogram(outcomes, rubric, out_dir / "scores.png")
    counts = failed_checks(outcomes)
    pitfalls = "".join(
        f"<tr><td>{e(check)}</td><td>{n}</td><td>{md_html(lesson.fix) if (lesson := _lesson(check)) else ''}"
        f"</td></tr>" for check, n in counts.most_common())
    timed = sorted((o for o in outcomes if o.seconds is not None and o.status == "graded"),
                   key=lambda o: (o.rate_ratio if o.rate_ratio is not None else -(o.seconds or 0.0)))
    def speed_row(o: Outcome) -> str:
        ratio = f"{o.rate_ratio:.2f}" if o.rate_ratio is not None else "-"
        return f"<tr><td>{e(o.id)}</td><td>{ratio}</td><td>{o.seconds:.1f}</td></tr>"
    speed = "".join(speed_row(o) for o in (timed[:3] + [o for o in timed[-3:] if o not in timed[:3]]))
    students = "".join(
        f"<tr class='{'fail' if o.status != 'graded' else ''}'>"
        f"<td><a href='feedback/{e(o.key)}.html'>{e(o.id)}</a></td>"
        f"<td>{number(o.score)}</td><td>{e(o.status)}</td><td class='said'>{e(o.reason or '; '.join(o.findings()))}"
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
the program's runs.</p>
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
