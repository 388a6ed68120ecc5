"""Hostile: leaves FIFOs named like the observer's files: a grader that opens one to read it waits
for a writer that never comes, and the class queued behind it is never graded."""
import os
import pathlib

directory = pathlib.Path(os.environ["DISTLAB_OBSERVE_DIR"])
directory.mkdir(parents=True, exist_ok=True)
rank = os.environ.get("RANK", "0")
os.mkfifo(directory / f"observer-errors.{rank}.txt")
os.mkfifo(directory / f"rank.{rank}.json")
