"""The last checkpoint each rank saved, loaded by the evaluating process (accuracy.py) into the lab's
model (observed:checkpoint_loads, data_parallel.check_checkpoints judges it).

The evaluating process loads the last checkpoint each rank saved (`checkpoints`) into the lab's model, or,
where the program trained a model of its own, against that model's state: a file a program wrote,
read only inside the run's folder, as a regular file of bounded size, never through a link, with
torch.load(weights_only=True) (no pickled code runs); what does not load is named (the DDP
wrapper's "module." prefix, missing keys, wrong shapes).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from harness import files

# A checkpoint holds the model and the optimizer's state (SGD with momentum: twice the model), and more.
CHECKPOINT_LIMIT = 1 << 30
CHECKPOINTS_READ = 8  # files opened per run at most, newest saves first: a program may save thousands
# What wraps a model's state_dict keys when the wrapper's, not the model's, is saved.
WRAPPER_PREFIXES = {"module.": "the DDP (or DataParallel) wrapper's state_dict was saved, every key prefixed "
                               "'module.'; save model.module.state_dict()",
                    "_orig_mod.": "torch.compile's wrapper's state_dict was saved, every key prefixed '_orig_mod.'; "
                                  "save the original module's state_dict()"}


def checkpoints(ranks: dict[int, tuple[Path, dict[str, Any]]], roots: list[Path], final: dict[str, Any],
                build: Any) -> list[dict[str, Any]]:
    """The last file each rank saved that holds a model state, loaded: into `build()` (the lab's
    model) with strict keys, or, without `build`, against the keys and shapes of the model the program
    trained (`final`, rank 0's final state). One entry per file read: path (from its root), rank,
    loads (None: not a model's state), what it was loaded into, and what was found."""
    entries: list[dict[str, Any]] = []
    read: set[str] = set()
    for rank, (_, observed) in sorted(ranks.items()):
        for save in reversed(observed.get("saves") or []):
            path = str(save.get("path", ""))
            if path in read:
                break  # a file another rank's check (or this rank's newer save) already read
            if len(read) >= CHECKPOINTS_READ:
                return entries
            read.add(path)
            entry = load_checkpoint(Path(path), roots, final, build)
            entry["rank"] = rank
            entries.append(entry)
            if entry["loads"] is not None:
                break  # this rank's last checkpoint
    return entries


def load_checkpoint(path: Path, roots: list[Path], final: dict[str, Any], build: Any) -> dict[str, Any]:
    import torch

    shown, problem = inside(path, roots)
    entry: dict[str, Any] = {"path": shown, "loads": None, "into": "the lab's model" if build else
                             "the model the program trained"}
    if problem:
        return {**entry, "detail": problem}
    try:
        raw = files.read_regular_file(path, CHECKPOINT_LIMIT)
    except (OSError, ValueError) as error:
        return {**entry, "detail": f"not read ({type(error).__name__}: {error})"}
    try:
        saved = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch raises many types for what it refuses
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        if "weights_only" in str(error) or "Unsupported global" in str(error):
            return {**entry, "loads": False, "detail": "torch.load(weights_only=True) refuses it: it pickles "
                    "objects, not tensors (torch.save(model) saves the class, not the weights); save "
                    f"model.state_dict() ({first[:160]})"}
        return {**entry, "detail": f"not a file torch.load reads ({type(error).__name__}: {first[:160]})"}
    wanted = {name: tuple(value.shape) for name, value in final.items() if isinstance(value, torch.Tensor)}
    if build is not None:
        model = build()
        wanted = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    where, state = model_state(saved, set(wanted))
    if state is None:
        return {**entry, "detail": "holds no model state"}
    entry["key"] = where
    problem = fits(state, wanted)
    if problem is None and build is not None:
        try:
            model.load_state_dict(state, strict=True)
        except (RuntimeError, ValueError, KeyError) as error:
            problem = (str(error).strip().splitlines() or ["load_state_dict failed"])[0][:200]
    if problem:
        return {**entry, "loads": False, "detail": problem}
    return {**entry, "loads": True, "detail": f"{len(state)} tensors{f' under {where!r}' if where else ''}, "
                                              "every key and shape the model's (strict)"}


def inside(path: Path, roots: list[Path]) -> tuple[str, str | None]:
    """The path as shown (from its root), and why it may not be read: outside every root, or through
    a link (the run's own processes are stopped: nothing changes it while it is checked)."""
    for root in roots:
        root = Path(os.path.realpath(root))
        try:
            relative = path.relative_to(root)
        except ValueError:
            continue
        if ".." in relative.parts:
            break
        current = root
        for part in relative.parts[:-1]:
            current = current / part
            if current.is_symlink():
                return str(relative), f"not read: {current.relative_to(root)} is a link"
        return str(relative), None
    return str(path), "saved outside the run's folder: not read"


def model_state(saved: Any, wanted: set[str], depth: int = 0) -> tuple[str, dict[str, Any] | None]:
    """The mapping of tensors in a saved object that best matches the model's keys (a wrapper's prefix
    taken off), and where it was ("" for the object itself, or its key): None where none is a model's
    state (fewer than half the model's keys, each way)."""
    import torch

    best: tuple[int, str, dict[str, Any] | None] = (0, "", None)
    if not isinstance(saved, dict):
        return "", None
    tensors = {k: v for k, v in saved.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    if tensors:
        overlap = len(wanted & {unwrapped(k) for k in tensors})
        if overlap * 2 >= len(wanted) and overlap * 2 >= len(tensors):
            best = (overlap, "", saved)
    if depth < 2:
        for key, value in saved.items():
            if isinstance(value, dict):
                where, state = model_state(value, wanted, depth + 1)
                if state is not None:
                    overlap = len(wanted & {unwrapped(k) for k in state if isinstance(k, str)})
                    if overlap > best[0]:
                        best = (overlap, f"{key}.{where}" if where else str(key), state)
    return best[1], best[2]


def unwrapped(key: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def fits(state: dict[str, Any], wanted: dict[str, tuple[int, ...]]) -> str | None:
    """Why a saved state does not load into a model with these keys and shapes (None: it does)."""
    keys = {k for k in state if isinstance(k, str)}
    for prefix, why in WRAPPER_PREFIXES.items():
        if keys and all(k.startswith(prefix) for k in keys) and not (keys & set(wanted)):
            return why
    missing, unexpected = sorted(set(wanted) - keys), sorted(keys - set(wanted))
    if missing or unexpected:
        said = []
        if missing:
            said.append(f"{len(missing)} of the model's keys missing (e.g. {missing[0]})")
        if unexpected:
            said.append(f"{len(unexpected)} keys the model does not have (e.g. {unexpected[0]})")
        return "; ".join(said) + ": save the model's own state_dict() (model.module's under DDP)"
    shapes = [(k, tuple(getattr(state[k], "shape", ())), wanted[k]) for k in sorted(wanted)
              if tuple(getattr(state[k], "shape", ())) != wanted[k]]
    if shapes:
        name, saved, model = shapes[0]
        return (f"{len(shapes)} tensor(s) of another shape (e.g. {name}: saved {list(saved)}, the model's "
                f"{list(model)}): the checkpoint is of another model")
    return None
