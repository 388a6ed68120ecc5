"""A job's outcome: what its stored runs say of a student's program (`outcome_of`), every verdict
judged again from the stored observations (grading.judge) and scored; what ended a cell's runs early
(`ending_of`, `endings`): the rank, its last exception and where, told apart from a failed run that
went to its checks (`ran_to_its_checks`).
"""

from __future__ import annotations

import contextlib
import re
import statistics
import traceback
from pathlib import Path
from typing import Any

from harness.classgrade import job as jobs
from harness.classgrade import lessons, rubric
from harness.classgrade.account import Ending, Outcome
from harness.classgrade.submissions import Submission
from harness.console import console
from harness.files import read_json
from harness.grading.judge import judge
from harness.grading.stored import runs_from_json
from harness.run.accounting import SAID_CHARS, Frame, failing_rank_exception, rank_logs_in
from harness.verdict.pairing import reference_rates
from harness.verdict.verdicts import NOT_RUN, Sample

JOB_ERROR = "job-error.txt"  # in a job's folder: the job process failed (not the submission)
GRADER_PATH = re.compile(r"/[^\s'\",:()]+")  # an absolute path in the grader's own error, shown to no student
STORED_BYTES = 1 << 30  # a job's observations.json: a smoke class's are under 1 MiB, a full lab's a few MiB


def _logs(run_dirs: list[Path]) -> list[str]:
    return [jobs.read_log(log) for d in run_dirs for log in [d / "launcher.log", *sorted(d.glob("rank.*.log"))]]


RUN_JSON_BYTES = 1 << 20  # the harness's account of a run (run.json): a few KB


def ran_to_its_checks(sample: Sample) -> bool:
    """A failed run that ended as the contract says a failed check ends it: the program's own record
    (not the harness's), status failed, with a check of its own failed. Its runs went to their end, so
    the grader's checks were judged; any other failure (an exception, a hang, a stop) ended it early."""
    record = sample.record or {}
    if ((record.get("provenance") or {}).get("written_by") == "harness" or record.get("status") != "failed"
            or "lab_status" in record):  # lab_status: the launcher's account replaced the program's (accounting)
        return False
    checks = record.get("checks") or {}
    return any(isinstance(c, dict) and c.get("passed") is False for c in checks.values())


def _where(frames: tuple[Frame, ...], program: str) -> str:
    """The last of a traceback's frames in the program's own file (its name only): where it failed."""
    own = [f for f in frames if Path(f.file).name == program] or frames
    return f'File "{Path(own[-1].file).name}", line {own[-1].line}, in {own[-1].function}' if own else ""


def ending_of(lab: str, world_size: int, sample: Sample, run_dir: Path, program: str) -> Ending:
    """What ended a run early: the rank the launcher saw fail (run.json, the harness's own), that rank's
    last exception and where in the program it was raised (its log, the program's words, quoted where shown)."""
    account: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        account = read_json(run_dir / "run.json", RUN_JSON_BYTES)
    failure = account.get("failure") if isinstance(account, dict) else None
    rank = failure.get("rank") if isinstance(failure, dict) and isinstance(failure.get("rank"), int) else None
    found = failing_rank_exception(rank_logs_in(run_dir), rank)
    if found:  # the program's words: bounded and escaped there (found.said), quoted where shown
        return Ending(lab, world_size, found.rank, found.said, _where(found.frames, program)[:SAID_CHARS])
    return Ending(lab, world_size, rank, sample.reason or "no reason given")


def endings(done: dict[tuple[str, int], list[Sample]], job: dict[str, Any], program: str) -> list[Ending]:
    """Each cell whose runs a failure ended early (ran_to_its_checks), with its first such run's ending."""
    found = []
    for (lab, world_size), runs in done.items():
        early = [s for s in runs if s.status != "ok" and s.status != NOT_RUN and not ran_to_its_checks(s)]
        if early:
            found.append(ending_of(lab, world_size, early[0], _rebased(early[0].run_dir, job), program))
    return found


def _rebased(run_dir: str, job: dict[str, Any]) -> Path:
    """A run's folder where the job's folder lies now (the stored path names where it was written)."""
    path, written_in = Path(run_dir), job.get("written_in")
    if written_in and path.is_relative_to(written_in):
        return Path(job["folder"]) / path.relative_to(written_in)
    return path


def outcome_of(student: Submission, job: dict[str, Any] | None, the_rubric: rubric.Rubric,
               sandboxed: bool) -> Outcome:
    """A student's outcome from what its job stored: the verdicts recomputed (grading.judge), scored."""
    if student.problem:
        return Outcome(student.id, "ungradable", f"wrong layout: {student.problem}", sandboxed=sandboxed,
                       key=student.key)
    folder = Path(job["folder"]) if job else None
    if folder is not None and (folder / JOB_ERROR).is_file() and not (folder / jobs.OBSERVATIONS).is_file():
        said = GRADER_PATH.sub("…", (folder / JOB_ERROR).read_text().strip())  # the grader's paths are staff's
        return Outcome(student.id, "error", f"the grader failed: {said}", sandboxed=sandboxed, key=student.key)
    if job is None or folder is None or not (folder / jobs.OBSERVATIONS).is_file():
        return Outcome(student.id, "pending", "not graded yet", sandboxed=sandboxed, key=student.key)
    stored = read_json(folder / jobs.OBSERVATIONS, STORED_BYTES)  # bounded as the program's: it holds what they left
    done, references = runs_from_json(stored["done"]), runs_from_json(stored["references"])
    grade_plan = jobs.plan_for(job, check_runs=False)
    rates = reference_rates(grade_plan.reference, references)  # for the verdicts and the rate ratio below
    verdicts = judge(grade_plan, done, references, rates)
    samples = [s for runs in done.values() for s in runs]
    account = stored.get("sandbox") or {}
    outcome = Outcome(student.id, "graded", "", the_rubric.score(verdicts), verdicts, account,
                      lessons.crash_lessons(_logs([_rebased(s.run_dir, job) for s in samples
                                                       if s.status != "ok"])),
                      sandboxed=account.get("sandboxed", sandboxed), key=student.key,
                      mode=account.get("mode", ""),
                      endings=endings(done, job, Path(str(job.get("program", ""))).name))
    started = [s for s in samples if s.observed or ((s.record or {}).get("provenance") or {}).get("written_by")
               not in ("harness", None)]
    if account.get("forged"):  # staff look at it: a grade resting on forged observations is none
        outcome.status = "ungradable"
        outcome.reason = f"its observations were tampered with: {account['forged'][0]}"
    elif not started:
        why = next((s.reason for s in samples if s.reason), "no run")
        findings = "; ".join(outcome.findings())
        outcome.status = "ungradable"
        outcome.reason = f"it did not run to a record of its own: {why}" + (f" ({findings})" if findings else "")
    outcome.seconds = statistics.fmean(s.wall_seconds for s in samples) if samples else None
    ratios = [rate / ref for (lab, ws), runs in done.items() for s in runs
              if (rate := s.measured.get("img_per_sec")) and (ref := rates.get((lab, ws)))]
    outcome.rate_ratio = statistics.median(ratios) if ratios else None
    return outcome


def judging_failed(student: Submission, error: BaseException, sandboxed: bool) -> Outcome:
    """The row of a submission whose stored runs could not be judged: "error", said in words a student
    reads (the kind of error, never the grader's paths or code); the whole traceback on the console."""
    console.print(f"judging {student.key} failed:\n{''.join(traceback.format_exception(error))}", markup=False)
    return Outcome(student.id, "error", f"the grader could not judge what its runs left "
                   f"({type(error).__name__}); staff can see why in the grade's log and grade it by hand",
                   sandboxed=sandboxed, key=student.key)

