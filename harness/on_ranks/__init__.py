"""Programs that run ON the ranks, launched by path (never imported by the grader's own process):
the reference loops a lab is timed against, and the observer that goes first on every rank's
PYTHONPATH. They import nothing of the harness: standard library, torch and the libraries a lab
uses. The paths below are the one place they are named.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
OBSERVER = HERE / "observer"  # prepended to every rank's PYTHONPATH: Python's site imports its sitecustomize.py
TRAIN_LOOP = HERE / "train_loop.py"
PLAIN_ALLREDUCE = HERE / "plain_allreduce.py"
