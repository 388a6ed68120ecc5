"""The accuracy bands: how `distlab calibrate` makes them from the runs measured on the reference
host, and how a grade judges accuracy across world sizes (accuracy_vs_ws1, called by evaluate.py;
a band's min and max are judged there with every min/max band, band_verdict).

- min: the lowest accuracy measured - max(3 sd, ACCURACY_MARGIN); max 1.0. None where no run got
  ACCURACY_MARGIN above chance (a smoke run too short to learn: such a band could not fail).
- accuracy_delta across world sizes: ACCURACY_DELTA, the course's rule for the same global batch,
  whatever the reference host measured (a larger gap is reported: a lesson to fix, never a band to
  widen).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from harness.run.notes import CHANCE
from harness.verdict.expectations import LabExpectation
from harness.verdict.stats import spread
from harness.verdict.verdicts import Verdict, within

ACCURACY_DELTA = 0.05  # at the same global batch, every world size within this of world size 1
ACCURACY_MARGIN = 0.1  # below the lowest accuracy measured: another CPU's float rounding trains a little apart
ACCURACY_SPREADS = 3  # sd below the lowest accuracy measured, where that is more than ACCURACY_MARGIN


@dataclass(frozen=True)
class AccuracyBands:
    """What calibrate writes of a lab's accuracy: its band (min, max) and its accuracy_delta, each
    None where there is none; and what the measurements said that the profile's reader should know:
    the highest accuracy, where every run stayed at chance, and the gap across world sizes, where
    it was more than ACCURACY_DELTA."""

    band: dict[str, Any] | None = None
    delta: float | None = None
    at_chance: float | None = None
    gap: float | None = None


def accuracy_bands(accuracy: dict[int, list[float]], single_device: list[float] | None,
                   lesson: bool) -> AccuracyBands:
    """The accuracy bands of one lab from the accuracy of its runs, by world size. `single_device`:
    the accuracy of the runs standing for world size 1 when they are another row's. `lesson`: a row
    that shows an effect, whose gap across world sizes is shown beside the lesson, never graded."""
    learned = [v for values in accuracy.values() for v in values]
    if learned and max(learned) < CHANCE + ACCURACY_MARGIN:
        # Runs too short to learn (smoke): an accuracy band here could not fail a program that
        # does not learn either, so there is none; the grade profiles make the labs learn.
        return AccuracyBands(at_chance=max(learned))
    if lesson:
        return AccuracyBands(delta=ACCURACY_DELTA)
    if not learned:
        return AccuracyBands()
    lowest = min(min(v) for v in accuracy.values() if v)
    widest = max(spread(v) for v in accuracy.values() if v)
    band = {"min": round(max(0.0, lowest - max(ACCURACY_SPREADS * widest, ACCURACY_MARGIN)), 3), "max": 1.0}
    base = accuracy.get(1) if single_device is None else single_device
    if not (base and (single_device is not None or len(accuracy) > 1)):
        return AccuracyBands(band=band)
    # The course's rule, not the measured gap: the same global batch must reach the same
    # accuracy. A larger gap on the reference host is a lesson to fix, never a band to widen.
    gap = max(abs(statistics.fmean(v) - statistics.fmean(base)) for v in accuracy.values() if v)
    return AccuracyBands(band=band, delta=ACCURACY_DELTA, gap=gap if gap > ACCURACY_DELTA else None)


def accuracy_vs_ws1(exp: LabExpectation, ws: int, delta: float, base: float | None, here: float | None) -> Verdict:
    """The mean accuracy at world size `ws` (`here`) within `delta` (the row's accuracy_delta) of world
    size 1's (`base`: that of the runs standing for it)."""
    if base is None or here is None:
        return Verdict(exp.lab, ws, "accuracy_vs_ws1", "-", f"within {delta:g}", None,
                       f"needs successful runs with final accuracy at world sizes 1 and {ws}")
    compared = f"{exp.accuracy_metric} {here:.3f} at {ws} vs {base:.3f} at 1" + (
        f" ({exp.single_device})" if exp.single_device else "")
    return Verdict(exp.lab, ws, "accuracy_vs_ws1", f"{here - base:+.3f}", f"within ±{delta:g}",
                   abs(here - base) <= delta, compared, margin=within(abs(here - base), delta))
