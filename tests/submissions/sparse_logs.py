"""Hostile: leaves sparse files of 30 MiB that take no disk beside its rank's output under logs/, named
like torchrun's (std*.log): a grader copying every rank log whole writes 120 MiB for two ranks, as
root, and the monitor then blames the program for the grader's copies."""
import os
import pathlib

rank = os.environ.get("LOCAL_RANK", "0")
for own in pathlib.Path("logs").glob(f"*/attempt_*/{rank}"):  # torchrun's logs/<run>/attempt_0/<rank>/
    for name in ("stdout-a.log", "stdout-b.log"):
        with open(own / name, "wb") as sparse:
            sparse.truncate(30 << 20)
raise SystemExit(1)
