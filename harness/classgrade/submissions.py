"""A class's submissions found in its folder: one folder per student (its name is the student's id; the
program is its train.py, or its only .py file) or one .py file per student (the file's name, less .py,
is the id). A submission that cannot be graded says why before anything runs."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
from pathlib import Path

STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+@-]{0,63}")
MAX_PROGRAM_BYTES = 1 << 20


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
