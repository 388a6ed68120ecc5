"""Digests of a model's state, the same on the ranks (the observer) and in the grader's evaluator
(harness/observe/accuracy.py): equal digests mean bitwise-equal states; and of a loader pass, the
same in the observer's streamed line and in the harness's reading of the rank file (observations.py)."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from hashlib import sha256 as _sha256  # taken when the observer loads, before the program's first line
from typing import Any


def state_digest(state: dict[str, Any]) -> str:
    """sha256 of a state_dict: every entry in sorted key order, each as name, dtype, shape and exact bytes.

    Equal digests mean bitwise-equal states. Non-tensor entries (a module's extra state) count by repr.
    """
    import hashlib

    import torch

    digest = hashlib.sha256()
    for name in sorted(state):
        value = state[name]
        digest.update(name.encode() + b"\0")
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu()
            if tensor.layout != torch.strided:
                tensor = tensor.to_dense()
            tensor = tensor.resolve_conj().resolve_neg().contiguous()
            digest.update(f"{tensor.dtype}{tuple(tensor.shape)}\0".encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]  # a buffer
        else:
            digest.update(f"{type(value).__name__}:{value!r}\0".encode())
    return digest.hexdigest()


def pass_digest(indices: Sequence[int], steps: int) -> str:
    """sha256 of one loader pass as the rank file keeps it: the optimizer steps taken during it and the
    sample indices the loop received, each as an 8-byte little-endian integer. The observer streams it
    when the pass ends (fileformat.PASS_LINE); the harness recomputes it from the rank file."""
    packed = indices if isinstance(indices, array) and indices.typecode == "q" else array("q", indices)
    if sys.byteorder != "little":
        packed = array("q", packed)
        packed.byteswap()
    return _sha256(f"{steps}:{len(packed)}:".encode() + packed.tobytes()).hexdigest()
