"""Hostile: reads the grader's checkout beyond the harness and the labs: its .git (the course's
history, another week's solutions), earlier results, anything kept there."""
import importlib.util
import pathlib

# harness/ is on every rank's path: it says where the checkout is
root = pathlib.Path(importlib.util.find_spec("harness").origin).resolve().parents[1]
print("the checkout holds:", sorted(p.name for p in root.iterdir()), flush=True)
print((root / ".git" / "HEAD").read_text())
