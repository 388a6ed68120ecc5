"""One account of a submission: what every output of a class grade says of it, decided once.

What each output says of a student's faults comes from one account (`account`): the cause first, the
checks a failed run left unjudged "not reached" with no fix of their own, and why every item lost what
it lost; the score is shown one way (`points`, `score_line`). The writers show it and decide nothing
of their own: outputs.py (the gradebook, the class page), feedback.py (each student's pages),
platforms.py (Gradescope's and PrairieLearn's results).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.classgrade import lessons
from harness.classgrade.rubric import Rubric, Score
from harness.verdict.verdicts import Verdict, is_lesson


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
    endings: list[Ending] = field(default_factory=list)  # what ended a cell's runs early (outcome.outcome_of)

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


def why(outcome: Outcome, rubric: Rubric) -> str:
    """A graded outcome's reason in one line, for staff (the gradebook, the class page): its first cause,
    then the sandbox's account; where nothing failed, each speed row not comparable."""
    first = account(outcome, rubric, shown_only=False).first()
    said = [first, *(text for text in outcome.findings() if text not in first)]
    return "; ".join(text for text in said if text) or "; ".join(not_comparable_lines(outcome.scores))


def not_comparable_lines(scores: list[Score]) -> list[str]:
    """Each speed row an item could not judge: why, with the interference measured and what to do."""
    return [f"{s.item.name}: {v.lab} ws={v.world_size} {v.check} {v.detail}" for s in scores for v in s.not_comparable]
