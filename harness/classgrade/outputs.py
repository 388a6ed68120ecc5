"""What a class grade writes: the gradebook, the class page, each student's feedback, Gradescope's files.

    gradebook.csv              a row of maxima, then one row per student: id, score, max, status, one column per
                               rubric item, reason (the first cause)
    class.html                 the scores' distribution, the checks failed most often first (a run that ended
                               early is a row of its own), slowest and fastest (of runs that all ended well)
    feedback/<id>.html, .md    what ended a run first; each item's points and why it lost any; each failed check:
                               what the harness saw, what it means, the fix, the lesson; the checks not reached
    gradescope/<id>/results.json   Gradescope's autograder results (score, tests[] with visibility, Markdown feedback)
    prairielearn/<id>/results.json PrairieLearn's external grader results (gradable, score 0..1, tests[])

Feedback shows the items a student may see now (rubric visibility; feedback.py); the gradebook and
the class page are the staff's and show everything. What each output says of a student's faults
comes from one account (account.py); Gradescope's and PrairieLearn's results are platforms.py's.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from pathlib import Path
from typing import Any

from harness.classgrade import lessons
from harness.classgrade.account import ENDED, Outcome, account, points, why
from harness.classgrade.feedback import feedback_html, feedback_markdown, html_text, mode_banner
from harness.classgrade.platforms import gradescope_results, prairielearn_results
from harness.classgrade.rubric import Rubric
from harness.files import write_bytes, write_json
from harness.report.pages import figures, md_html, page

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet takes for a formula (OWASP's list)


def csv_cell(text: str) -> str:
    """Text for a spreadsheet cell as text: one that would start a formula (`=HYPERLINK(...)`, `@SUM(...)`)
    gets a leading apostrophe, which every spreadsheet reads as "this is text"."""
    return f"'{text}" if text.startswith(FORMULA_START) else text


MAXIMA = "Points Possible"  # the id of the gradebook's row of maxima (Canvas's name for it; no student id has a space)


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
        counts.update(list(dict.fromkeys(causes)))  # once per student, in the order found: ties keep one order
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
    """The student's files: its feedback (.md, .html) and each platform's results.json, which carry
    the same Markdown feedback, made once here."""
    feedback = feedback_markdown(outcome, rubric, lesson_root)
    (out_dir / "feedback").mkdir(parents=True, exist_ok=True)
    write_bytes(out_dir / "feedback" / f"{outcome.key}.md", feedback.encode())
    write_bytes(out_dir / "feedback" / f"{outcome.key}.html", feedback_html(outcome, rubric, lesson_root).encode())
    by_platform = {"gradescope": gradescope_results(outcome, rubric, lesson_root, feedback=feedback),
                   "prairielearn": prairielearn_results(outcome, rubric, lesson_root, feedback=feedback)}
    for platform, results in by_platform.items():
        write_json(out_dir / platform / outcome.key / "results.json", results)
