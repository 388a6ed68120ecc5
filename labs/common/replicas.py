"""One model at the end of training, and the end-of-run checks: are the replicas equal, did the shards
split the data?

average_buffers makes every rank's BatchNorm running statistics the same (their average) before a
lab evaluates or saves. Every rank then sends rank 0 a replica_report (its parameters' and buffers'
digests, the sample indices it trained on per epoch, its img/s); check_replicas turns them into the
record's checks (labs/TRAINING.md, "The record"). labs/scaling compares replicas with params_digest alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from labs.common.timing import TrainClock


def _digest(tensors: Iterator[tuple[str, torch.Tensor]]) -> str:
    digest = hashlib.sha256()
    for name, tensor in tensors:
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def params_digest(model: nn.Module) -> str:
    """sha256 of every parameter's bytes, in a fixed order: equal digests mean bitwise equal parameters."""
    return _digest(model.named_parameters())


def buffers_digest(model: nn.Module) -> str:
    """sha256 of every buffer's bytes (BatchNorm's running statistics and step counts), in a fixed order."""
    return _digest(model.named_buffers())


def average_buffers(model: nn.Module, sum_across_ranks: Callable[[torch.Tensor], object], world_size: int) -> None:
    """Every floating-point buffer (BatchNorm's running mean and variance) becomes its average over the
    ranks: one all-reduce of them all, flattened. `sum_across_ranks` sums a tensor in place.

    Why: the replicas' parameters are bitwise equal after every step, but their running statistics
    are not. Each rank's BatchNorm updates them from its own batches (DDP broadcasts rank 0's at
    the start of each forward, and the forward then moves each rank's its own way; Horovod never
    syncs them), so at the end of an epoch every rank holds a different model for evaluation. Each
    would count its shard of the test set with its own, and no one model scores the accuracy the
    lab reports. Averaging (as timm's distribute_bn does) rather than broadcasting rank 0's keeps
    what every rank saw: an estimate over world_size times as many batches. Integer buffers (the
    step counts) are equal on every rank already: every rank ran the same number of forwards.
    """
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    if not buffers:
        return
    with torch.no_grad():
        flat = torch.cat([b.reshape(-1).to(torch.float32) for b in buffers])
        sum_across_ranks(flat)
        flat /= world_size
        offset = 0
        for b in buffers:
            b.copy_(flat[offset:offset + b.numel()].view(b.shape))
            offset += b.numel()


def order_fingerprint(indices: Sequence[int]) -> dict[str, Any]:
    data = torch.as_tensor(list(indices), dtype=torch.int64).numpy().tobytes()
    return {"count": len(indices), "sha256": hashlib.sha256(data).hexdigest()}


def replica_report(rank: int, model: nn.Module, orders: list[list[int]], clock: TrainClock,
                   device: torch.device) -> dict[str, Any]:
    """What one rank of a data-parallel run tells rank 0 at the end, for check_replicas."""
    return {"rank": rank, "device": str(device), "params_sha256": params_digest(model),
            "buffers_sha256": buffers_digest(model), "img_per_sec": clock.img_per_sec, "orders": orders}


def check_replicas(record: Any, reports: list[dict[str, Any]], train_images: int, global_batch: int,
                   first_epoch: int) -> float | None:
    """The end-of-run checks of a data-parallel run, from every rank's replica_report.

    reports[rank]["orders"][e] lists the sample indices that rank trained on in epoch first_epoch + e,
    in order. Writes the checks, the per-rank details and, per epoch and rank, a fingerprint of the
    sample order (count and sha256), so a grader can compare orders from the record alone.
    Returns the whole run's img_per_sec: the sum of the ranks' own rates.
    """
    orders = [report.pop("orders") for report in reports]
    record.ranks = reports
    digests = {report["params_sha256"] for report in reports}
    record.check("params_identical", len(digests) == 1, distinct_digests=len(digests), world_size=len(reports))
    buffers = {report["buffers_sha256"] for report in reports}
    record.check("buffers_identical", len(buffers) == 1, distinct_digests=len(buffers), world_size=len(reports))

    epochs = len(orders[0])
    record.metrics["sample_order"] = [
        {"epoch": first_epoch + e, "ranks": [order_fingerprint(rank_orders[e]) for rank_orders in orders]}
        for e in range(epochs)]
    repeated, covered = [], []
    for e in range(epochs):
        listed = sum(len(rank_orders[e]) for rank_orders in orders)
        distinct = len(set().union(*(rank_orders[e] for rank_orders in orders)))
        repeated.append(listed - distinct)  # 0 when no sample was trained on twice in the epoch
        covered.append(distinct)
    record.check("shards_disjoint", all(r == 0 for r in repeated), repeated_samples_per_epoch=repeated)
    # Only whole global batches are trained on (drop_last): fewer than one global batch is left out.
    expected = train_images // global_batch * global_batch
    record.check("shards_cover", all(c == expected for c in covered), distinct_samples_per_epoch=covered,
                 expected=expected, train_images=train_images)
    if epochs >= 2:  # with one epoch there is nothing to compare, and no check is claimed
        repeating = [rank for rank, rank_orders in enumerate(orders)
                     if any(rank_orders[e] == rank_orders[e - 1] for e in range(1, epochs))]
        record.check("order_changes_per_epoch", not repeating, epochs_compared=epochs,
                     ranks_repeating_an_order=repeating)
    rates = [report["img_per_sec"] for report in reports]
    return sum(rates) if all(rates) else None
