"""Hostile: leaves observation files nested 100,000 levels deep where the observer's go: a reader that
recurses (json.loads) raises RecursionError, in the grader's own job, and the grade says "the grader
failed" instead of this program's."""
import os
import pathlib

directory = pathlib.Path(os.environ["DISTLAB_OBSERVE_DIR"])  # any program can read its environment
directory.mkdir(parents=True, exist_ok=True)
rank = os.environ.get("RANK", "0")
(directory / f"rank.{rank}.json").write_text("[" * 100_000 + "]" * 100_000)
