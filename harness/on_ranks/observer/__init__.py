"""The observer the harness puts on every rank of a run (see sitecustomize.py).

This folder itself goes first on the ranks' PYTHONPATH, so that Python's `site` imports its
sitecustomize.py at start-up; distlab_observer.py holds the hooks. Nothing here imports torch
until the program does.
"""
