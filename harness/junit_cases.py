"""Turns grade verdicts into pytest test cases, so pytest writes the JUnit XML
(harness/report.py runs this file). Not part of the test suite."""

import os
from pathlib import Path

import pytest

from harness.report import load_verdicts

VERDICTS = load_verdicts(Path(os.environ["DISTLAB_VERDICTS"])) if "DISTLAB_VERDICTS" in os.environ else []


@pytest.mark.parametrize("verdict", VERDICTS,
                         ids=[f"{v.lab}-ws{v.world_size or 'all'}-{v.check}" for v in VERDICTS])
def test_verdict(verdict):
    if verdict.passed is None:
        pytest.skip(verdict.detail or "not applicable")
    assert verdict.passed, (f"{verdict.check}: measured {verdict.measured}, expected {verdict.expected}. "
                            f"{verdict.detail}")
