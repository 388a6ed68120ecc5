"""Hostile: appends to the harness's verdicts and to the class's gradebook (found from its run directory)."""
import os
import pathlib

import harness.verdict.verdicts  # on every rank's path: the harness itself

failures = []
targets = [pathlib.Path(harness.verdict.verdicts.__file__),  # the grader's code
           pathlib.Path(os.getcwd()).parents[3] / "gradebook.csv"]  # <class>/jobs/<id>/runs/ddp/<run>: the class folder
for target in targets:
    try:
        with open(target, "a") as out:
            out.write("\n# every verdict passes\n")
    except OSError as error:
        failures.append(error)
        print("refused:", error)
if failures:
    raise failures[0]
