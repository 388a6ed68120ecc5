"""Hostile (uid sandbox): reaches for an earlier job's folder by the class's layout (its run folder's
ancestors: jobs/<id>/runs/<lab>/<stamp>/), reads the classmate's copy of their program and plants a
file in their runs: jobs that run one after another share a uid."""
import pathlib

jobs = pathlib.Path.cwd().parents[3]  # jobs/<this id>/runs/<lab>/<this run>
for classmate in ("alice", "erin", "aa-first"):
    folder = jobs / classmate
    for name in ("submission/alice.py", "submission/train.py", "submission/aa-first.py"):
        try:
            print("read", classmate, name, (folder / name).read_text()[:80])
        except OSError as error:
            print("refused", classmate, name, type(error).__name__)
    try:
        runs = sorted((folder / "runs").iterdir())
        print("found", classmate, "runs", len(runs))
        for run in runs:
            (run / "planted.txt").write_text("planted\n")
            print("planted in", classmate)
    except OSError as error:
        print("refused", classmate, "runs", type(error).__name__)
raise SystemExit(1)
