"""`distlab grade-class --dry-run`: what a class grade would do, and nothing done.

The submissions found (each: to grade, graded already, or ungradable and why), the runs of each
(GradePlan.cell_runs: the program's, the course lab's beside them), how many at once, and estimates
of the time and the disk, each saying what it was made of: the jobs this class (else another class
under the same results root) graded already with the same lab, profile and world sizes, measured (their
observations.json's wall time, their folders on disk); without one, the time from the profile's time
budgets and the disk unknown. Nothing is started and nothing is written (open_class with dry_run).
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
from pathlib import Path
from typing import Any

from harness.classgrade import job as jobs
from harness.classgrade.classroom import Classroom
from harness.classgrade.outcome import STORED_BYTES
from harness.console import duration
from harness.files import read_json
from harness.grading.execute import MAX_EXTRA_PAIRS


def folder_bytes(folder: Path) -> int:
    """What a folder takes on its disk (allocated blocks: a sparse file counts what it holds), links not followed."""
    total = 0
    for root, folders, names in os.walk(folder):
        for name in folders + names:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total


def measured_jobs(room: Classroom) -> tuple[list[tuple[float, int]], str]:
    """(wall seconds, bytes on disk) of each finished job graded with the class's settings: this class's,
    else those of other classes under the same results root; and where they were found."""
    wanted = room.graded_with()
    here = room.class_dir / "jobs"
    for where, folders in ((f"the {{n}} submission(s) of this class graded already ({here})", [here]),
                           (f"{{n}} submission(s) of other classes under {room.class_dir.parent} graded the same way",
                            [p / "jobs" for p in room.class_dir.parent.glob("*") if p != room.class_dir])):
        found = []
        for jobs_folder in folders:
            for job_json in sorted(jobs_folder.glob("*/job.json")):
                folder = job_json.parent
                if ".before-" in folder.name or not (folder / jobs.OBSERVATIONS).is_file():
                    continue
                try:
                    job = read_json(job_json, 1 << 20)
                    seconds = read_json(folder / jobs.OBSERVATIONS, STORED_BYTES)["wall_seconds"]
                except (OSError, ValueError, KeyError, TypeError):
                    continue
                if isinstance(job, dict) and all(job.get(k) == v for k, v in wanted.items()) \
                        and isinstance(seconds, (int, float)):
                    found.append((float(seconds), folder_bytes(folder)))
        if found:
            return found, where.format(n=len(found))
    return [], ""


def free_bytes(folder: Path) -> int | None:
    """Free space where the results would go (the nearest folder of it that exists)."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def size_text(count: float) -> str:
    """Bytes as people read them, three figures: "1.31 GiB"."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count:.0f} bytes"


def plan_of(room: Classroom) -> dict[str, Any]:
    """The class grade the request stands for, as data; nothing started, nothing written."""
    todo = {s.key for s in room.to_grade()}
    submissions = [{"id": s.id, "key": s.key,
                    "status": "ungradable" if s.problem else "to grade" if s.key in todo else "graded already",
                    "reason": f"wrong layout: {s.problem}" if s.problem else ""} for s in room.students]
    plan: dict[str, Any] = {"dry_run": True, "class_dir": str(room.class_dir), "submissions": submissions,
                            "to_grade": len(todo), "at_once": room.size,
                            "settings": room.settings.described() if room.settings else None}
    grade_plan = room.probe_plan
    if grade_plan is None or not todo:
        return {**plan, "runs_per_submission": 0, "cells": [], "time": None, "disk": None}
    cells = []
    for lab, ws in grade_plan.cells():
        own, beside = grade_plan.cell_runs(lab, ws)
        reference = grade_plan.reference(lab, ws)
        cells.append({"lab": lab, "world_size": ws, "runs": own, "reference_runs": beside,
                      "reference": reference.name if reference else None,
                      "time_budget_s": grade_plan.profile.labs[lab].time_budget_s})
    rounds = math.ceil(len(todo) / room.size)  # submissions graded `at_once` at a time
    measured, where = measured_jobs(room)
    if measured:
        each_s, time_from = statistics.fmean(s for s, _ in measured), f"measured: the mean job of {where}"
    else:
        each_s, time_from = grade_plan.budget_s(), "by the profile's time budgets: nothing graded this way yet"
    disk_each = statistics.fmean(b for _, b in measured) if measured else None
    return {**plan, "runs_per_submission": grade_plan.planned_runs(), "cells": cells,
            "extra_pairs": (f"a speed cell undecided after its runs takes more pairs (a run and the course lab's), "
                            f"up to {MAX_EXTRA_PAIRS} or {grade_plan.profile.speed_budget_s:g} s of them")
            if any(c["reference"] for c in cells) else "",
            "time": {"per_submission_s": each_s, "total_s": each_s * rounds, "from": time_from},
            "disk": {"per_submission_bytes": disk_each,
                     "total_bytes": disk_each * len(todo) if disk_each is not None else None,
                     "from": f"measured: the mean job folder of {where}" if measured else
                             "not known until a submission is graded this way (nothing measured yet)",
                     "free_bytes": free_bytes(room.class_dir)}}


def plan_text(plan: dict[str, Any]) -> str:
    """The plan as people read it."""
    counts = {status: sum(s["status"] == status for s in plan["submissions"])
              for status in ("to grade", "graded already", "ungradable")}
    lines = [f"distlab grade-class --dry-run: nothing is run or written; {plan['class_dir']}",
             f"{len(plan['submissions'])} submission(s): " + ", ".join(f"{n} {status}" for status, n in counts.items())]
    for student in plan["submissions"]:
        reason = f" ({student['reason']})" if student["reason"] else ""
        lines.append(f"  {student['id']}: {student['status']}{reason}")
    if plan["settings"]:
        lines.append(f"settings: {plan['settings']}")
    if not plan["to_grade"]:
        lines.append("nothing to run")
        return "\n".join(lines) + "\n"
    lines.append(f"{plan['runs_per_submission']} run(s) per submission, {plan['at_once']} submission(s) at once:")
    for cell in plan["cells"]:
        beside = f" and {cell['reference_runs']} of {cell['reference']} beside them" if cell["reference_runs"] else ""
        lines.append(f"  {cell['lab']} ws={cell['world_size']}: {cell['runs']} run(s) of the program{beside} "
                     f"(time budget {cell['time_budget_s']:g} s a run)")
    if plan["extra_pairs"]:
        lines.append(f"  then: {plan['extra_pairs']}")
    time = plan["time"]
    lines.append(f"time: about {duration(time['per_submission_s'])} per submission, {duration(time['total_s'])} for "
                 f"{plan['to_grade']} ({time['from']})")
    disk = plan["disk"]
    free = f"; {size_text(disk['free_bytes'])} free there" if disk["free_bytes"] is not None else ""
    if disk["per_submission_bytes"] is None:
        lines.append(f"disk: {disk['from']}{free}")
    else:
        lines.append(f"disk: about {size_text(disk['per_submission_bytes'])} per submission, "
                     f"{size_text(disk['total_bytes'])} for {plan['to_grade']} ({disk['from']}){free}")
    return "\n".join(lines) + "\n"
