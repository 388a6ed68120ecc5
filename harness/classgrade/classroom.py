"""`distlab grade-class SUBMISSIONS/ --lab ddp`: every student's program graded, side by side, into a gradebook.

SUBMISSIONS holds one folder per student (its name is the student's id; the program is its
train.py, or its only .py file) or one .py file per student (the file's name, less .py, is the id).
Each is graded as `distlab grade --program LAB=PATH` grades one (job.py), in the sandbox
(sandbox.py), by a pool of jobs sized to the host. The class's folder:

    <results>/class/<SUBMISSIONS name>/
        jobs/<id>/            the job: job.json, runs/, observations.json (its completion mark), stdout.log
        gradebook.csv, class.html, summary.json, feedback/<id>.html|.md, gradescope/<id>/results.json

A class grade that is stopped resumes where it stopped (a job with observations.json for the same
submission files is not run again); `--rerun ID` grades one again; `--regrade` recomputes every
verdict and score from the stored observations (after a rubric or profile change) and trains nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.catalog import REPO, find_lab
from harness.classgrade import job as jobs
from harness.classgrade import lessons, outputs, rubric, sandbox
from harness.commands import doctor, grade
from harness.console import console
from harness.files import write_json
from harness.usage import UsageError, positive_int, world_size_list
from harness.verdict import profiles
from labs.common.host import usable_cores

STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+@-]{0,63}")
MAX_PROGRAM_BYTES = 1 << 20
JOB_ERROR = "job-error.txt"  # in a job's folder: the job process failed (not the submission)
STOP_GRACE_S = 60.0  # a job told to stop (SIGTERM) ends its run and its processes within this


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("submissions", type=Path, help="folder with one folder (or .py file) per student")
    parser.add_argument("--lab", default="ddp", help="the lab every submission is graded as (default ddp)")
    parser.add_argument("--profile", help="profile name or .toml (default: the one that fits this host)")
    parser.add_argument("--rubric", type=Path, help="rubric .toml (default: harness/classgrade/rubrics/LAB.toml)")
    parser.add_argument("--jobs", type=positive_int, help="submissions graded at once (default: cores / ranks per "
                                                          "job on CPUs, GPUs / GPUs per job on GPU hosts)")
    parser.add_argument("--world-sizes", type=world_size_list, help="e.g. 2 (default: the profile's)")
    parser.add_argument("--results", type=Path, default=Path("results"), help="results root (default ./results)")
    parser.add_argument("--rerun", action="append", metavar="ID", default=[], help="grade this student again")
    parser.add_argument("--regrade", action="store_true",
                        help="recompute verdicts and scores from the stored observations; run nothing")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run submissions with the grader's rights (every page says so)")
    parser.add_argument("--lessons", help="where feedback links the lesson pages (default: this checkout)")
    parser.add_argument("--autograder", type=Path, metavar="ZIP",
                        help="write a Gradescope autograder bundle (setup.sh, run_autograder) and exit")


# --------------------------------------------------------------------------------- submissions

@dataclasses.dataclass
class Submission:
    id: str
    path: Path  # the folder, or the file
    program: Path | None
    problem: str = ""  # why it is ungradable before anything runs

    @property
    def folder(self) -> Path:
        return self.path if self.path.is_dir() else self.path.parent

    def digest(self) -> str:
        """The submission's content: a resubmitted program is graded again on resume."""
        sha = hashlib.sha256()
        paths = sorted(p for p in self.path.rglob("*") if p.is_file()) if self.path.is_dir() else [self.path]
        for path in paths:
            sha.update(str(path.relative_to(self.folder)).encode() + b"\0")
            with contextlib.suppress(OSError):
                sha.update(path.read_bytes()[:MAX_PROGRAM_BYTES * 16])
        return sha.hexdigest()


def find_submissions(root: Path) -> list[Submission]:
    found = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        name = entry.stem if entry.is_file() and entry.suffix == ".py" else entry.name
        sub = Submission(name, entry, None)
        if entry.is_symlink():
            sub.problem = "it is a link; a submission is a folder or a .py file"
        elif not STUDENT_ID.fullmatch(name):
            sub.problem = "its name is not a plain student id (letters, digits, . _ + @ -)"
        elif entry.is_file():
            sub.problem = "" if entry.suffix == ".py" else f"{entry.name} is not a .py program"
            sub.program = entry if entry.suffix == ".py" else None
        elif entry.is_dir():
            programs = sorted(p for p in entry.glob("*.py") if p.is_file() and not p.is_symlink())
            main = [p for p in programs if p.name == "train.py"]
            if main or len(programs) == 1:
                sub.program = (main or programs)[0]
            else:
                sub.problem = ("no .py program in its folder" if not programs else
                               f"{len(programs)} .py files and none is train.py (the program graded)")
        else:
            sub.problem = "neither a folder nor a file"
        if sub.program is not None and sub.program.stat().st_size > MAX_PROGRAM_BYTES:
            sub.problem, sub.program = f"{sub.program.name} is larger than {MAX_PROGRAM_BYTES} bytes", None
        found.append(sub)
    return found


# ------------------------------------------------------------------------------------- the pool

def default_jobs(grade_plan: grade.GradePlan, gpus: int) -> int:
    ranks = max(ws for _, ws in grade_plan.cells())
    if grade_plan.profile.on_gpus:
        return max(1, gpus // ranks)
    return max(1, usable_cores().count // (ranks * grade_plan.profile.threads_per_rank))


def gpus_of(slot: int, grade_plan: grade.GradePlan) -> list[int] | None:
    if not grade_plan.profile.on_gpus:
        return None
    ranks = max(ws for _, ws in grade_plan.cells())
    return list(range(slot * ranks, (slot + 1) * ranks))


def _sandbox_refusal() -> str | None:
    problem = sandbox.available()
    if problem:
        return problem
    if os.geteuid() != 0:
        return ("the sandbox gives each job a uid and a cgroup of its own, which needs root; run grade-class as "
                "root (a course's grading host or container), or pass --no-sandbox")
    probe = subprocess.run([sandbox.bwrap_path(), "--unshare-net", "--unshare-pid", "--ro-bind", "/", "/", "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return (f"bubblewrap cannot make namespaces here ({probe.stderr.strip()[:200]}); allow them (a privileged "
                "container) or pass --no-sandbox")
    return None


class Pool:
    """Up to `size` jobs at once, each a process; a slot (its GPUs) per running job; each job claims its own uid."""

    def __init__(self, size: int, sandboxed: bool) -> None:
        self.size, self.sandboxed = size, sandboxed
        self.running: dict[int, tuple[subprocess.Popen[bytes], str]] = {}  # slot -> (process, id)
        self.folders: dict[int, Path] = {}  # slot -> the running job's folder

    def free_slot(self) -> int | None:
        return next((slot for slot in range(self.size) if slot not in self.running), None)

    def start(self, slot: int, student: str, job_path: Path, env: dict[str, str]) -> None:
        with (job_path.parent / "stdout.log").open("wb") as log:
            process = subprocess.Popen([sys.executable, "-m", "harness.classgrade.job", str(job_path)],
                                       stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
                                       env=env, start_new_session=True)
        self.running[slot] = (process, student)
        self.folders[slot] = job_path.parent

    def finished(self) -> list[tuple[str, int]]:
        ended = []
        for slot, (process, student) in list(self.running.items()):
            if process.poll() is not None:
                ended.append((student, process.returncode))
                del self.running[slot]
        return ended

    def stop(self) -> None:
        """SIGTERM to every job's session (its run is stopped and accounted); SIGKILL after the grace."""
        for process, _ in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for process, _ in self.running.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        # A job killed before its own sweep leaves its sandbox's processes to ours.
        for slot in self.running if self.sandboxed else ():
            with contextlib.suppress(OSError, ValueError, KeyError):
                spec = json.loads((self.folders[slot] / "sandbox.json").read_text())
                sandbox.end_processes_if_unclaimed(spec["uid"])
        self.running.clear()


# ------------------------------------------------------------------------------------ outcomes

def _logs(run_dirs: list[Path]) -> list[str]:
    return [jobs._read(log) for d in run_dirs for log in [d / "launcher.log", *sorted(d.glob("rank.*.log"))]]


def _rebased(run_dir: str, job: dict[str, Any]) -> Path:
    """A run's folder where the job's folder lies now (the stored path names where it was written)."""
    path, written_in = Path(run_dir), job.get("written_in")
    if written_in and path.is_relative_to(written_in):
        return Path(job["folder"]) / path.relative_to(written_in)
    return path


def outcome_of(student: Submission, job: dict[str, Any] | None, the_rubric: rubric.Rubric,
               sandboxed: bool) -> outputs.Outcome:
    if student.problem:
        return outputs.Outcome(student.id, "ungradable", f"wrong layout: {student.problem}", sandboxed=sandboxed)
    folder = Path(job["folder"]) if job else None
    if folder is not None and (folder / JOB_ERROR).is_file() and not (folder / jobs.OBSERVATIONS).is_file():
        return outputs.Outcome(student.id, "error", f"the grader failed: {(folder / JOB_ERROR).read_text().strip()} "
                               f"(see {folder / 'stdout.log'})", sandboxed=sandboxed)
    if folder is None or not (folder / jobs.OBSERVATIONS).is_file():
        return outputs.Outcome(student.id, "pending", "not graded yet", sandboxed=sandboxed)
    stored = json.loads((folder / jobs.OBSERVATIONS).read_text())
    done, references = jobs.samples_from_json(stored["done"]), jobs.samples_from_json(stored["references"])
    grade_plan = jobs.plan_for(job)
    verdicts = jobs.verdicts_for(grade_plan, done, references)
    samples = [s for runs in done.values() for s in runs]
    account = stored.get("sandbox") or {}
    outcome = outputs.Outcome(student.id, "graded", "", the_rubric.score(verdicts), verdicts, account,
                              lessons.crash_lessons(_logs([_rebased(s.run_dir, job) for s in samples])),
                              sandboxed=account.get("sandboxed", sandboxed))
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
    rates = grade.reference_rates(grade_plan, references)
    ratios = [rate / ref for (lab, ws), runs in done.items() for s in runs
              if (rate := s.measured.get("img_per_sec")) and (ref := rates.get((lab, ws)))]
    outcome.rate_ratio = statistics.median(ratios) if ratios else None
    return outcome


# ---------------------------------------------------------------------------------- the command

def _class_dir(args: argparse.Namespace) -> Path:
    return args.results.resolve() / "class" / args.submissions.resolve().name


def _job_for(student: Submission, args: argparse.Namespace, class_dir: Path, limits: sandbox.Limits,
             sandboxed: bool, slot: int = 0, gpus: list[int] | None = None) -> dict[str, Any]:
    hidden = {str(args.submissions.resolve()), str(class_dir), str(args.results.resolve())}
    return {"id": student.id, "class_id": hashlib.sha256(str(class_dir).encode()).hexdigest()[:12],
            "submission": str(student.folder.resolve()) if student.path.is_dir() else str(student.path.resolve()),
            "program": str(student.program.resolve()), "lab": args.lab,
            "profile": _profile_argument(args.profile),
            "world_sizes": args.world_sizes, "limits": dataclasses.asdict(limits),
            "folder": str(class_dir / "jobs" / student.id), "sandboxed": sandboxed, "slot": slot, "gpus": gpus,
            "hidden": sorted(hidden), "digest": student.digest()}


def _profile_argument(profile: str | None) -> str | None:
    """A profile file by its absolute path (jobs run in the repository), a profile name as it is."""
    return str(Path(profile).resolve()) if profile and Path(profile).is_file() else profile


def _stored_job(class_dir: Path, student: Submission) -> dict[str, Any] | None:
    path = class_dir / "jobs" / student.id / "job.json"
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


def run(args: argparse.Namespace) -> int:
    if args.autograder:
        from harness.classgrade import bundle

        return bundle.write(args)
    if not args.submissions.is_dir():
        raise UsageError(f"submissions folder {args.submissions} does not exist (one folder or .py file per student)")
    find_lab(args.lab)
    rubric_path = args.rubric or rubric.DEFAULT.with_name(f"{args.lab}.toml")
    if not args.rubric and not rubric_path.is_file():
        raise UsageError(f"no rubric ships for lab {args.lab}; give one with --rubric (format: {rubric.DEFAULT})")
    the_rubric = rubric.load(rubric_path)
    sandboxed = not args.no_sandbox
    if sandboxed and not args.regrade:
        refusal = _sandbox_refusal()
        if refusal:
            raise UsageError(refusal)
    class_dir = _class_dir(args)
    if class_dir.is_relative_to(args.submissions.resolve()):
        # the next run would find the grades as a student's folder (and hide them from the sandbox)
        raise UsageError(f"--results {args.results} puts the grades inside the submissions folder "
                         f"{args.submissions}; give --results a folder outside it")
    students = find_submissions(args.submissions)
    if not students:
        raise UsageError(f"{args.submissions} holds no submissions (one folder or .py file per student)")
    unknown = sorted(set(args.rerun) - {s.id for s in students})
    if unknown:
        raise UsageError(f"--rerun {', '.join(unknown)}: no such submission in {args.submissions}")
    limits = the_rubric.limits
    gradable = [s for s in students if not s.problem]
    host = doctor.fingerprint()
    try:  # the profile and the lab checked once, before any job starts
        probe_plan = jobs.plan_for(_job_for(gradable[0], args, class_dir, limits, sandboxed)) if gradable else None
    except profiles.ProfileError as error:
        raise UsageError(str(error)) from None
    size = args.jobs or (default_jobs(probe_plan, host["gpus"] or 0) if probe_plan else 1)
    lesson_root = args.lessons or (REPO.as_uri() + "/")

    stored = {s.id: _stored_job(class_dir, s) for s in students}
    todo: list[Submission] = []
    for student in gradable:
        job = stored[student.id]
        complete = job is not None and (Path(job["folder"]) / jobs.OBSERVATIONS).is_file()
        if args.regrade:
            continue
        if student.id in args.rerun or not complete or job.get("digest") != student.digest() \
                or job.get("sandboxed") != sandboxed:
            todo.append(student)
    console.print(f"distlab grade-class: {len(students)} submission(s), {len(todo)} to grade, {size} at once"
                  f"{'' if sandboxed else ' WITHOUT the sandbox'}; {class_dir}", markup=False)
    started, interrupted = time.monotonic(), None
    pool = Pool(size, sandboxed)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        queue = list(todo)
        while queue or pool.running:
            slot = pool.free_slot()
            while queue and slot is not None:
                student = queue.pop(0)
                job = _job_for(student, args, class_dir, limits, sandboxed, slot,
                               gpus_of(slot, probe_plan) if probe_plan else None)
                folder = Path(job["folder"])
                _set_aside(folder)
                folder.mkdir(parents=True)
                write_json(folder / "job.json", job)
                stored[student.id] = job
                env = dict(os.environ)
                if job["gpus"] is not None:
                    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, job["gpus"]))
                pool.start(slot, student.id, folder / "job.json", env)
                console.print(f"started {student.id} (slot {slot})", markup=False)
                slot = pool.free_slot()
            for student_id, code in pool.finished():
                student = next(s for s in students if s.id == student_id)
                folder = Path(stored[student_id]["folder"])
                if code and not (folder / jobs.OBSERVATIONS).is_file():  # the harness's failure, not the student's
                    lines = jobs._read(folder / "stdout.log").strip().splitlines() or ["no output"]
                    (folder / JOB_ERROR).write_text(f"job exit code {code}: {lines[-1][:500]}\n")
                outcome = outcome_of(student, stored[student_id], the_rubric, sandboxed)
                outputs.write_student(class_dir, outcome, the_rubric, lesson_root)
                points = f", {outcome.score:g} of {the_rubric.max_score:g}" if outcome.score is not None else ""
                console.print(f"finished {student_id}: {outcome.status}{points}"
                              f"{f' (job exit code {code})' if code else ''}", markup=False)
            time.sleep(0.2)
    except KeyboardInterrupt as stop:
        interrupted = stop
        pool.stop()
    finally:
        signal.signal(signal.SIGTERM, previous)
    outcomes = [outcome_of(s, stored[s.id], the_rubric, sandboxed) for s in students]
    for outcome in outcomes:
        if outcome.status != "pending":
            outputs.write_student(class_dir, outcome, the_rubric, lesson_root)
    graded = [o for o in outcomes if o.status == "graded"]
    summary = {"lab": args.lab, "profile": probe_plan.profile.name if probe_plan else str(args.profile),
               "rubric": str(the_rubric.path), "jobs": size, "sandboxed": sandboxed,
               "submissions": len(outcomes), "graded": len(graded),
               "ungradable": sum(o.status == "ungradable" for o in outcomes),
               "pending": [o.id for o in outcomes if o.status == "pending"],
               "mean": f"{statistics.fmean(o.score for o in graded):.2f}" if graded else "-",
               "wall_seconds": time.monotonic() - started, "regraded": bool(args.regrade),
               "interrupted": interrupted is not None,
               "students": {o.id: {"status": o.status, "score": o.score, "reason": o.reason,
                                   "sandbox": o.findings(), "seconds": o.seconds, "rate_ratio": o.rate_ratio,
                                   "items": {s.item.name: s.score for s in o.scores}} for o in outcomes}}
    class_dir.mkdir(parents=True, exist_ok=True)
    outputs.gradebook_csv(class_dir / "gradebook.csv", the_rubric, outcomes)
    page = outputs.class_page(class_dir, the_rubric, outcomes, summary)
    write_json(class_dir / "summary.json", summary)
    console.print(f"gradebook: {class_dir / 'gradebook.csv'}  class page: {page}", markup=False)
    if interrupted is not None:
        raise interrupted
    return 0


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")
