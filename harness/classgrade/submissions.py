"""A class's submissions found in its folder: one folder per student (its name is the student's id; the
program is its train.py, or its only .py file) or one .py file per student (the file's name, less .py,
is the id). A submission that cannot be graded says why before anything runs.

The folder is the students' own, so it is read as hostile input: no link is followed, a FIFO or a
device is never opened (it is a reason the submission cannot be graded), a file is read only up to a
bound, a name may hold any bytes (a zip made on Windows: latin-1), and one bad entry is that
submission's problem, never the class's. A name that is not a plain student id is shown escaped and
never used as a file name: each submission's files are named by its `key`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import stat
from pathlib import Path

from harness import files

STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+@-]{0,63}")
MAX_PROGRAM_BYTES = 1 << 20
MAX_FILE_BYTES = 16 * MAX_PROGRAM_BYTES  # of any file of a submission, read for its digest
MAX_ENTRIES = 10000  # files and folders of one submission
MAX_DEPTH = 16


def shown(name: str) -> str:
    """A file name as text any page can hold: undecodable bytes replaced, control characters escaped."""
    text = os.fsencode(name).decode("utf-8", "replace")
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"
                   for c in text)


def key_of(name: str) -> str:
    """The submission's name where it is a plain student id, else a name made from it: what its job
    folder, feedback page and Gradescope folder are called (a name of 240 characters, a formula, a
    name of latin-1 bytes never reach a file name)."""
    if STUDENT_ID.fullmatch(name):
        return name
    return f"submission-{hashlib.sha256(os.fsencode(name)).hexdigest()[:12]}"


@dataclasses.dataclass
class Submission:
    id: str  # as the gradebook shows it (shown(): any bytes made printable)
    path: Path  # the folder, or the file
    program: Path | None
    problem: str = ""  # why it is ungradable before anything runs
    key: str = ""  # its files' name (key_of)

    @property
    def folder(self) -> Path:
        return self.path if self.path.is_dir() else self.path.parent

    def digest(self) -> str:
        """The submission's content: a resubmitted program is graded again on resume. Every entry's
        name (as bytes) and kind, each regular file's first MAX_FILE_BYTES, each link's target as text;
        links are never followed, special files never opened."""
        sha = hashlib.sha256()
        if not self.path.is_dir():
            sha.update(os.fsencode(self.path.name) + b"\0")
            try:
                sha.update(files.read_regular_file(self.path, MAX_FILE_BYTES))
            except (OSError, ValueError) as error:
                sha.update(f"unreadable: {error}".encode(errors="replace"))
            return sha.hexdigest()
        try:
            for count, (name, info, fd, base) in enumerate(files.walk(self.path, MAX_DEPTH), 1):
                kind = files.special_kind(info) or ("folder" if stat.S_ISDIR(info.st_mode) else "file")
                sha.update(os.fsencode(name) + b"\0" + kind.encode() + b"\0")
                try:
                    if kind == "file":
                        sha.update(files.read_regular_file(base, MAX_FILE_BYTES, dir_fd=fd))
                    elif kind == "a symbolic link":  # where it points, as text: never followed
                        sha.update(os.fsencode(os.readlink(base, dir_fd=fd)))
                except (OSError, ValueError) as error:  # too large, or changed while read
                    sha.update(f"unreadable: {error}".encode(errors="replace"))
                if count > MAX_ENTRIES:
                    break
        except (OSError, ValueError) as error:
            sha.update(f"walk stopped: {error}".encode(errors="replace"))
        return sha.hexdigest()


def _folder_problem(folder: Path) -> str:
    """Why a submission's folder cannot be graded as it is, "" if it can: a FIFO, socket or device in it
    (the sandbox binds the folder; nothing of the grader's reads them), too many entries, too deep."""
    usage = files.tree_usage(folder, max_entries=MAX_ENTRIES, max_depth=MAX_DEPTH)
    specials = [(name, kind) for name, kind in usage.special if kind != "a symbolic link"]
    if specials:
        name, kind = specials[0]
        return f"{shown(name)} in its folder is {kind}; a submission holds files and folders only"
    if usage.error:
        return f"its folder cannot be graded as it is: {shown(usage.error)}"
    return ""


def _submission(entry: Path) -> Submission:
    is_program = entry.suffix == ".py" and not entry.is_symlink() and entry.is_file()
    name = entry.stem if is_program else entry.name
    sub = Submission(shown(name), entry, None, key=key_of(name))
    info = entry.lstat()
    if stat.S_ISLNK(info.st_mode):
        sub.problem = "it is a link; a submission is a folder or a .py file"
    elif not STUDENT_ID.fullmatch(name):
        sub.problem = "its name is not a plain student id (letters, digits, . _ + @ -, at most 64)"
    elif stat.S_ISREG(info.st_mode):
        sub.problem = "" if entry.suffix == ".py" else f"{shown(entry.name)} is not a .py program"
        sub.program = entry if entry.suffix == ".py" else None
    elif stat.S_ISDIR(info.st_mode):
        sub.problem = _folder_problem(entry)
        programs = sorted(p for p in entry.glob("*.py") if stat.S_ISREG(p.lstat().st_mode))
        main = [p for p in programs if p.name == "train.py"]
        if sub.problem:
            pass
        elif main or len(programs) == 1:
            sub.program = (main or programs)[0]
        else:
            sub.problem = ("no .py program in its folder" if not programs else
                           f"{len(programs)} .py files and none is train.py (the program graded)")
    else:
        sub.problem = f"it is {files.special_kind(info) or 'not a file'}; a submission is a folder or a .py file"
    if sub.program is not None and sub.program.lstat().st_size > MAX_PROGRAM_BYTES:
        sub.problem, sub.program = f"{shown(sub.program.name)} is larger than {MAX_PROGRAM_BYTES} bytes", None
    if sub.program is not None and not sub.program.name.isprintable():
        sub.problem, sub.program = f"{shown(sub.program.name)}: a program's name holds no control characters", None
    return sub


def find_submissions(root: Path) -> list[Submission]:
    """One Submission per entry of `root` (but hidden ones), in name order; an entry that cannot even
    be looked at is an ungradable submission saying why."""
    found = []
    for entry in sorted(root.iterdir(), key=lambda p: os.fsencode(p.name)):
        if entry.name.startswith("."):
            continue
        try:
            found.append(_submission(entry))
        except (OSError, ValueError) as error:
            found.append(Submission(shown(entry.name), entry, None, f"it cannot be read: {shown(str(error))}",
                                    key=key_of(entry.name)))
    return _refuse_ambiguous(found)


def _refuse_ambiguous(found: list[Submission]) -> list[Submission]:
    """Entries that name the same student (`alice/` and `alice.py`): neither is graded (which one the
    student meant is theirs to say), each refused by name under a key of its own entry's name."""
    by_key: dict[str, list[Submission]] = {}
    for sub in found:
        by_key.setdefault(sub.key, []).append(sub)
    for same in (subs for subs in by_key.values() if len(subs) > 1):
        names = " and ".join(f"{shown(s.path.name)}{'/' if s.path.is_dir() else ''}" for s in same)
        for sub in same:
            sub.problem = f"ambiguous: {names} are both this student's submission; keep one"
            sub.program, sub.key = None, key_of(sub.path.name)
    keys = [s.key for s in found]
    for sub in (s for s in found if keys.count(s.key) > 1):  # a folder named alice.py beside alice.py.py...
        sub.key = f"submission-{hashlib.sha256(os.fsencode(sub.path.name) + b'/').hexdigest()[:12]}"
    return found
