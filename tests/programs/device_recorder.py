"""Run a lab with every tensor it hands to a collective checked against the device the lab chose.

Used as `distlab run LAB --program tests/programs/device_recorder.py` with DISTLAB_RECORD_LAB naming
the lab's own program and DISTLAB_RECORD_DIR a folder: each rank appends one JSON line per
collective call to rank.<r>.jsonl there, then the lab runs unchanged (runpy, as `python LAB`).

On a CPU every tensor is on the CPU, placed or not, so the device alone proves nothing. What a
GPU run would catch is a tensor whose device nobody chose: made by a factory (torch.tensor,
torch.zeros, ...) without device=, or moved with .cpu(), and never moved with .to(device)
afterwards. On a GPU such a tensor lands on the CPU while the lab's device is cuda:<local rank>,
and NCCL refuses it ("No backend type associated with device type cpu"). A TorchFunctionMode
marks those tensors and what is computed from them; each collective records, for every tensor it
gets, its device, whether it is marked ("unplaced"), and whether it is contiguous (Horovod refuses
the others). The device the lab chose is read where the labs choose it: labs.common's
init_torch_distributed, comm.connect and models.pick_device.
"""

from __future__ import annotations

import functools
import json
import os
import runpy
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

# Factories whose result lands on the default device (the CPU) unless device= says otherwise.
FACTORIES = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.empty, torch.full, torch.rand,
             torch.randn, torch.randint, torch.arange, torch.linspace, torch.eye, torch.scalar_tensor,
             torch.empty_strided, torch.randperm}
MOVES = {torch.Tensor.to, torch.Tensor.cuda}  # a device chosen: the result is placed
TORCH_COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                     "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "scatter", "gather", "send",
                     "recv", "isend", "irecv")
HOROVOD_OPS = ("allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
               "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "allgather", "alltoall",
               "reducescatter")
UNPLACED = "_distlab_unplaced"

chosen: dict[str, str] = {}
log_file = None


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, dist.P2POp):
        yield value.tensor


def _mark(value, unplaced: bool) -> None:
    for tensor in _tensors(value):
        if unplaced:
            setattr(tensor, UNPLACED, True)
        elif hasattr(tensor, UNPLACED):
            delattr(tensor, UNPLACED)


class PlacementTracker(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func in FACTORIES:
            _mark(result, "device" not in kwargs)
        elif func in MOVES and (func is torch.Tensor.cuda or "device" in kwargs or any(
                isinstance(a, (torch.device, str, torch.Tensor)) for a in args[1:])):
            _mark(result, False)
        elif func is torch.Tensor.cpu:
            _mark(result, True)  # moved to the CPU whatever device the lab chose
        elif any(hasattr(t, UNPLACED) for t in _tensors((args, kwargs))):
            _mark(result, True)  # computed from an unplaced tensor: on its device
        return result


def _record(op: str, values) -> None:
    tensors = list(_tensors(values))
    entry = {"op": op, "chosen": chosen.get("device"),
             "tensors": [{"device": str(t.device), "unplaced": hasattr(t, UNPLACED),
                          "contiguous": t.is_contiguous(), "shape": list(t.shape)} for t in tensors],
             "where": "".join(traceback.format_stack(limit=4)[:-2]).strip().splitlines()[-2:]}
    log_file.write(json.dumps(entry) + "\n")
    log_file.flush()


def _wrap(namespace, name: str, op: str, chosen_from=None) -> None:
    original = getattr(namespace, name, None)
    if original is None:
        return

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if chosen_from is None:
            _record(op, (args, kwargs))
        result = original(*args, **kwargs)
        if chosen_from is not None:
            chosen["device"] = str(chosen_from(result, args, kwargs))
        return result

    setattr(namespace, name, wrapper)


def install() -> None:
    from labs.common import comm, models, process_group

    for name in TORCH_COLLECTIVES:
        _wrap(dist, name, f"torch.distributed.{name}")
    _wrap(process_group, "init_torch_distributed", "", chosen_from=lambda device, a, k: device)
    _wrap(comm, "connect", "", chosen_from=lambda c, a, k: c.device)
    _wrap(models, "pick_device", "", chosen_from=lambda device, a, k: device)
    try:
        import horovod.torch as hvd
        from horovod.torch import functions
    except ImportError:
        return
    for name in HOROVOD_OPS:
        _wrap(hvd, name, f"horovod.{name}")
    # What hvd.broadcast_parameters broadcasts, checked before Horovod itself sees (and refuses) it.
    broadcast_parameters = functions.broadcast_parameters

    def checked_broadcast_parameters(params, root_rank, *args, **kwargs):
        _record("horovod.broadcast_parameters", dict(params) if not isinstance(params, dict) else params)
        return broadcast_parameters(params, root_rank, *args, **kwargs)

    hvd.broadcast_parameters = checked_broadcast_parameters


def main() -> None:
    global log_file
    program = os.environ["DISTLAB_RECORD_LAB"]
    folder = Path(os.environ["DISTLAB_RECORD_DIR"])
    rank = next((os.environ[v] for v in ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK") if v in os.environ), "0")
    folder.mkdir(parents=True, exist_ok=True)
    log_file = open(folder / f"rank.{rank}.jsonl", "a")  # noqa: SIM115 (open for the whole run)
    install()
    sys.argv = [program, *sys.argv[1:]]
    sys.path.insert(0, str(Path(program).resolve().parent))
    with PlacementTracker():
        runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
    main()
