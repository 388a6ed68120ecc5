"""The grade's JUnit XML, as CI systems read it: valid against the Jenkins xUnit schema and the Ant
JUnit schema (tests/fixtures/junit/, vendored), with times, the program, the run directories and
their logs, an `error` for a run that crashed and a `failure` for a check that failed."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_replay import FIXTURE, replay

from harness.report.pages import junit
from harness.verdict.verdicts import Sample, Verdict

xmlschema = pytest.importorskip("xmlschema")
SCHEMAS = Path(__file__).resolve().parent / "fixtures" / "junit"


@pytest.fixture(scope="module")
def schemas() -> dict[str, object]:
    return {name: xmlschema.XMLSchema(str(SCHEMAS / name)) for name in ("ant-junit.xsd", "jenkins-xunit-junit-10.xsd")}


def assert_valid(schemas, path: Path) -> None:
    for name, schema in schemas.items():
        errors = [str(error.reason) for error in schema.iter_errors(str(path))]
        assert not errors, f"{path.name} against {name}: {errors[:3]}"


def run_dir(root: Path, name: str, status: str, reason: str | None, program: str) -> Path:
    folder = root / "results" / name
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"program": program, "status": status, "reason": reason,
                                                 "rank_logs": {"0": "rank.0.log", "1": "rank.1.log"}}))
    return folder


def test_the_replayed_grade_s_junit_is_valid_and_times_each_cell(schemas, tmp_path, monkeypatch):
    """The JUnit of a real grade's runs (the replay fixture: cpu-smoke, baseline at 1, ddp at 1 and 2)."""
    monkeypatch.chdir(FIXTURE)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    replay(FIXTURE, tmp_path)
    (path,) = tmp_path.glob("grade/*/junit.xml")
    assert_valid(schemas, path)
    runs = json.loads((FIXTURE / "runs.json").read_text())["done"]
    suites = {s.get("name"): s for s in ET.parse(path).getroot()}
    assert set(suites) >= {"baseline.ws1", "ddp.ws1", "ddp.ws2"}
    for cell, dirs in runs.items():
        lab, ws = cell.split("@")
        suite = suites[f"{lab}.ws{ws}"]
        seconds = sum(json.loads((FIXTURE / d / "run.json").read_text())["wall_seconds"] for d in dirs)
        assert float(suite.get("time")) == pytest.approx(seconds, abs=1e-3)
        run_case = next(c for c in suite.iter("testcase") if c.get("name") == "run")
        assert float(run_case.get("time")) == pytest.approx(seconds, abs=1e-3)
        properties = {(p.get("name"), p.get("value")) for p in suite.iter("property")}
        assert any(name == "file" and value.endswith(f"labs/{lab}/train.py") for name, value in properties)
        # Relative to the report's folder (the replay's runs lie in the fixture, not under its results).
        logs = [os.path.relpath(FIXTURE / d, path.parent) for d in dirs]
        assert [value for name, value in sorted(properties) if name == "log"] == sorted(logs)
        assert all(f"{log}/rank.0.log" in suite.find("system-out").text for log in logs)
        assert suite.get("errors") == "0" and suite.get("failures") == str(
            sum(c.find("failure") is not None for c in suite.iter("testcase")))


def test_a_crashed_run_is_an_error_and_a_failed_check_a_failure(schemas, tmp_path):
    program = "/course/labs/ddp/train.py"
    crashed = run_dir(tmp_path, "ddp/20261203-crash", "failed", "rank 1 exited with code 1", program)
    fine = run_dir(tmp_path, "ddp/20261203-fine", "ok", None, program)
    done = {("ddp", 2): [Sample(str(crashed), "failed", "rank 1 exited with code 1", 12.5, None)],
            ("ddp", 4): [Sample(str(fine), "ok", None, 30.25, {})]}
    verdicts = [
        Verdict("ddp", 2, "run", "0/1 ok", "all ok", False, "rank 1 exited with code 1\x1b[31m\x00"),
        Verdict("ddp", 2, "final_accuracy", "-", "[0.9, 1]", False, "no successful run to measure"),
        Verdict("ddp", 4, "run", "1/1 ok", "all ok", True),
        Verdict("ddp", 4, "observed:shards_disjoint", "FAILED", "passed", False, "ranks 0 and 1 both fetched 256"),
        Verdict("ddp", 4, "img_per_sec_ratio", "-", ">= 0.5 x reference", None, "no expectation"),
        Verdict("ddp", None, "accuracy_across_world_sizes", "0.02", "<= 0.05", True),
    ]
    out = tmp_path / "results" / "grade" / "report" / "junit.xml"
    out.parent.mkdir(parents=True)
    junit(verdicts, out, done, started=1796300000.0)
    assert_valid(schemas, out)
    suites = {s.get("name"): s for s in ET.parse(out).getroot()}
    assert list(suites) == ["ddp.ws2", "ddp.ws4", "ddp.across"]
    two, four = suites["ddp.ws2"], suites["ddp.ws4"]
    assert (two.get("tests"), two.get("errors"), two.get("failures"), two.get("skipped")) == ("2", "2", "0", "0")
    assert (four.get("tests"), four.get("errors"), four.get("failures"), four.get("skipped")) == ("3", "0", "1", "1")
    cases = {c.get("name"): c for c in two.iter("testcase")}
    error = cases["run"].find("error")
    assert error is not None and cases["run"].find("failure") is None
    assert "rank 1 exited with code 1" in error.text and "../../ddp/20261203-crash" in error.text
    assert cases["final_accuracy"].find("error") is not None  # not measured, since the run crashed
    shards = next(c for c in four.iter("testcase") if c.get("name") == "observed:shards_disjoint")
    assert shards.find("failure") is not None and shards.find("error") is None
    assert float(two.get("time")) == 12.5 and float(four.get("time")) == 30.25
    assert float(cases["run"].get("time")) == 12.5 and float(cases["final_accuracy"].get("time")) == 0
    assert float(suites["ddp.across"].get("time")) == 42.75  # every run of the lab
    assert two.get("timestamp") == "2026-12-03T12:13:20"  # UTC, no zone: Ant's pattern
    assert "../../ddp/20261203-crash/rank.1.log" in two.find("system-out").text
    assert ("file", "/course/labs/ddp/train.py") in {(p.get("name"), p.get("value")) for p in two.iter("property")}
