"""The rubric: which verdicts earn how many points, partial credit, and who sees each item when.

    name = "DDP, week 4"
    due = 2026-12-10T23:59:00Z            # optional; items visible "after_due_date" are hidden before it
    [limits]                              # the sandbox's (sandbox/limits.Limits), all optional
    memory_gib = 6, processes = 512, open_files = 4096, output_gib = 2, wall_s = 300, files = 10000, depth = 32
    [[items]]
    name = "each rank its own shard"      # a gradebook column
    checks = ["observed:shards_*"]        # verdict names (fnmatch patterns), at every world size
    points = 3
    partial = true                        # points x passed / judged; false: all or nothing
    visibility = "visible"                # visible | hidden | after_due_date | after_published
    absent_passes = false                 # true: no such verdict means none failed (claim:* exist only when
                                          # contradicted), full points if the runs themselves went well
    lessons_cost = false                  # true: a lesson (below) counts as a failed check of this item

An item is scored from the verdicts the grade reached, never from the program's record alone. A
verdict that does not apply (n/a) is not counted; an item none of whose checks was judged (the
run crashed before) earns nothing and says so. A speed verdict that is "not comparable" (the
machine's load could not tell the program's speed from the floor) is not counted either, and an item
left with only such verdicts keeps its points in a state of its own, "not comparable", shown with
the interference measured and what to do (grade again on a quieter machine).

A lesson (verdicts.is_lesson) is an observed mistake that nothing the program evaluated, saved or
reported depended on: BatchNorm statistics left apart on ranks that neither evaluate nor save
(observed:buffers_identical). It is shown in the feedback with its fix, as a failed check is, and
costs nothing, unless the item says `lessons_cost = true`: a course that wants the statistics
averaged whatever the program does with them gives that item points and sets it.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.classgrade.sandbox.limits import GIB, Limits
from harness.usage import UsageError
from harness.verdict.evaluate import NO_RUN_ENDED
from harness.verdict.profiles import tomllib
from harness.verdict.speed import NOT_COMPARABLE
from harness.verdict.verdicts import NOT_RUN, Verdict, is_lesson

DEFAULT = Path(__file__).resolve().parent / "rubrics" / "ddp.toml"
# Gradescope's four (its results.json uses the same words): after_published items are shown once staff
# publish the grades, which the grader cannot know, so its own feedback treats them as hidden.
VISIBILITY = ("visible", "hidden", "after_due_date", "after_published")
MAX_RUBRIC_BYTES = 1 << 20


@dataclass(frozen=True)
class Item:
    name: str
    checks: tuple[str, ...]
    points: float
    partial: bool
    visibility: str
    absent_passes: bool = False
    lessons_cost: bool = False

    def verdicts(self, verdicts: list[Verdict]) -> list[Verdict]:
        return [v for v in verdicts if any(fnmatch.fnmatchcase(v.check, pattern) for pattern in self.checks)]


@dataclass(frozen=True)
class Score:
    item: Item
    score: float
    judged: list[Verdict]  # the verdicts it was scored on (n/a left out)
    lessons: tuple[Verdict, ...] = ()  # lessons it shows at no cost (with lessons_cost they are in `judged`)
    # Speed verdicts the machine could not support (verdict/speed.py, speed_rule): neither passed nor failed.
    not_comparable: tuple[Verdict, ...] = ()

    @property
    def passed(self) -> bool:
        return self.score >= self.item.points

    @property
    def state(self) -> str:
        """What the gradebook, the feedback and Gradescope/PrairieLearn say of the item: "ok", "to fix",
        or "not comparable" (its speed could not be told from the machine's load: its points kept,
        never taken, and what to do said)."""
        return "to fix" if not self.passed else "not comparable" if self.not_comparable else "ok"

    @property
    def failed(self) -> list[Verdict]:
        """What the feedback shows of it: each failed check, then each lesson."""
        return [v for v in self.judged if v.passed is False or is_lesson(v)] + list(self.lessons)


@dataclass(frozen=True)
class Rubric:
    name: str
    path: Path
    items: tuple[Item, ...]
    limits: Limits
    due: dt.datetime | None = None

    @property
    def max_score(self) -> float:
        return sum(item.points for item in self.items)

    def score(self, verdicts: list[Verdict]) -> list[Score]:
        scores = []
        for item in self.items:
            found = item.verdicts(verdicts)
            judged = [v for v in found if v.passed is not None or (item.lessons_cost and is_lesson(v))]
            lessons = () if item.lessons_cost else tuple(v for v in found if is_lesson(v))
            passed = sum(bool(v.passed) for v in judged)
            incomparable = tuple(v for v in found if v.measured == NOT_COMPARABLE)
            if not judged:
                # A cell that cannot run here (the two-host cell in the class sandbox) is no run that ended
                # badly; one the grade was stopped before is (nothing of it was seen to end well).
                runs = [v for v in verdicts if v.check == "run" and (v.measured != NOT_RUN or v.detail == NO_RUN_ENDED)]
                # A lesson was judged, at no cost: its item's points are kept. So are a speed item's that
                # the machine could not judge: the grader never takes points for its own machine's load.
                earned = item.points if lessons or incomparable or (
                    item.absent_passes and runs and all(v.passed for v in runs)) else 0.0
            elif item.partial:
                earned = item.points * passed / len(judged)
            else:
                earned = item.points if passed == len(judged) else 0.0
            scores.append(Score(item, round(earned, 4), judged, lessons, incomparable))
        return scores

    def shown(self, item: Item, now: dt.datetime | None = None) -> bool:
        """Whether a student sees the item now (hidden and after_published items never; after_due_date
        ones once it passed)."""
        if item.visibility == "visible":
            return True
        if item.visibility in ("hidden", "after_published"):
            return False
        now = now or dt.datetime.now(dt.timezone.utc)
        return self.due is not None and now >= self.due


def _fail(path: Path, message: str) -> UsageError:
    return UsageError(f"rubric {path}: {message}")


def load(path: Path | None = None, due: dt.datetime | None = None) -> Rubric:
    """The rubric at `path` (the shipped ddp rubric by default), checked: one line naming the key otherwise.
    `due`: the course platform's due date (Gradescope's, per submission), in place of the rubric's own."""
    path = Path(path or DEFAULT)
    try:
        if not path.is_file() or path.stat().st_size > MAX_RUBRIC_BYTES:
            raise _fail(path, f"not a file of at most {MAX_RUBRIC_BYTES} bytes; give a rubric .toml "
                              f"(an example: {DEFAULT})")
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise _fail(path, f"unreadable ({error}); see {DEFAULT} for the format") from None
    unknown = set(data) - {"name", "due", "limits", "items"}
    if unknown:
        raise _fail(path, f"unknown key(s) {', '.join(sorted(unknown))}; allowed: name, due, limits, items")
    due = due or data.get("due")
    if due is not None:
        if not isinstance(due, dt.datetime):
            raise _fail(path, "due must be a TOML date-time, like 2026-12-10T23:59:00Z")
        due = due if due.tzinfo else due.replace(tzinfo=dt.timezone.utc)
    items = [_item(path, f"items[{number}]", raw, due) for number, raw in enumerate(data.get("items") or [], 1)]
    if not items:
        raise _fail(path, "has no [[items]]; each item names the checks it scores")
    if len({item.name for item in items}) != len(items):
        raise _fail(path, "two items have the same name (each is a gradebook column)")
    return Rubric(str(data.get("name") or path.stem), path, tuple(items), _limits(path, data.get("limits") or {}), due)


def _item(path: Path, where: str, raw: Any, due: dt.datetime | None) -> Item:
    """One [[items]] table, checked: one line naming the key otherwise."""
    if not isinstance(raw, dict):
        raise _fail(path, f"{where} must be a table ([[items]])")
    extra = set(raw) - {"name", "checks", "points", "partial", "visibility", "absent_passes", "lessons_cost"}
    if extra:
        raise _fail(path, f"{where} has unknown key(s) {', '.join(sorted(extra))}")
    name, checks, points = raw.get("name"), raw.get("checks"), raw.get("points")
    if not isinstance(name, str) or not name.strip() or "," in name or "\n" in name:
        raise _fail(path, f"{where}.name must be a one-line text without commas (it names a gradebook column)")
    if not isinstance(checks, list) or not checks or not all(isinstance(c, str) and c for c in checks):
        raise _fail(path, f"{where}.checks must be a list of verdict names, like [\"observed:shards_disjoint\"]")
    if isinstance(points, bool) or not isinstance(points, (int, float)) or not points >= 0 or points > 1e6:
        raise _fail(path, f"{where}.points must be a number from 0 to 1e6")
    visibility = raw.get("visibility", "visible")
    if visibility not in VISIBILITY:
        raise _fail(path, f"{where}.visibility must be one of {', '.join(VISIBILITY)}")
    if visibility == "after_due_date" and due is None:
        raise _fail(path, f"{where} is visible after_due_date, but the rubric has no due date")
    partial, absent = raw.get("partial", False), raw.get("absent_passes", False)
    lessons_cost = raw.get("lessons_cost", False)
    if not all(isinstance(flag, bool) for flag in (partial, absent, lessons_cost)):
        raise _fail(path, f"{where}.partial, .absent_passes and .lessons_cost must be true or false")
    return Item(name.strip(), tuple(checks), float(points), partial, visibility, absent, lessons_cost)


def _limits(path: Path, limits: dict[str, Any]) -> Limits:
    """The [limits] table, checked, in the sandbox's units (bytes, counts, seconds)."""
    units = {"memory_gib": ("memory_bytes", GIB), "output_gib": ("output_bytes", GIB), "processes": ("processes", 1),
             "open_files": ("open_files", 1), "wall_s": ("wall_s", 1), "files": ("files", 1), "depth": ("depth", 1)}
    if set(limits) - set(units):
        raise _fail(path, f"[limits] knows only {', '.join(units)}")
    values: dict[str, Any] = {}
    for key, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
            raise _fail(path, f"limits.{key} must be a positive number")
        field, scale = units[key]
        values[field] = float(value) if field == "wall_s" else int(value * scale)
    return Limits(**values)
