"""Training checkpoints: written whole then renamed (never half a file), read back onto the
reading rank's own device, with the history of the epochs before."""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from pathlib import Path

import torch
from torch import nn

from labs.common.models import model_tag
from labs.common.timing import History

CHECKPOINT_FORMAT = "distlab-train-checkpoint"


def save_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int, step: int,
                    history: History, args: argparse.Namespace, global_batch: int) -> None:
    """Write to a temporary file beside path, then rename: a crash mid-write leaves the previous checkpoint."""
    state = {
        "format": CHECKPOINT_FORMAT,
        "model_tag": model_tag(args),
        "global_batch": global_batch,
        "epoch": epoch,  # the next epoch to run
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "history": vars(history),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                    args: argparse.Namespace, global_batch: int) -> tuple[int, int, History]:
    """Load a checkpoint into model and optimizer; returns (next epoch, global step, history).

    map_location puts every tensor on this process's device: a checkpoint written from cuda:0
    would otherwise land on GPU 0 in every process. weights_only refuses pickled code.
    Anything unusable stops the run before it writes anything.
    """
    if not path.is_file():
        raise SystemExit(f"error: --resume: no checkpoint at {path}; drop --resume to start afresh")
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as error:  # torch raises many types for a damaged file
        raise SystemExit(f"error: {path} is not a readable checkpoint ({type(error).__name__}); "
                         "delete it or point --checkpoint at another") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise SystemExit(f"error: {path} is not a distlab training checkpoint; point --checkpoint at one")
    if state["model_tag"] != model_tag(args):
        raise SystemExit(f"error: {path} holds a {state['model_tag']} model, this run builds {model_tag(args)}; "
                         "resume with the same --stem")
    if state["global_batch"] != global_batch:
        raise SystemExit(f"error: {path} was trained with a global batch of {state['global_batch']}, this run has "
                         f"{global_batch}; resume with the same --batch-size x world size")
    if state["epoch"] >= args.epochs:
        raise SystemExit(f"error: {path} has already trained {state['epoch']} epochs; raise --epochs to go on")
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as error:
        first_line = str(error).strip().splitlines()[0]
        raise SystemExit(f"error: {path} does not fit this model ({first_line}); point --checkpoint at another") \
            from None
    return state["epoch"], state["step"], History(**state["history"])
