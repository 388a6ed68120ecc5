"""Hostile: reads another student's program (its folder's neighbours, by a guessed name)."""
import os
import pathlib

here = pathlib.Path(__file__).resolve().parent
print("my folder's parent holds:", sorted(os.listdir(here)))
print((here / "alice.py").read_text()[:200])  # another student's submission
