"""The step model behind `distlab predict`: data-parallel step time from a step and an interconnect.

A prediction from two measurements, with the alpha-beta model of collectives:

- a step: compute seconds per sample c (forward, backward and optimizer of one rank, no gradient
  sync), gradient bytes G and the per-rank batch b: from a `distlab scale` study (--scale DIR: its
  world-size-1 row, step_seconds_no_sync / per_rank_batch, and the records' allreduce_bytes), or
  from the workloads of harness/interconnects.toml (FLOPs per sample / (peak x utilisation));
- an interconnect: latency alpha (seconds per message step) and bus bandwidth B (beta = 1 / B,
  seconds per byte): fitted to an allreduce_bench record's per-size times (--bench RECORD), or the
  published nccl-tests figures of harness/interconnects.toml (--cluster), each with its source.

The cost of one collective of n bytes among p ranks (nothing at p = 1):

    ring all-reduce            2 (p-1) alpha + 2 (p-1)/p n beta     reduce-scatter, then all-gather: p-1 steps each
    tree all-reduce            2 log2(p) alpha + 2 n beta           NCCL's double binary tree: a pipelined reduce up
                                                                    and broadcast down; every rank sends and receives
                                                                    about n in each half, in log2(p) hops
    ring all-gather            (p-1) alpha + (p-1)/p n beta         n: the gathered (whole) size
    ring reduce-scatter        (p-1) alpha + (p-1)/p n beta         n: the size before scattering

(log2 rounded up.) The all-reduce of a bucket costs the cheaper of ring and tree, as NCCL's tuner
picks per size: the ring wins on bandwidth at a few ranks, the tree on latency at many.

DDP (weak scaling: b samples per rank at every p). Compute t = b c, a third forward and optimizer,
two thirds backward (the backward costs about twice the forward's FLOPs). The gradients become
ready evenly through the backward and go out in k = ceil(G / bucket) buckets (bucket: DDP's
bucket_cap_mb, 25 MiB); bucket i (of G_i bytes) is ready at t/3 + (2t/3) i/k, and is all-reduced
when it is ready and the previous bucket is done (one communication stream):

    end_0 = 0,   end_i = max(ready_i, end_{i-1}) + T_allreduce(G_i, p),   step = max(t, end_k)

which is the bucket overlap: only what is still being sent when the backward ends is waited for,
at least the last bucket's all-reduce. Without overlap (every bucket waits for the backward:
what a CPU host gives, whose cores are all busy computing, labs/SCALING.md) step = t + sum_i T(G_i).
A host can give part of it: with overlap h in [0, 1],
    step = t + h x exposed_with_overlap + (1 - h) x exposed_without
h = 1 on GPUs (NCCL runs beside the compute kernels); on a CPU host it is calibrated (below).

FSDP (FULL_SHARD, U units, prefetching the next unit's parameters): per step every rank
all-gathers each unit's parameters for the forward, again for the backward, and reduce-scatters
its gradients: 3 collectives of (p-1)/p P bytes each (P = the parameters' bytes, taken = G), 1.5x
DDP's 2 (p-1)/p. With a unit's collective overlapping the neighbouring unit's compute:

    forward  = T_ag + (U-1) max(T_ag, f) + f                   f = forward / U, T_ag = all-gather(P/U)
    backward = T_ag + (U-1) max(T_ag + T_rs, g) + g + T_rs     g = backward / U, T_rs = reduce-scatter(P/U)

and the host's overlap h weighs that against no overlap at all (compute + U (2 T_ag + T_rs)), as for DDP.

Ranks that share a host's cores (a CPU host, ranks x threads > cores) take turns: compute and
communication both slow by s = max(1, p threads / cores); two or more ranks side by side also
share memory bandwidth and caches, which slows compute by r (measured: the no-sync step at 2 ranks
over 1). On a cluster every rank has its own device: s = r = 1.
Throughput = p b / step; weak-scaling efficiency = step(1) / step(p).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from harness.usage import UsageError

BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb default, 25 MiB
FORWARD_SHARE = 1 / 3  # forward (and optimizer) of a step's compute; the backward is the other two thirds


@dataclass(frozen=True)
class Link:
    """An interconnect in the alpha-beta model: alpha seconds per message step, beta seconds per byte."""

    name: str
    alpha: float
    beta: float
    source: str = ""

    @property
    def busbw_gbps(self) -> float:
        return 1 / self.beta / 1e9 if self.beta else math.inf


@dataclass(frozen=True)
class Step:
    """One rank's step: compute seconds per sample, gradient bytes, samples per rank per step."""

    name: str
    compute_per_sample: float
    grad_bytes: float
    per_rank_batch: int
    units: int = 4  # FSDP units
    source: str = ""


@dataclass
class Host:
    """How the ranks of a prediction sit: sharing `cores` of one host (CPU), or each on its own device."""

    cores: int | None = None  # None: one device per rank, no sharing
    threads: int = 1
    overlap: float = 1.0  # h: the share of DDP's bucket overlap the host gives (1 on GPUs)
    side_by_side: float = 1.0  # compute of 2+ ranks on one host over one rank's alone (memory bandwidth, caches)

    def contention(self, p: int) -> float:
        return 1.0 if self.cores is None else max(1.0, p * self.threads / self.cores)

    def compute_factor(self, p: int) -> float:
        return self.contention(p) * (self.side_by_side if p > 1 else 1.0)


# ------------------------------------------------------------------------------------- cost models


def log2_ceil(p: int) -> int:
    return max(0, math.ceil(math.log2(p)))


def ring_allreduce(n: float, p: int, link: Link) -> float:
    return 0.0 if p == 1 else 2 * (p - 1) * link.alpha + 2 * (p - 1) / p * n * link.beta


def tree_allreduce(n: float, p: int, link: Link) -> float:
    return 0.0 if p == 1 else 2 * log2_ceil(p) * link.alpha + 2 * n * link.beta


def ring_allgather(n: float, p: int, link: Link) -> float:
    return 0.0 if p == 1 else (p - 1) * link.alpha + (p - 1) / p * n * link.beta


ring_reduce_scatter = ring_allgather  # the same volume and steps, run the other way


ALGORITHMS = {"ring": ring_allreduce, "tree": tree_allreduce}


def allreduce(n: float, p: int, link: Link, algorithm: str = "best") -> float:
    if algorithm == "best":
        return min(ring_allreduce(n, p, link), tree_allreduce(n, p, link))
    return ALGORITHMS[algorithm](n, p, link)


def buckets(grad_bytes: float, bucket_bytes: float) -> list[float]:
    full, rest = divmod(grad_bytes, bucket_bytes)
    return [bucket_bytes] * int(full) + ([rest] if rest else [])


def ddp_step(step: Step, p: int, link: Link, host: Host, algorithm: str = "best",
             bucket_bytes: float = BUCKET_BYTES) -> dict[str, float]:
    """Seconds of one DDP step at p ranks, the compute in it and the communication waited for."""
    s = host.contention(p)
    compute = step.compute_per_sample * step.per_rank_batch * host.compute_factor(p)
    forward, backward = compute * FORWARD_SHARE, compute * (1 - FORWARD_SHARE)
    parts = buckets(step.grad_bytes, bucket_bytes)
    costs = [allreduce(n, p, link, algorithm) * s for n in parts]
    end = 0.0
    for i, cost in enumerate(costs, start=1):
        end = max(forward + backward * i / len(parts), end) + cost
    overlapped = max(compute, end) - compute
    serial = sum(costs)
    exposed = host.overlap * overlapped + (1 - host.overlap) * serial
    return {"step": compute + exposed, "compute": compute, "comm_exposed": exposed, "comm_total": serial}


def fsdp_step(step: Step, p: int, link: Link, host: Host) -> dict[str, float]:
    """Seconds of one FSDP (FULL_SHARD, prefetch) step at p ranks; P = the gradient bytes."""
    s = host.contention(p)
    compute = step.compute_per_sample * step.per_rank_batch * host.compute_factor(p)
    units = step.units
    f, g = compute * FORWARD_SHARE / units, compute * (1 - FORWARD_SHARE) / units
    gather = ring_allgather(step.grad_bytes / units, p, link) * s
    scatter = ring_reduce_scatter(step.grad_bytes / units, p, link) * s
    forward = gather + (units - 1) * max(gather, f) + f
    backward = gather + (units - 1) * max(gather + scatter, g) + g + scatter
    serial = units * (2 * gather + scatter)
    exposed = host.overlap * (forward + backward - compute) + (1 - host.overlap) * serial  # h as for DDP
    return {"step": compute + exposed, "compute": compute, "comm_exposed": exposed, "comm_total": serial}


def table_rows(step: Step, links: dict[int, Link] | Link, host: Host, ranks: list[int]) -> list[dict[str, Any]]:
    """Per rank count: DDP (ring, tree, the better) and FSDP step seconds, img/s and efficiency."""
    def link_at(p: int) -> Link:
        if isinstance(links, Link):
            return links
        return links[min(k for k in links if k >= p)] if any(k >= p for k in links) else links[max(links)]

    base = {"ddp": ddp_step(step, 1, link_at(1), host)["step"], "fsdp": fsdp_step(step, 1, link_at(1), host)["step"]}
    rows = []
    for p in ranks:
        link = link_at(p)
        ring, tree = (ddp_step(step, p, link, host, a)["step"] for a in ("ring", "tree"))
        ddp, fsdp = ddp_step(step, p, link, host), fsdp_step(step, p, link, host)
        rows.append({
            "ranks": p, "link": link.name, "ddp_ring_step_s": ring, "ddp_tree_step_s": tree,
            "ddp_step_s": ddp["step"], "ddp_comm_exposed_s": ddp["comm_exposed"],
            "ddp_samples_per_s": p * step.per_rank_batch / ddp["step"], "ddp_efficiency": base["ddp"] / ddp["step"],
            "fsdp_step_s": fsdp["step"], "fsdp_samples_per_s": p * step.per_rank_batch / fsdp["step"],
            "fsdp_efficiency": base["fsdp"] / fsdp["step"],
        })
    return rows


# --------------------------------------------------------------------------------- measured inputs


def fit_link(rows: list[tuple[int, float]], p: int, name: str = "measured") -> Link:
    """alpha and beta of the ring all-reduce model fitted to (bytes, seconds) measured at p ranks.

    t = a + b n with a = 2 (p-1) alpha and b = 2 (p-1)/p beta, by least squares on relative error
    (weights 1/t^2): the small sizes, all latency, fix a; the large ones, all bandwidth, fix b;
    neither drowns the other, as an unweighted fit lets the largest times decide everything.
    """
    if p < 2:
        raise UsageError(f"the bench ran at world size {p}: one rank measures no communication; run it at 2 or more")
    if len(rows) < 2:
        raise UsageError("the bench record has fewer than 2 sizes: a line needs two points; run it over a sweep")
    weighted = [(1 / t**2, n, t) for n, t in rows]
    sw = sum(w for w, _, _ in weighted)
    sx, sy = sum(w * n for w, n, _ in weighted), sum(w * t for w, _, t in weighted)
    sxx, sxy = sum(w * n * n for w, n, _ in weighted), sum(w * n * t for w, n, t in weighted)
    slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    intercept = (sy - slope * sx) / sw
    return Link(name, alpha=max(0.0, intercept) / (2 * (p - 1)), beta=slope * p / (2 * (p - 1)))
