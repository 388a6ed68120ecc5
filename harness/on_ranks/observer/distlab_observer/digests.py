"""Digests of a model's state, the same on the ranks (the observer) and in the grader's evaluator
(harness/observe/accuracy.py): equal digests mean bitwise-equal states."""

from __future__ import annotations

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
