"""Each student's feedback, feedback/<id>.html and .md: what ended a run first; each item's points
and why it lost any; each failed check: what the harness saw, what it means, the fix, the lesson; the
checks not reached.

Feedback shows the items a student may see now (rubric visibility), as their account says them
(account.py). Every page of a grade run without the sandbox says so (`mode_banner`).
"""

from __future__ import annotations

import html

from harness.classgrade.account import (
    Finding,
    Outcome,
    _visible_scores,
    account,
    not_comparable_lines,
    points,
    score_line,
)
from harness.classgrade.rubric import Rubric
from harness.console import printable
from harness.report.pages import md_cell, md_code, md_html, md_name, page

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


