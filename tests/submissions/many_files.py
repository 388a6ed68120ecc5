"""Hostile: makes empty files without end: no byte limit is reached, but each takes one of the host's
inodes (200k were made in 8 s)."""
import itertools
import os

os.makedirs("many", exist_ok=True)
for number in itertools.count():
    open(f"many/{os.getpid()}.{number}", "w").close()  # noqa: SIM115 - a file made, never written
