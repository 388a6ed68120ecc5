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

It is opened here (`open_class`: the request checked, the settings, each student's stored job),
graded by grading_loop.py, and each job's outcome read by outcome.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.catalog import find_lab
from harness.classgrade import job as jobs
from harness.classgrade import lessons, rubric
from harness.classgrade.account import Outcome
from harness.classgrade.outcome import judging_failed, outcome_of
from harness.classgrade.pool import default_jobs, job_deadline_s
from harness.classgrade.sandbox import enter
from harness.classgrade.sandbox.uid import closed_folder
from harness.classgrade.submissions import Submission, find_submissions
from harness.grading.plan import GradePlan
from harness.run.run_dir import claim_results_root
from harness.run.slurm_array import check_submit_host
from harness.usage import UsageError
from harness.verdict import profiles
from labs.common.host import fingerprint

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
    outcomes: dict[str, Outcome] = dataclasses.field(default_factory=dict)  # judged once a job ends
    written: set[str] = dataclasses.field(default_factory=set)  # whose pages this grade wrote (write_pages): once each
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

    def outcome(self, student: Submission) -> Outcome:
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


