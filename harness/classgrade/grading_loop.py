"""The class graded (`grade_class`, `distlab grade-class`): each job started on a slot of the pool
(pool.py) or as a task of one Slurm job array (cluster.py), each one's pages written as it ends, its
runs shown as its job tells them (progress.py); then the gradebook, the class page and summary.json.
The class is opened (its request checked, its settings, its stored jobs) by classroom.py.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.classgrade import account, cluster, outputs
from harness.classgrade import job as jobs
from harness.classgrade.classroom import DEFAULT_LAB, SETTINGS, ClassRequest, Classroom, open_class
from harness.classgrade.outcome import JOB_ERROR, judging_failed
from harness.classgrade.pool import Ended, Pool, gpus_of
from harness.classgrade.progress import class_progress
from harness.classgrade.sandbox import private
from harness.classgrade.submissions import Submission
from harness.console import console, print_json
from harness.files import write_json
from harness.grading import disk

EVENT_WAIT_S = 0.2  # the longest the pool waits for a job's event: its deadlines are looked at as often


def _set_aside(folder: Path, keep: bool = False) -> None:
    """An earlier grade of a job, kept beside it (never deleted): `<id>.before-<n>`. A job stopped
    before it was judged (no observations.json) is never judged: its runs' weights and checkpoints
    are released as a judged job's are (grading/disk.py), unless the class keeps them (`keep`)."""
    if not folder.exists():
        return
    if not keep and not folder.is_symlink() and not (folder / jobs.OBSERVATIONS).is_file():
        disk.release_weights([folder / "runs"], folder)
    for n in range(1, 10000):
        target = folder.with_name(f"{folder.name}.before-{n}")
        if not target.exists():
            folder.rename(target)
            return


def new_job(room: Classroom, student: Submission, slot: int, gpus: list[int] | None) -> dict[str, Any]:
    """The student's job, written to a folder of its own (an earlier grade set aside) and stored as the class's."""
    job = room.job_for(student, slot, gpus)
    folder = Path(job["folder"])
    _set_aside(folder, room.request.keep)
    folder.mkdir(parents=True)
    write_json(folder / "job.json", job)
    room.stored[student.key] = job
    room.outcomes.pop(student.key, None)
    room.written.discard(student.key)
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
    points = (f", {account.points(outcome.score)} of {account.points(room.rubric.max_score)}"
              if outcome.score is not None else "")
    console.print(f"finished {key}: {outcome.status}{points}"
                  f"{f' (job exit code {code})' if code else ''}{f'; {counted(key)}' if counted else ''}",
                  markup=False)


def write_pages(room: Classroom, student: Submission, lesson_root: str) -> account.Outcome:
    """The student's feedback pages, written once per grade: as its job ends (finish_job), else at the
    end (grade_class); asked again, its outcome as they were written. Where they cannot be made of
    what its runs left, its row is "error" (judging_failed) and the pages say that."""
    if student.key in room.written:
        return room.outcomes[student.key]
    outcome = room.outcome(student)
    try:
        outputs.write_student(room.class_dir, outcome, room.rubric, lesson_root)
    except Exception as error:  # noqa: BLE001 - one submission's pages, never the class's end
        outcome = room.outcomes[student.key] = judging_failed(student, error, room.request.sandboxed)
        outputs.write_student(room.class_dir, outcome, room.rubric, lesson_root)
    room.written.add(student.key)
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


def summary_of(room: Classroom, outcomes: list[account.Outcome], wall_seconds: float, interrupted: bool
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
            # Points rounded as every other output shows them (account.rounded), so no two disagree.
            "students": {o.key: {"id": o.id, "status": o.status,
                                "score": None if o.score is None else account.rounded(o.score),
                                "reason": o.reason or (account.why(o, room.rubric) if o.status == "graded" else ""),
                                "sandbox": o.findings(), "seconds": o.seconds, "rate_ratio": o.rate_ratio,
                                "items": {s.item.name: account.rounded(s.score) for s in o.scores}} for o in outcomes}}


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
    # Each student's pages once: those whose jobs ended above were written then (write_pages keeps them).
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
