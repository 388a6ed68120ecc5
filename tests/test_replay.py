"""A grade replayed from stored runs: the same verdicts, byte for byte, with no training.

tests/fixtures/replay holds what one real `distlab grade` (cpu-smoke: baseline at world size 1, ddp
at 1 and 2, each beside its reference loop) left behind and read after each launch: run.json,
record.json, every rank's observations, and the accuracy the harness measured from rank 0's weights
(measured.json; tests/fixtures/replay/capture.py says how it was made). The replay runs the grading
stage itself (grading.plan_grade, grading.run_grade) and the grade command's report, with the launches
replaced by those runs: the plan, the observed checks, the throughput the harness times, the claims
compared, the reference pairing, every verdict and the report. A change that is meant to leave
behaviour alone (a refactor) must leave expected_verdicts.json as it is. tests/fixtures/replay-wrong
holds the grade of a wrong program the same way (capture.py --wrong): a lenient grader changes its
failed rows and contradicted claims.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.commands import grade
from harness.grading.execute import execute
from harness.grading.judge import run_grade
from harness.grading.plan import plan_grade
from harness.grading.stored import cell_key
from harness.run.launchers import Failure
from harness.run.state import RunResult
from harness.verdict.profiles import resolve

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "replay"
EXPECTED = FIXTURE / "expected_verdicts.json"


class StoredMeasurements:
    """The evaluator's answers as the real grade got them (its weights are not kept)."""

    def __init__(self, answers: dict[str, dict]) -> None:
        self.answers = answers

    def measure(self, observe_dir: Path | str, lab_args: list[str]) -> dict:
        return self.answers[str(Path(observe_dir).parent)]


def stored_result(run_dir: str) -> RunResult:
    """The RunResult that run_lab returned for this run, from the run.json and record.json it wrote."""
    run = json.loads((Path(run_dir) / "run.json").read_text())
    record = json.loads((Path(run_dir) / "record.json").read_text())
    return RunResult(Path(run_dir), run["returncode"], run["status"], run["reason"], record,
                     Failure(**run["failure"]) if run["failure"] else None, run["wall_seconds"],
                     run["timed_out"], run["interrupted"], run["hang_suspected"], run["stopped_by"], run.get("cpu"))


# The grades the fixtures stored (runs.json's "args": the command line each was captured with):
# folder -> (labs, world sizes, programs by row). replay-wrong: a student's program that never
# all-reduces and lies about it, graded against the course lab (capture.py --wrong).
PROFILE = "cpu-smoke"
GRADES = {"replay": (["baseline", "ddp"], [1, 2], {}), "replay-wrong": (["ddp"], [2], {"ddp": "program.py"})}


def replay(fixture: Path, results: Path) -> bytes:
    """The grading stage over the stored runs, then the grade's report; the verdicts.json it writes."""
    labs, world_sizes, programs = GRADES[fixture.name]
    runs = json.loads((fixture / "runs.json").read_text())
    assert runs["args"] == ["grade", "--profile", PROFILE, "--labs", ",".join(labs),
                            "--world-sizes", ",".join(map(str, world_sizes)),
                            *(arg for row, path in programs.items() for arg in ("--program", f"{row}={path}"))]
    evaluator = StoredMeasurements(json.loads((fixture / "measured.json").read_text()))

    grade_plan = plan_grade(resolve(PROFILE, {}), labs=labs, world_sizes=world_sizes, results_root=results,
                            programs={row: fixture / path for row, path in programs.items()})
    assert [cell_key(cell) for cell in grade_plan.cells()] == list(runs["done"])
    # Each cell's requests are built once (GradePlan): the one the loop starts says which stored run comes next.
    stored = {}
    for cell in grade_plan.cells():
        stored[id(grade_plan.request(*cell))] = list(runs["done"][cell_key(cell)])
        if grade_plan.reference_request(*cell) is not None:
            stored[id(grade_plan.reference_request(*cell))] = list(runs["references"].get(cell_key(cell), []))

    def replayed_run(request, echo=False, on_line=None):
        assert stored[id(request)], f"the loop asked for a run of {request.lab} at {request.world_size} the grade " \
                                    "did not make"
        return stored_result(stored[id(request)].pop(0))

    def execute_cells(grade_plan, done, references):  # the real loop, its runs and evaluations stored ones
        execute(grade_plan, done, references, runner=replayed_run, evaluator=evaluator)
        assert not any(stored.values()), "the grade made runs the loop did not ask for"

    grade.report(run_grade(grade_plan, execute_cells=execute_cells))
    return next(results.glob("grade/*/verdicts.json")).read_bytes()


def replayed(fixture: Path, results: Path, monkeypatch) -> list[dict]:
    """The fixture's grade replayed: byte for byte its expected_verdicts.json and, but for the run
    directories' place and the speed rule of issue 48, the verdicts the real grade wrote
    (live_verdicts.json)."""
    monkeypatch.chdir(fixture)  # run directories by their names in the fixture: no path of this machine
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    verdicts = replay(fixture, results)
    expected = fixture / "expected_verdicts.json"
    if os.environ.get("DISTLAB_REPLAY_WRITE") == "1":
        expected.write_bytes(verdicts)
    assert verdicts == expected.read_bytes()
    found = json.loads(verdicts)
    assert_the_live_grade_s(found, json.loads((fixture / "live_verdicts.json").read_text()))
    return found


def assert_the_live_grade_s(replayed: list[dict], live: list[dict]) -> None:
    """Every row as the live grade wrote it, speed rows too: the fixtures were captured under the
    speed rule of issue 48 (the extra pairs the live grade ran are in runs.json), and each stored run
    keeps the interference measured around it (run.json's cpu account)."""
    assert [(v["lab"], v["world_size"], v["check"]) for v in replayed] == \
        [(v["lab"], v["world_size"], v["check"]) for v in live]
    for now, then in zip(replayed, live, strict=True):
        assert now == then, (now, then)


def test_replayed_grade_gives_the_stored_verdicts(tmp_path, monkeypatch):
    """The replay stands for the grade, and its verdicts are worth comparing: every kind of verdict
    the cells have, with their measured numbers."""
    verdicts = replayed(FIXTURE, tmp_path, monkeypatch)
    checks = {v["check"] for v in verdicts}
    assert {"run", "time", "img_per_sec_ratio", "efficiency", "observed:shards_disjoint",
            "observed:replicas_identical", "observed:buffers_identical", "observed:checkpoint_loads",
            "observed:optimizer_steps_equal", "final_accuracy", "observed:parameters_trained",
            "observed:replicas_in_step", "observed:clock", "observed:inputs_from_loader"} <= checks
    assert all(v["measured"] for v in verdicts) and len(verdicts) == 55
    # Verified from the stored runs' observations, not n/a: the loader's batches are what the model was given.
    assert all(v["passed"] for v in verdicts if v["check"] == "observed:inputs_from_loader")


def test_a_replayed_grade_of_a_wrong_program_fails_it_for_what_it_did(tmp_path, monkeypatch):
    """A more lenient grader changes these bytes: the rows that fail, the claims contradicted."""
    verdicts = replayed(FIXTURE.parent / "replay-wrong", tmp_path, monkeypatch)
    failed = {v["check"] for v in verdicts if v["passed"] is False}
    assert {"observed:replicas_identical", "observed:replicas_in_step", "claim:params_identical",
            "claim:final_accuracy", "claim:img_per_sec"} <= failed, failed
    passed = {v["check"] for v in verdicts if v["passed"] is True}
    assert {"run", "observed:shards_disjoint", "observed:parameters_trained"} <= passed, passed
