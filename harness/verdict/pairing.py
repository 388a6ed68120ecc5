"""Each cell's runs set against its reference runs: the cell's reference rate, and each run's own
(the paired ratios band_verdict judges a throughput on)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from harness.verdict.references import Reference
from harness.verdict.verdicts import Sample, sample_metric

Cell = tuple[str, int]  # a profile row and a world size


def reference_rates(reference_of: Callable[[str, int], Reference | None],
                    references: dict[Cell, list[Sample]]) -> dict[Cell, float | None]:
    """Each cell's reference rate: the mean of its reference runs. None where none succeeded."""
    rates: dict[Cell, float | None] = {}
    for (lab, ws), samples in references.items():
        reference = reference_of(lab, ws)
        if reference is None:  # the cell has no reference now (another profile): no rate
            rates[lab, ws] = None
            continue
        values = [v for s in samples if s.status == "ok" and (v := sample_metric(s, reference.metric))]
        rates[lab, ws] = statistics.fmean(values) if values else None
    return rates


def pair_references(reference_of: Callable[[str, int], Reference | None], done: dict[Cell, list[Sample]],
                    references: dict[Cell, list[Sample]]) -> None:
    """Each run's own reference rate (Sample.reference), for the paired ratios of band_verdict: the
    reference run just before it, or, where the cell's runs are bracketed (one reference run more
    than runs), the mean of the two around it. A reference run that failed pairs with nothing."""
    for cell, samples in done.items():
        reference = reference_of(*cell)
        if reference is None or cell not in references:
            continue
        rates = [sample_metric(s, reference.metric) if s.status == "ok" else None for s in references[cell]]
        bracketed = len(rates) == len(samples) + 1
        for i, sample in enumerate(samples):
            around = [r for r in (rates[i:i + 2] if bracketed else rates[i:i + 1]) if r]
            sample.reference = statistics.fmean(around) if around else None
