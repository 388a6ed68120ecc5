"""A class graded: every student's program, side by side, into a gradebook (`distlab grade-class`).

Each submission (submissions.py) is graded as `distlab grade --program LAB=PATH` grades one, by a job
process of its own (job.py) in the sandbox (sandbox/), up to N at once (pool.py), or each a task of a
Slurm job array, on its node, graded there the same way (`--slurm`, cluster.py). The class's folder:

    <results>/class/<SUBMISSIONS name>/
        jobs/<id>/            the job: job.json, runs/, observations.json (its completion mark), stdout.log
        settings.json         what its grades are computed with: lab, profile, world sizes, rubric; lessons
        gradebook.csv, class.html, summary.json, feedback/<id>.html|.md, gradescope/<id>/results.json
        slurm/<stamp>-ws<N>-<profile>/   --slurm: an array's jobs file, script, each task's output and state

A class grade that is stopped resumes where it stopped (a job with observations.json for the same
submission files, lab, profile and world sizes is not run again); `rerun` grades some again; `regrade`
recomputes every verdict and score from the stored observations (after a rubric or profile change)
and trains nothing. A setting the command does not give is the class's stored one (settings.json),
so a resume or a regrade keeps the profile the class was graded with on any host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import signal
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.catalog import find_lab
from harness.classgrade import cluster, lessons, outputs, rubric
from harness.classgrade import job as jobs
from harness.classgrade.pool import Ended, Pool, default_jobs, gpus_of, job_deadline_s
from harness.classgrade.progress import class_progress
from harness.classgrade.sandbox import enter, private
from harness.classgrade.sandbox.uid import closed_folder
from harness.classgrade.submissions import Submission, find_submissions
from harness.console import console, print_json
from harness.files import read_json, write_json
from harness.grading.judge import judge
from harness.grading.plan import GradePlan
from harness.run.accounting import last_exception
from harness.run.run_dir import claim_results_root
from harness.run.slurm_array import check_submit_host
from harness.usage import UsageError
from harness.verdict import profiles
from harness.verdict.pairing import reference_rates
from harness.verdict.verdicts import NOT_RUN, Sample
from labs.common.host import fingerprint

EVENT_WAIT_S = 0.2  # the longest the pool waits for a job's event: its deadlines are looked at as often
JOB_ERROR = "job-error.txt"  # in a job's folder: the job process failed (not the submission)
GRADER_PATH = re.compile(r"/[^\s'\",:()]+")  # an absolute path in the grader's own error, shown to no student
STORED_BYTES = 1 << 30  # a job's observations.json: a smoke class's are under 1 MiB, a full lab's a few MiB
SETTINGS = "settings.json"  # in the class's folder: ClassSettings, as its grades were last computed
DEFAULT_LAB = "ddp"  # the lab a class is graded as when neither the command nor the class names one


@dataclass(frozen=True)
class ClassRequest:
    """What to grade: the class's folder, as which lab, against what, how many at once, where to."""

    submissions: Path
    lab: str | None = None  # None: the class's stored lab, else ddp
    profile: str | None = None  # a name or a .toml; None: the class's stored one, else the one that fits this host
    rubric: Path | None = None  # None: the class's stored one, else harness/classgrade/rubrics/LAB.toml
    jobs: int | None = None  # None: as many as the host holds
    world_sizes: list[int] | None = None  # None: the class's stored ones, else the profile's
    results: Path = Path("results")
    rerun: tuple[str, ...] = ()
    regrade: bool = False
    sandbox: str = "bwrap"  # "bwrap" (namespaces), "uid" (a uid of its own, without them), "none"
    lessons: str | None = None  # where feedback links the lessons (lessons.lessons_argument); None: the class's
    keep: bool = False  # keep the weights and checkpoints the runs wrote (job.py removes them once judged)
    slurm: bool = False  # each job a task of a Slurm job array (cluster.py)
    sbatch_args: list[str] = dataclasses.field(default_factory=list)  # --slurm: the array's own sbatch options
    dry_run: bool = False  # the class opened to be planned (class_plan.py): nothing written, not even the results root

    @property
    def sandboxed(self) -> bool:
        return self.sandbox != "none"

    @property
    def class_dir(self) -> Path:
        return self.results.resolve() / "class" / self.submissions.resolve().name


@dataclass(frozen=True)
class ClassSettings:
    """What decides a class's verdicts and scores, stored with the class (settings.json) whenever it is
    graded or regraded: a resume or a regrade that gives none of them keeps these, on any host."""

    lab: str
    profile: str  # the profile's name
    profile_file: str | None  # a profile given as a .toml of its own: its absolute path (it is resolved by it)
    world_sizes: list[int] | None  # None: the profile's
    rubric: str | None  # a rubric given as a .toml: its absolute path; None: the lab's shipped one
    lessons: str | None = None  # --lessons as given (an address, or "local"); None: the course repository's

    @property
    def profile_argument(self) -> str:
        return self.profile_file or self.profile

    def described(self) -> str:
        sizes = ",".join(map(str, self.world_sizes)) if self.world_sizes else "the profile's"
        return (f"lab {self.lab}, profile {self.profile}{f' ({self.profile_file})' if self.profile_file else ''}, "
                f"world sizes {sizes}, rubric {self.rubric or 'the shipped one'}, "
                f"lessons {self.lessons or 'at the course repository'}")


def stored_settings(class_dir: Path) -> ClassSettings | None:
    """The settings the class was last graded with: its settings.json; for a class graded before they
    were stored, what its jobs agree on (job.json names the lab, the profile's file, the world sizes)."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        return ClassSettings(**json.loads((class_dir / SETTINGS).read_text()))
    kept = set()
    for path in class_dir.glob("jobs/*/job.json"):
        if ".before-" not in path.parent.name:  # an earlier grade set aside
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                job = json.loads(path.read_text())
                kept.add((job["lab"], job["profile"], tuple(job["world_sizes"] or ()) or None))
    if len(kept) != 1:
        return None
    lab, profile_file, sizes = kept.pop()
    with contextlib.suppress(profiles.ProfileError, OSError, ValueError):
        name = profiles.load_profile(Path(profile_file)).name
        return ClassSettings(lab, name, _own_file(name, Path(profile_file)), list(sizes) if sizes else None, None)
    return None


def _own_file(name: str, path: Path) -> str | None:
    """A profile's file where it is none of the shipped ones (those are found by name on any checkout)."""
    return None if path.resolve() == (profiles.PROFILE_DIR / f"{name}.toml").resolve() else str(path.resolve())


# ------------------------------------------------------------------------------------ outcomes

def _logs(run_dirs: list[Path]) -> list[str]:
    return [jobs.read_log(log) for d in run_dirs for log in [d / "launcher.log", *sorted(d.glob("rank.*.log"))]]


RUN_JSON_BYTES = 1 << 20  # the harness's account of a run (run.json): a few KB
SAID_CHARS = 300  # of a rank's last exception, as the run's reason keeps it (run/accounting.exception_said)
# A traceback's frame: where in which file. The last one in the program's own file says where it failed.
FRAME = re.compile(r'^(?:\[rank\d+\]:)?\s*File "([^"]+)", line (\d+), in (.+)$')  # torch prefixes "[rank1]:"


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


def _where(log: str, program: str) -> str:
    """The last frame of the log's last traceback in the program's own file (its name only)."""
    frames = [found for line in log.splitlines() if (found := FRAME.match(line))]
    own = [f for f in frames if Path(f.group(1)).name == program] or frames
    return f'File "{Path(own[-1].group(1)).name}", line {own[-1].group(2)}, in {own[-1].group(3)}' if own else ""


def ending_of(lab: str, world_size: int, sample: Sample, run_dir: Path, program: str) -> outputs.Ending:
    """What ended a run early: the rank the launcher saw fail (run.json, the harness's own), that rank's
    last exception and where in the program it was raised (its log, the program's words, quoted where shown)."""
    account: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        account = read_json(run_dir / "run.json", RUN_JSON_BYTES)
    failure = account.get("failure") if isinstance(account, dict) else None
    rank = failure.get("rank") if isinstance(failure, dict) and isinstance(failure.get("rank"), int) else None
    ranks = ([rank] if rank is not None else []) + sorted(
        int(path.name.split(".")[1]) for path in run_dir.glob("rank.*.log") if path.name.split(".")[1].isdigit())
    for each in dict.fromkeys(ranks):
        log = jobs.read_log(run_dir / f"rank.{each}.log")
        said = last_exception(log)
        if said:  # the program's words: bounded here, quoted or escaped where shown
            return outputs.Ending(lab, world_size, each, said[:SAID_CHARS], _where(log, program)[:SAID_CHARS])
    return outputs.Ending(lab, world_size, rank, sample.reason or "no reason given")


def endings(done: dict[tuple[str, int], list[Sample]], job: dict[str, Any], program: str) -> list[outputs.Ending]:
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
               sandboxed: bool) -> outputs.Outcome:
    """A student's outcome from what its job stored: the verdicts recomputed (grading.judge), scored."""
    if student.problem:
        return outputs.Outcome(student.id, "ungradable", f"wrong layout: {student.problem}", sandboxed=sandboxed,
                               key=student.key)
    folder = Path(job["folder"]) if job else None
    if folder is not None and (folder / JOB_ERROR).is_file() and not (folder / jobs.OBSERVATIONS).is_file():
        said = GRADER_PATH.sub("…", (folder / JOB_ERROR).read_text().strip())  # the grader's paths are staff's
        return outputs.Outcome(student.id, "error", f"the grader failed: {said}", sandboxed=sandboxed, key=student.key)
    if job is None or folder is None or not (folder / jobs.OBSERVATIONS).is_file():
        return outputs.Outcome(student.id, "pending", "not graded yet", sandboxed=sandboxed, key=student.key)
    stored = read_json(folder / jobs.OBSERVATIONS, STORED_BYTES)  # bounded as the program's: it holds what they left
    done, references = jobs.samples_from_json(stored["done"]), jobs.samples_from_json(stored["references"])
    grade_plan = jobs.plan_for(job, check_runs=False)
    verdicts = judge(grade_plan, done, references)
    samples = [s for runs in done.values() for s in runs]
    account = stored.get("sandbox") or {}
    outcome = outputs.Outcome(student.id, "graded", "", the_rubric.score(verdicts), verdicts, account,
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
    rates = reference_rates(grade_plan.reference, references)
    ratios = [rate / ref for (lab, ws), runs in done.items() for s in runs
              if (rate := s.measured.get("img_per_sec")) and (ref := rates.get((lab, ws)))]
    outcome.rate_ratio = statistics.median(ratios) if ratios else None
    return outcome


def judging_failed(student: Submission, error: BaseException, sandboxed: bool) -> outputs.Outcome:
    """The row of a submission whose stored runs could not be judged: "error", said in words a student
    reads (the kind of error, never the grader's paths or code); the whole traceback on the console."""
    console.print(f"judging {student.key} failed:\n{''.join(traceback.format_exception(error))}", markup=False)
    return outputs.Outcome(student.id, "error", f"the grader could not judge what its runs left "
                           f"({type(error).__name__}); staff can see why in the grade's log and grade it by hand",
                           sandboxed=sandboxed, key=student.key)


# ------------------------------------------------------------------------------------ the class

@dataclass
class Classroom:
    """A class being graded: its request checked, its students found, each one's stored job."""

    request: ClassRequest
    rubric: rubric.Rubric
    students: list[Submission]
    stored: dict[str, dict[str, Any] | None]
    probe_plan: GradePlan | None  # a gradable student's plan: the profile and the lab checked once
    size: int  # jobs at once
    settings: ClassSettings | None = None  # what it is graded with (None: no gradable student to grade)
    before: ClassSettings | None = None  # what it was graded with before (its settings.json)
    outcomes: dict[str, outputs.Outcome] = dataclasses.field(default_factory=dict)  # judged once a job ends
    lesson_root: str = ""  # what every lesson link of its feedback starts with (lessons.lesson_root)

    @property
    def class_dir(self) -> Path:
        return self.request.class_dir

    def graded_with(self) -> dict[str, Any]:
        """The class's settings as a job.json names them: a stored job whose own differ is stale on a
        resume, and judged with these on a regrade (a deliberate regrade under another profile)."""
        assert self.settings is not None  # set in open_class whenever a student is gradable
        return {"lab": self.settings.lab, "world_sizes": self.settings.world_sizes,
                "profile": str(self.probe_plan.profile.path) if self.probe_plan else self.settings.profile_argument}

    def job_for(self, student: Submission, slot: int = 0, gpus: list[int] | None = None) -> dict[str, Any]:
        request, class_dir = self.request, self.class_dir
        assert student.program is not None  # a gradable student's: the only ones given a job
        hidden = {str(request.submissions.resolve()), str(class_dir), str(request.results.resolve())}
        return {"id": student.key, "class_id": hashlib.sha256(str(class_dir).encode()).hexdigest()[:12],
                "submission": str(student.folder.resolve()) if student.path.is_dir() else str(student.path.resolve()),
                "program": str(student.program.resolve()), **self.graded_with(),
                "limits": dataclasses.asdict(self.rubric.limits),
                "folder": str(class_dir / "jobs" / student.key), "sandboxed": request.sandboxed,
                "sandbox_mode": request.sandbox, "slot": slot,
                "gpus": gpus, "hidden": sorted(hidden), "digest": student.digest(), "keep": request.keep,
                "deadline_s": job_deadline_s(self.probe_plan) if self.probe_plan else None}

    def to_grade(self) -> list[Submission]:
        """The gradable students whose stored grade is missing, stale (other files, another lab, profile,
        world sizes or sandbox) or asked for again (none on regrade)."""
        if self.request.regrade:
            return []
        todo = []
        for student in (s for s in self.students if not s.problem):
            job = self.stored[student.key]
            complete = job is not None and (Path(job["folder"]) / jobs.OBSERVATIONS).is_file()
            if job is None or student.key in self.request.rerun or not complete \
                    or job.get("digest") != student.digest() \
                    or any(job.get(key) != value for key, value in self.graded_with().items()) \
                    or job.get("sandbox_mode", "bwrap" if job.get("sandboxed") else "none") != self.request.sandbox:
                todo.append(student)
        return todo

    def outcome(self, student: Submission) -> outputs.Outcome:
        """The student's outcome, judged from its stored job once (when it ends, or at the end). Judged
        in isolation: whatever its runs left that the judging cannot take makes this row "error" (a
        reason the student can read, no path of the grader's), never the class's end."""
        if student.key not in self.outcomes:
            try:
                job = self.stored[student.key]
                judged = {**job, **self.graded_with()} if job and self.settings else job
                self.outcomes[student.key] = outcome_of(student, judged, self.rubric, self.request.sandboxed)
            except Exception as error:  # noqa: BLE001 - any error of one submission's judging is that row's
                self.outcomes[student.key] = judging_failed(student, error, self.request.sandboxed)
        return self.outcomes[student.key]


def open_class(request: ClassRequest) -> Classroom:
    """The class the request names, every refusal (one line each) before anything is written."""
    check_submit_host(request.slurm, request.sbatch_args)
    if not request.submissions.is_dir():
        raise UsageError(f"submissions folder {request.submissions} does not exist "
                         "(one folder or .py file per student)")
    class_dir = request.class_dir
    before = stored_settings(class_dir)  # what the class was graded with: kept where the command gives none
    lab = request.lab or (before.lab if before else DEFAULT_LAB)
    find_lab(lab)
    rubric_file = str(request.rubric.resolve()) if request.rubric else (before.rubric if before else None)
    rubric_path = Path(rubric_file) if rubric_file else rubric.DEFAULT.with_name(f"{lab}.toml")
    if not request.rubric and not rubric_path.is_file():
        raise UsageError(f"the class's rubric {rubric_file} ({class_dir / SETTINGS}) is gone; give one with --rubric"
                         if rubric_file else
                         f"no rubric ships for lab {lab}; give one with --rubric (format: {rubric.DEFAULT})")
    the_rubric = rubric.load(rubric_path)
    if request.sandboxed and not request.regrade:
        refusal = enter.refusal(request.sandbox)
        if refusal:
            raise UsageError(refusal)
    if request.sandbox == "uid" and not request.regrade:
        closed = closed_folder(request.results.resolve().parent)
        if closed is not None:  # the job's uid reaches its run folders through every folder above them
            raise UsageError(f"--sandbox uid: the results folder lies below {closed}, which other users may not "
                             f"pass through (chmod o+x {closed}), or give --results a folder outside it")
    if class_dir.is_relative_to(request.submissions.resolve()):
        # the next run would find the grades as a student's folder (and hide them from the sandbox)
        raise UsageError(f"--results {request.results} puts the grades inside the submissions folder "
                         f"{request.submissions}; give --results a folder outside it")
    students = find_submissions(request.submissions)
    if not students:
        raise UsageError(f"{request.submissions} holds no submissions (one folder or .py file per student)")
    unknown = sorted(set(request.rerun) - {s.key for s in students})
    if unknown:
        raise UsageError(f"--rerun {', '.join(unknown)}: no such submission in {request.submissions}")
    lessons_given = request.lessons or (before.lessons if before else None)
    room = Classroom(request, the_rubric, students, {s.key: _stored_job(class_dir, s) for s in students}, None, 1,
                     before=before, lesson_root=lessons.lesson_root(lessons_given) or "")
    gradable = [s for s in students if not s.problem]
    if gradable:
        profile_argument = _profile_argument(request.profile) or (before.profile_argument if before else None)
        try:  # the profile and the lab checked once, before any job starts
            profile = profiles.resolve(profile_argument, {} if profile_argument else fingerprint())
            room.settings = ClassSettings(lab, profile.name, _own_file(profile.name, profile.path),
                                          request.world_sizes or (before.world_sizes if before else None), rubric_file,
                                          lessons_given)
            room.probe_plan = jobs.plan_for(room.job_for(gradable[0]), check_runs=not request.regrade)
        except profiles.ProfileError as error:
            raise UsageError(str(error)) from None
        # On Slurm, the cluster places the tasks: this host's cores say nothing of its nodes.
        room.size = request.jobs or (len(gradable) if request.slurm
                                     else default_jobs(room.probe_plan, fingerprint()["gpus"] or 0))
    if not room.lesson_root:  # no file:// links for students unless asked for by name (--lessons local)
        raise UsageError(lessons.NO_ADDRESS)
    if not request.dry_run:
        claim_results_root(request.results)  # the last refusal: made only once everything else was accepted
    return room


def _profile_argument(profile: str | None) -> str | None:
    """A profile file by its absolute path (jobs run in the repository), a profile name as it is."""
    return str(Path(profile).resolve()) if profile and Path(profile).is_file() else profile


def _stored_job(class_dir: Path, student: Submission) -> dict[str, Any] | None:
    path = class_dir / "jobs" / student.key / "job.json"
    with contextlib.suppress(OSError, ValueError):
        job = json.loads(path.read_text())
        # Where it lies now: a results folder moved or copied still regrades (its runs rebased in outcome_of).
        job["written_in"], job["folder"] = job.get("folder"), str(path.parent)
        return job
    return None


def _set_aside(folder: Path) -> None:
    """An earlier grade of a job, kept beside it (never deleted): `<id>.before-<n>`."""
    if not folder.exists():
        return
    for n in range(1, 10000):
        target = folder.with_name(f"{folder.name}.before-{n}")
        if not target.exists():
            folder.rename(target)
            return


def new_job(room: Classroom, student: Submission, slot: int, gpus: list[int] | None) -> dict[str, Any]:
    """The student's job, written to a folder of its own (an earlier grade set aside) and stored as the class's."""
    job = room.job_for(student, slot, gpus)
    folder = Path(job["folder"])
    _set_aside(folder)
    folder.mkdir(parents=True)
    write_json(folder / "job.json", job)
    room.stored[student.key] = job
    room.outcomes.pop(student.key, None)
    return job


def finish_job(room: Classroom, ended: Ended, lesson_root: str,
               counted: Callable[[str], str] | None = None) -> None:
    """A job that ended, here or on a node: the grader's own failure marked (said, never scored), the
    student's outcome judged and its pages written; `counted`: the class's progress told (its count
    and estimate, said on the same line)."""
    key, code = ended.student, ended.code
    folder = Path((room.stored[key] or {})["folder"])  # stored when the job was started
    if ended.reason:  # the grader's own work went wrong (a deadline, its memory, its Slurm task)
        (folder / JOB_ERROR).write_text(f"{ended.reason}\n")
    elif code and not (folder / jobs.OBSERVATIONS).is_file():  # the harness's failure, not the student's
        lines = jobs.read_log(folder / "stdout.log").strip().splitlines() or ["no output"]
        (folder / JOB_ERROR).write_text(f"job exit code {code}: {lines[-1][:500]}\n")
    outcome = write_pages(room, next(s for s in room.students if s.key == key), lesson_root)
    points = (f", {outputs.points(outcome.score)} of {outputs.points(room.rubric.max_score)}"
              if outcome.score is not None else "")
    console.print(f"finished {key}: {outcome.status}{points}"
                  f"{f' (job exit code {code})' if code else ''}{f'; {counted(key)}' if counted else ''}",
                  markup=False)


def write_pages(room: Classroom, student: Submission, lesson_root: str) -> outputs.Outcome:
    """The student's feedback pages; where they cannot be made of what its runs left, its row is
    "error" (judging_failed) and the pages say that."""
    outcome = room.outcome(student)
    try:
        outputs.write_student(room.class_dir, outcome, room.rubric, lesson_root)
    except Exception as error:  # noqa: BLE001 - one submission's pages, never the class's end
        outcome = room.outcomes[student.key] = judging_failed(student, error, room.request.sandboxed)
        outputs.write_student(room.class_dir, outcome, room.rubric, lesson_root)
    return outcome


def run_jobs(room: Classroom, todo: list[Submission], lesson_root: str) -> None:
    """Every submission of `todo` graded by the pool, each one's pages written as it finishes, its runs
    shown as its job tells them (progress.py). KeyboardInterrupt (Ctrl-C, or SIGTERM raised as it)
    stops the pool's jobs first."""
    if not todo:
        return
    grade_plan = room.probe_plan
    assert grade_plan is not None  # there is one: `todo` holds gradable students only
    pool = Pool(room.size, room.request.sandboxed, follow=True)
    queue = list(todo)
    runs = grade_plan.planned_runs()
    with class_progress(len(todo), runs, room.size, grade_plan.budget_s()) as progress:
        try:
            while queue or pool.running:
                slot = pool.free_slot()
                while queue and slot is not None:
                    student = queue.pop(0)
                    job = new_job(room, student, slot, gpus_of(slot, grade_plan))
                    cluster.start_job(pool, slot, job)
                    console.print(f"started {student.key} ({progress.started(student.key)}, slot {slot}): {runs} "
                                  f"run(s) planned", markup=False)
                    slot = pool.free_slot()
                progress.show(pool.events(EVENT_WAIT_S))  # woken at once by a job's event or its end
                ended = pool.finished()
                if ended:  # their last runs' events before their end
                    progress.show(pool.events(0))
                for one in ended:
                    finish_job(room, one, lesson_root, progress.ended)
        except KeyboardInterrupt:
            pool.stop()
            raise


def run_jobs_on_slurm(room: Classroom, todo: list[Submission], lesson_root: str) -> None:
    """Every submission of `todo` a task of one Slurm job array (cluster.py), graded on its node as the
    pool grades it here; each one's pages written once the array has ended. A task that brought nothing
    back leaves its job un-done: the same command grades it (and only it) again. KeyboardInterrupt
    cancels the array first."""
    if not todo:
        return
    grade_plan = room.probe_plan
    assert grade_plan is not None  # there is one: `todo` holds gradable students only
    written = [new_job(room, student, 0, gpus_of(0, grade_plan)) for student in todo]
    console.print(f"submitting {len(written)} job(s) as a Slurm job array", markup=False)
    for ended in cluster.run_array(room.class_dir, [Path(job["folder"]) / "job.json" for job in written], grade_plan,
                                   room.size, room.request.sbatch_args):
        finish_job(room, ended, lesson_root)


def summary_of(room: Classroom, outcomes: list[outputs.Outcome], wall_seconds: float, interrupted: bool
               ) -> dict[str, Any]:
    graded = [o for o in outcomes if o.status == "graded"]
    settings = room.settings
    return {"lab": settings.lab if settings else room.request.lab or DEFAULT_LAB,
            "profile": settings.profile if settings else str(room.request.profile),
            "profile_file": settings.profile_file if settings else None,
            "world_sizes": settings.world_sizes if settings else room.request.world_sizes,
            "rubric": str(room.rubric.path), "jobs": room.size, "sandboxed": room.request.sandboxed,
            "sandbox": room.request.sandbox,
            "submissions": len(outcomes), "graded": len(graded),
            "ungradable": sum(o.status == "ungradable" for o in outcomes),
            "pending": [o.key for o in outcomes if o.status == "pending"],
            "mean": f"{statistics.fmean(o.score for o in graded if o.score is not None):.2f}" if graded else "-",
            "wall_seconds": wall_seconds, "regraded": room.request.regrade, "interrupted": interrupted,
            # Points rounded as every other output shows them (outputs.rounded), so no two disagree.
            "students": {o.key: {"id": o.id, "status": o.status,
                                "score": None if o.score is None else outputs.rounded(o.score),
                                "reason": o.reason or (outputs.why(o, room.rubric) if o.status == "graded" else ""),
                                "sandbox": o.findings(), "seconds": o.seconds, "rate_ratio": o.rate_ratio,
                                "items": {s.item.name: outputs.rounded(s.score) for s in o.scores}} for o in outcomes}}


def grade_class(request: ClassRequest, as_json: bool = False) -> int:
    """The class graded (or regraded, or resumed), then its gradebook, class page and summary written
    (`as_json`: the summary on stdout too, with where they are). A stop (Ctrl-C, SIGTERM) ends the
    jobs, writes what finished, and is raised again."""
    room = open_class(request)
    if request.sandbox == "uid" and not request.regrade:
        make_private(room)
    todo = room.to_grade()
    lesson_root = room.lesson_root
    mode = {"bwrap": "", "uid": " in the uid sandbox (no namespaces)", "none": " WITHOUT the sandbox"}[request.sandbox]
    where = " as Slurm array tasks" if request.slurm else ""
    console.print(f"distlab grade-class: {len(room.students)} submission(s), {len(todo)} to grade, {room.size} at "
                  f"once{where}{mode}; {room.class_dir}", markup=False)
    if room.settings is not None:  # stored before any job starts: a stopped grade resumes with them
        console.print(settings_line(room), markup=False)
        room.class_dir.mkdir(parents=True, exist_ok=True)
        write_json(room.class_dir / SETTINGS, dataclasses.asdict(room.settings))
    started, interrupted = time.monotonic(), None
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        (run_jobs_on_slurm if request.slurm else run_jobs)(room, todo, lesson_root)
    except (KeyboardInterrupt, Exception) as stop:  # the grader's own failure too: what finished is written first
        interrupted = stop
    finally:
        signal.signal(signal.SIGTERM, previous)
    outcomes = [write_pages(room, s, lesson_root) if room.outcome(s).status != "pending" else room.outcome(s)
                for s in room.students]
    summary = summary_of(room, outcomes, time.monotonic() - started, interrupted is not None)
    room.class_dir.mkdir(parents=True, exist_ok=True)
    outputs.gradebook_csv(room.class_dir / "gradebook.csv", room.rubric, outcomes)
    page = outputs.class_page(room.class_dir, room.rubric, outcomes, summary)
    write_json(room.class_dir / "summary.json", summary)
    console.print(f"gradebook: {room.class_dir / 'gradebook.csv'}  class page: {page}", markup=False)
    if as_json:  # the people's lines went to stderr (cli.py): stdout is this document alone
        print_json({**summary, "max_score": room.rubric.max_score, "gradebook": str(room.class_dir / "gradebook.csv"),
                    "class_page": str(page), "summary": str(room.class_dir / "summary.json")})
    if interrupted is not None:
        raise interrupted
    return 0


def settings_line(room: Classroom) -> str:
    """What the class is graded with, in one line: kept from its last grade, or what replaced those."""
    now, before, where = room.settings, room.before, room.class_dir / SETTINGS
    assert now is not None
    if before is None:
        return f"settings ({where}): {now.described()}"
    if before == now:
        return f"settings kept from the class's last grade ({where}): {now.described()}"
    judged = ("lab", "profile", "profile_file", "world_sizes")  # what its runs were made under (Classroom.to_grade)
    stale = not room.request.regrade and any(getattr(before, key) != getattr(now, key) for key in judged)
    return (f"settings ({where}): {now.described()}; the class's last grade had {before.described()}"
            f"{': its grades under those are stale and graded again' if stale else ''}")


def make_private(room: Classroom) -> None:
    """uid mode (no namespaces hide the grader's files): what the grader writes from now on is its own
    (umask 077), the submissions folder and the class's folder are closed to others (chmod o-rwx, each
    job reads a copy of its own submission, job.py), and the class's folders on the way to a job's
    runs are passable (o+x: entered by a path one knows, never listed)."""
    os.umask(0o077)
    request = room.request
    for top in (request.submissions.resolve(), room.class_dir):
        private.close_to_others(top)  # by descriptors: a folder past PATH_MAX left in a run is no stop
    results = request.results.resolve()
    for folder in (results, results / "class", room.class_dir, room.class_dir / "jobs"):
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, (os.stat(folder).st_mode & ~0o007) | 0o001)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")
