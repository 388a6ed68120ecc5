"""The model the optimizers trained, found from their parameters, and the digest of those parameters."""

from __future__ import annotations

from typing import Any


def find_trained_model(torch: Any, optimizers: list[Any]) -> Any:
    """The smallest module holding every parameter the optimizers update: the model, not its DDP wrapper.

    A wrapper (DDP, torch.compile) holds the same parameters as the model plus one module, itself;
    so among the modules that hold them all, the one with the fewest submodules is the model.
    Found once, at an optimizer's first step, and kept: by exit the program may have dropped it.
    """
    import gc

    wanted = {id(p) for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]}
    module_type = torch.nn.Module
    best, best_key = None, None
    for candidate in gc.get_objects():
        if not issubclass(type(candidate), module_type):  # type(), not isinstance: no proxy's __class__ runs
            continue
        held = {id(p) for p in candidate.parameters()}
        covered = len(wanted & held)
        if not covered:
            continue
        key = (-covered, sum(1 for _ in candidate.modules()), len(held))
        if best_key is None or key < best_key:
            best, best_key = candidate, key
    return best

def _params_digest(torch: Any, optimizers: list[Any]) -> str:
    """sha256 of the parameters the optimizers update, in their order: dtype, shape and exact bytes."""
    import hashlib

    digest = hashlib.sha256()
    with torch.no_grad():
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                for param in group["params"]:
                    tensor = param.detach().cpu().contiguous()
                    digest.update(f"{tensor.dtype}{tuple(tensor.shape)}\0".encode())
                    digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()

def _buffer_owners(model: Any) -> dict[str, str]:
    """Each buffer's name, and the class of the module holding it ("BatchNorm2d", or "BatchNorm" for
    any subclass of torch's BatchNorm base: SyncBatchNorm, Horovod's, a program's own)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    owners = {}
    for prefix, module in model.named_modules():
        kind = "BatchNorm" if isinstance(module, _BatchNorm) else type(module).__name__
        for name, _ in module.named_buffers(recurse=False):
            owners[f"{prefix}.{name}" if prefix else name] = kind
    return owners
