"""Hostile: prints the whole environment it was started with, on every rank, and ends with it in its
error: whatever the grader's environment holds (a token, a password) would reach its feedback.

Every rank prints before any exits: the first rank to fail ends the others, and one still starting
then would leave an empty log, showing nothing of what it was given. The ranks wait for each other
through files in the folder they share, not a process group, so the run never becomes a job."""
import os
import pathlib
import sys
import time

print("environment:", sorted(os.environ.items()), flush=True)
rank, world_size = os.environ.get("RANK", "0"), int(os.environ.get("WORLD_SIZE", "1"))
pathlib.Path(f"printed.{rank}").touch()
deadline = time.monotonic() + 120  # every rank printed, or the grader's wall time ends it first
while len(list(pathlib.Path().glob("printed.*"))) < world_size and time.monotonic() < deadline:
    time.sleep(0.1)
sys.exit(f"environment: {' '.join(f'{k}={v}' for k, v in sorted(os.environ.items()))}")
