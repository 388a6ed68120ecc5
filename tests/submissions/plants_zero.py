"""Hostile: links the observer's files to /dev/zero: a grader that reads one to its end reads until
its memory runs out (it runs as root, in no memory cgroup)."""
import os
import pathlib

directory = pathlib.Path(os.environ["DISTLAB_OBSERVE_DIR"])
directory.mkdir(parents=True, exist_ok=True)
rank = os.environ.get("RANK", "0")
os.symlink("/dev/zero", directory / f"rank.{rank}.json")
os.symlink("/dev/zero", directory / "final_weights.pt")
