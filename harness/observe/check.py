"""A check the harness computed from its observations of a run: passed or failed, and what it saw
(data_parallel.py, shards.py, replicas.py and resume.py compute them); and the words its findings
are told in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str  # one line: what the harness saw
    applicable: bool = True  # False: nothing to judge (passed is then True, the detail says why)
    causes: tuple[str, ...] = ()  # what failed, where a check can fail for more than one thing (CLAIMS)
    # A failed check that costs nothing here (nothing the program evaluated, saved or reported depended
    # on it): the grader shows it as a lesson, with the fix (evaluate.observed_verdicts).
    lesson: bool = False

    def to_dict(self) -> dict[str, Any]:
        found = {"name": self.name, "passed": self.passed, "detail": self.detail, "applicable": self.applicable}
        return {**found, "lesson": True} if self.lesson else found


NOT_VERIFIED = "not verified"


def _first(items: list[str], each: str) -> str:
    """The first of several findings, and how many more of what (`each`: "rank", "overlap"): a bare
    "(and 1 more)" after "in epochs 0 and 1" reads as one more epoch."""
    more = len(items) - 1
    return items[0] + (f" (and {more} more {each}{'s' if more > 1 else ''})" if more else "")


def _join(numbers: list[int], last: str = ", ") -> str:
    words = [str(n) for n in numbers]
    return last.join(words) if len(words) <= 2 else ", ".join(words[:-1]) + last + words[-1]
