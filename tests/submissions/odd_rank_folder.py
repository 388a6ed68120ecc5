"""Hostile: leaves a rank folder named like no rank ("x") where torchrun keeps the ranks' output, and a
link in place of a restart attempt's folder, to a folder of its own holding a planted rank log: a grader
taking the name for a number fails, one following the link copies what the link points at."""
import contextlib
import os
import pathlib

logs = pathlib.Path("logs")  # its run folder is its working directory; torchrun writes logs/<run>/attempt_0/<rank>/
run = next((p for p in logs.iterdir() if p.is_dir()), logs / "run")
(run / "attempt_0" / "x").mkdir(parents=True, exist_ok=True)
(run / "attempt_0" / "x" / "stdout.log").write_text("a rank named x\n")
planted = pathlib.Path("elsewhere") / "0"
planted.mkdir(parents=True, exist_ok=True)
(planted / "stdout.log").write_text("PLANTED-THROUGH-A-LINK\n")
# Every rank plants the link before it fails: torchrun ends the others when the first rank exits.
with contextlib.suppress(FileExistsError):
    os.symlink(os.path.abspath("elsewhere"), run / "attempt_9")
raise SystemExit(1)
