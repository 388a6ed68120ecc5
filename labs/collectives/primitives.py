"""The collective primitives, one row each: the only place that knows what a primitive does.

A row says how to call the primitive on each library (torch.distributed for gloo and nccl,
mpi4py, Horovod), how the buffers are laid out, what each rank holds before and after it, and
its bus-bandwidth factor (see labs/PERFORMANCE.md). The collectives lab and the bandwidth
benchmark both run the rows through one loop; neither knows a primitive by name.

Sizes follow nccl-tests: `count` is the length of the larger buffer (the all-gather output,
the reduce-scatter input), so algbw = count * element size / time for every primitive.

Values are small integers, exact in float16 and bfloat16 too, so results are compared with ==,
not a tolerance (avg with a world size that is not a power of two is the one exception: 1/n is
rounded). Element i of rank r holds
  label(r, i) = 100 (r + 1) + i             data movement, min and max: you can read who sent it
  1 + w(i) on the rank that owns i, else 1  sum and avg: the sum is n + w(i), w(i) = i mod 61
  2 on the owner where w(i) is odd, else 1  prod: the product is 1 or 2, never overflows
The owner of element i is rank i mod n. 61 is prime, so the expected chunks of a reduce-scatter
differ unless a chunk is a multiple of 61 elements long: a chunk sent to the wrong rank shows.

Support was established by running every combination on this project's stack (torch 2.14.1,
Horovod 0.28.1, Open MPI 5.0 with mpi4py 4.1), not from documentation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

ROOT = 0  # broadcast sends from it, reduce delivers to it
MODES = ("out-of-place", "in-place")
OPS = ("sum", "prod", "min", "max", "avg")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
DTYPE_ALIASES = {"float": "float32", "half": "float16", "bf16": "bfloat16", "double": "float64"}  # nccl-tests' names
LIBRARY = {"gloo": "torch", "nccl": "torch", "mpi": "mpi", "horovod": "horovod"}  # backend -> what makes the calls
PERIOD = 61  # prime: see the module docstring
BARRIER_DELAY_S = 0.2  # the last rank arrives this late; everyone else must wait for it

Run = Callable[[], torch.Tensor]  # performs the primitive once, returns the tensor holding this rank's result


@dataclass(frozen=True)
class Ctx:
    rank: int
    size: int
    op: Any  # the library's own reduction op object, None for data movement


Binder = Callable[[Ctx, torch.Tensor, torch.Tensor], Run]  # (ctx, send, recv) -> run
Limit = Callable[[str, "str | None", int], "str | None"]  # (dtype, op, world size) -> why not, or None


def _any(dtype: str, op: str | None, size: int) -> None:
    return None


@dataclass(frozen=True)
class Impl:
    """How one library performs a primitive: a binder per mode, or the reason it cannot."""

    out_of_place: Binder | str
    in_place: Binder | str
    limit: Limit = _any


def na(reason: str) -> Impl:
    return Impl(reason, reason)


def one_form(binder: Binder) -> Impl:
    return Impl(binder, binder)


@dataclass(frozen=True)
class Primitive:
    name: str
    after: str  # what every rank holds afterwards, in words, for the teaching mode
    # "same": send and recv are count long; "split": the same, cut in n chunks; "gather": send is a 1/n chunk
    # of recv (in place: a view of it); "scatter": recv is a 1/n chunk of send; "none": no data (recv is 1 flag)
    layout: str
    reduces: bool  # takes a reduction op
    modes: tuple[str, ...]  # the forms it comes in: out-of-place and in-place, or one ("-") for the barrier
    bus_factor: Callable[[int], float] | None  # busbw = algbw * bus_factor(world size); None: moves no data
    expected: Callable[[int, int, int, str | None, torch.Tensor], torch.Tensor | None]  # rank, n, chunk, op, index
    torch: Impl
    mpi: Impl
    horovod: Impl
    rooted: bool = False  # rank ROOT is special: it sends (broadcast) or receives (reduce) for everyone


# ---- values --------------------------------------------------------------------------------------------------


def label(rank: int | torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return 100.0 * (rank + 1) + index


def rank_input(op: str | None, rank: int, size: int, index: torch.Tensor) -> torch.Tensor:
    if op in (None, "min", "max"):
        return label(rank, index)
    owned = (index % size == rank).double()
    if op == "prod":
        return 1.0 + owned * (index % PERIOD % 2)
    return 1.0 + owned * (index % PERIOD)  # sum, avg


def reduced(op: str | None, size: int, index: torch.Tensor) -> torch.Tensor:
    """The reduction over all ranks of rank_input, in closed form."""
    return {
        "sum": lambda: size + index % PERIOD,
        "avg": lambda: (size + index % PERIOD) / size,
        "prod": lambda: 1.0 + index % PERIOD % 2,
        "min": lambda: label(0, index),
        "max": lambda: label(size - 1, index),
    }[op]()


# ---- the libraries' calls ------------------------------------------------------------------------------------
# Binders resolve everything once, so the returned run() is the bare library call: the benchmark times it.


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def _horovod() -> Any:
    import horovod.torch as hvd

    return hvd


def _world() -> Any:
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _np(tensor: torch.Tensor) -> Any:
    # numpy has no bfloat16: moving the 16-bit patterns as int16 is exact, reducing them would be nonsense
    # (the mpi rows refuse bfloat16 reductions for that reason).
    return (tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor).numpy()


def _peers(ctx: Ctx) -> tuple[int, int]:
    """Point-to-point ring: send to the next rank, receive from the previous one."""
    return (ctx.rank + 1) % ctx.size, (ctx.rank - 1) % ctx.size


def _returning(call: Callable[[], Any], result: torch.Tensor) -> Run:
    def run() -> torch.Tensor:
        call()
        return result

    return run


def _torch(*names: str, out_of_place: bool = False, **fixed: Any) -> Binder:
    """dist.name(tensor, ...) in place, or dist.name(recv, send, ...) out of place; the first name torch has."""

    def bind(ctx: Ctx, send: torch.Tensor, recv: torch.Tensor) -> Run:
        dist = _dist()
        call = next(getattr(dist, name) for name in names if hasattr(dist, name))
        kwargs = {**fixed, **({"op": ctx.op} if ctx.op is not None else {})}
        tensors = (recv, send) if out_of_place else (recv,)
        return _returning(partial(call, *tensors, **kwargs), recv)

    return bind


def _torch_send_recv(ctx: Ctx, send: torch.Tensor, recv: torch.Tensor) -> Run:
    dist, (to, frm) = _dist(), _peers(ctx)

    def run() -> torch.Tensor:
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, to), dist.P2POp(dist.irecv, recv, frm)]):
            work.wait()
        return recv

    return run


def _mpi(method: str, *, in_place: bool = False, **fixed: Any) -> Binder:
    """world.Method(sendbuf, recvbuf, ...), or world.Method(MPI.IN_PLACE, buffer, ...)."""

    def bind(ctx: Ctx, send: torch.Tensor, recv: torch.Tensor) -> Run:
        from mpi4py import MPI

        call = getattr(_world(), method)
        kwargs = {**fixed, **({"op": ctx.op} if ctx.op is not None else {})}
        if not in_place:
            return _returning(partial(call, _np(send), _np(recv), **kwargs), recv)
        # In place, MPI works on the whole (larger) buffer and leaves a smaller result at its start:
        # a reduce-scatter's chunk lands at offset 0, not at chunk r where nccl-tests would put it.
        whole = send if send.numel() > recv.numel() else recv
        return _returning(partial(call, MPI.IN_PLACE, _np(whole), **kwargs), whole[: recv.numel()])

    return bind


def _mpi_reduce_in_place(ctx: Ctx, send: torch.Tensor, recv: torch.Tensor) -> Run:
    from mpi4py import MPI

    world, buf = _world(), _np(recv)
    if ctx.rank == ROOT:
        return _returning(partial(world.Reduce, MPI.IN_PLACE, buf, op=ctx.op, root=ROOT), recv)
    return _returning(partial(world.Reduce, buf, None, op=ctx.op, root=ROOT), recv)


def _mpi_bcast(ctx: Ctx, send: torch.Tensor, recv: torch.Tensor) -> Run:
    return _returning(partial(_world().Bcast, _np(recv), root=ROOT), recv)


def _mpi_send_recv(ctx: Ctx, send: torch.Tensor, recv: torch.Tensor) -> Run:
    world, (to, frm) = _world(), _peers(ctx)
    return _returning(partial(world.Sendrecv, _np(send), dest=to, recvbuf=_np(recv), source=frm), recv)


def _mpi_send_recv_replace(ctx: Ctx, send: torch.Tensor, recv: torch.Tensor) -> Run:
    world, (to, frm) = _world(), _peers(ctx)
    return _returning(partial(world.Sendrecv_replace, _np(recv), dest=to, source=frm), recv)


def _hvd(method: str, **fixed: Any) -> Binder:
    """hvd.method(tensor, ...): returns a new tensor, or (method ending in _) the tensor it rewrote."""

    def bind(ctx: Ctx, send: torch.Tensor, recv: torch.Tensor) -> Run:
        kwargs = {**fixed, **({"op": ctx.op} if ctx.op is not None else {})}
        return partial(getattr(_horovod(), method), recv if method.endswith("_") else send, **kwargs)

    return bind


def observed_barrier(library: Callable[[], Any], name: str) -> Binder:
    """A barrier has no data to check, so observe what it promises instead.

    The last rank arrives BARRIER_DELAY_S late; every other rank times its own wait (no clocks are
    compared across hosts). The result is 1 where the rank waited at least half the delay (or is the
    late rank), 0 where it left early: a barrier that does not wait gets 0s, which the check counts.
    """

    def bind(ctx: Ctx, send: torch.Tensor, recv: torch.Tensor) -> Run:
        call = getattr(library(), name)
        late = ctx.rank == ctx.size - 1

        def run() -> torch.Tensor:
            if late:
                time.sleep(BARRIER_DELAY_S)
            start = time.perf_counter()
            call()
            recv.fill_(1.0 if late or time.perf_counter() - start >= BARRIER_DELAY_S / 2 else 0.0)
            return recv

        return run

    return bind


# ---- reasons a library cannot do something (each one seen on this stack) -------------------------------------

TORCH_ONE_BUFFER = "torch.distributed's {} has one tensor, rewritten in place: there is no out-of-place form"
MPI_ONE_BUFFER = "MPI_Bcast has one buffer: the root sends from it, the others receive into it"
HVD_NO_IN_PLACE = "Horovod's {} always returns a new tensor: there is no in-place form"
HVD_NO_REDUCE = "Horovod has no reduce to one rank: use allreduce"
HVD_NO_P2P = "Horovod has no point-to-point send/recv"
NO_PEER = "point-to-point needs at least 2 ranks: torch.distributed refuses to send to its own rank"
ALIAS_A2A = ("torch.distributed's all_to_all_single has no in-place form: with the same tensor as input and "
             "output gloo returned wrong values here")
TORCH_P2P_IN_PLACE = "torch.distributed has no send-receive-replace: isend and irecv need two tensors"


def _mpi_reduction(dtype: str, op: str | None, size: int) -> str | None:
    if op == "avg":
        return "MPI has no average op: sum, then divide by the world size yourself"
    if dtype == "bfloat16":
        return "numpy and MPI have no bfloat16 type, so MPI cannot reduce it (data movement works bit for bit)"
    return None


def _hvd_scatter(dtype: str, op: str | None, size: int) -> str | None:
    if op not in ("sum", "avg"):
        return "Horovod 0.28 reducescatter supports only sum and avg (HorovodInternalError otherwise)"
    return None


def _needs_peer(dtype: str, op: str | None, size: int) -> str | None:
    return NO_PEER if size < 2 else None


# The reason a whole library refuses a dtype or op, whatever the primitive.
def library_limit(library: str, dtype: str | None, op: str | None) -> str | None:
    if library == "horovod" and dtype == "bfloat16":
        return "Horovod 0.28 rejects bfloat16 tensors (ValueError: Tensor type torch.BFloat16Tensor is not supported)"
    return None


# ---- THE table -----------------------------------------------------------------------------------------------


def _all_n(n: int) -> float:
    return (n - 1) / n


# torch 2.14 renamed all_gather_into_tensor and reduce_scatter_tensor; the old names still work before it.
ALL_GATHER = ("all_gather_single", "all_gather_into_tensor")
REDUCE_SCATTER = ("reduce_scatter_single", "reduce_scatter_tensor")

PRIMITIVES: tuple[Primitive, ...] = (
    Primitive(
        "broadcast", f"every rank holds rank {ROOT}'s tensor", "same", False, MODES, lambda n: 1.0,
        lambda rank, n, c, op, i: label(ROOT, i),
        torch=Impl(TORCH_ONE_BUFFER.format("broadcast"), _torch("broadcast", src=ROOT)),
        mpi=Impl(MPI_ONE_BUFFER, _mpi_bcast),
        horovod=Impl(_hvd("broadcast", root_rank=ROOT), _hvd("broadcast_", root_rank=ROOT)),
        rooted=True,
    ),
    Primitive(
        "reduce", f"rank {ROOT} holds the element-wise reduction of all tensors; the others' are unspecified",
        "same", True, MODES, lambda n: 1.0,
        lambda rank, n, c, op, i: reduced(op, n, i) if rank == ROOT else None,
        torch=Impl(TORCH_ONE_BUFFER.format("reduce"), _torch("reduce", dst=ROOT)),
        mpi=Impl(_mpi("Reduce", root=ROOT), _mpi_reduce_in_place, _mpi_reduction),
        horovod=na(HVD_NO_REDUCE),
        rooted=True,
    ),
    Primitive(
        "all_reduce", "every rank holds the element-wise reduction of all tensors", "same", True, MODES,
        lambda n: 2 * (n - 1) / n,
        lambda rank, n, c, op, i: reduced(op, n, i),
        torch=Impl(TORCH_ONE_BUFFER.format("all_reduce"), _torch("all_reduce")),
        mpi=Impl(_mpi("Allreduce"), _mpi("Allreduce", in_place=True), _mpi_reduction),
        horovod=Impl(_hvd("allreduce"), _hvd("allreduce_")),
    ),
    Primitive(
        "all_gather", "every rank holds all tensors, concatenated in rank order", "gather", False, MODES, _all_n,
        lambda rank, n, c, op, i: label(i // c, i % c),
        torch=Impl(_torch(*ALL_GATHER, out_of_place=True), _torch(*ALL_GATHER, out_of_place=True)),
        mpi=Impl(_mpi("Allgather"), _mpi("Allgather", in_place=True)),
        horovod=Impl(_hvd("allgather"), HVD_NO_IN_PLACE.format("allgather")),
    ),
    Primitive(
        "reduce_scatter", "rank r holds chunk r of the element-wise reduction", "scatter", True, MODES, _all_n,
        lambda rank, n, c, op, i: reduced(op, n, rank * c + i),
        torch=Impl(_torch(*REDUCE_SCATTER, out_of_place=True), _torch(*REDUCE_SCATTER, out_of_place=True)),
        mpi=Impl(_mpi("Reduce_scatter_block"), _mpi("Reduce_scatter_block", in_place=True), _mpi_reduction),
        horovod=Impl(_hvd("reducescatter"), HVD_NO_IN_PLACE.format("reducescatter"), _hvd_scatter),
    ),
    Primitive(
        "barrier", f"nobody leaves before the last rank arrives ({BARRIER_DELAY_S} s late); 1 = waited for it",
        "none", False, ("-",), None,
        lambda rank, n, c, op, i: torch.ones_like(i),
        torch=one_form(observed_barrier(_dist, "barrier")),
        mpi=one_form(observed_barrier(_world, "Barrier")),
        horovod=one_form(observed_barrier(_horovod, "barrier")),
    ),
    Primitive(
        "all_to_all", "rank r holds chunk r of every rank's tensor, in rank order", "split", False, MODES, _all_n,
        lambda rank, n, c, op, i: label(i // c, rank * c + i % c),
        torch=Impl(_torch("all_to_all_single", out_of_place=True), ALIAS_A2A),
        mpi=Impl(_mpi("Alltoall"), _mpi("Alltoall", in_place=True)),
        horovod=Impl(_hvd("alltoall"), HVD_NO_IN_PLACE.format("alltoall")),
    ),
    Primitive(
        "send_recv", "each rank holds the tensor of the previous rank (a ring: r sends to r + 1)", "same", False,
        MODES, lambda n: 1.0,
        lambda rank, n, c, op, i: label((rank - 1) % n, i),
        torch=Impl(_torch_send_recv, TORCH_P2P_IN_PLACE, _needs_peer),
        mpi=Impl(_mpi_send_recv, _mpi_send_recv_replace),
        horovod=na(HVD_NO_P2P),
    ),
)


def lookup(name: str) -> Primitive:
    """Accept all_reduce, all-reduce and allreduce alike (nccl-tests and Horovod spell it without a separator)."""
    wanted = name.lower().replace("-", "_")
    for primitive in PRIMITIVES:
        if wanted in (primitive.name, primitive.name.replace("_", "")):
            return primitive
    raise KeyError(name)


def dtype_name(name: str) -> str:
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise KeyError(name)
    return name


# ---- one trial: buffers, inputs, the call, the check ---------------------------------------------------------


def unsupported(primitive: Primitive, backend: str, mode: str, dtype: str | None, op: str | None,
                size: int) -> str | None:
    """Why this combination cannot run here, or None. Every rank gets the same answer."""
    library = LIBRARY[backend]
    impl: Impl = getattr(primitive, library)
    binder = impl.in_place if mode == "in-place" else impl.out_of_place
    if isinstance(binder, str):
        return binder
    reason = library_limit(library, dtype, op) or impl.limit(dtype, op, size)
    if reason is None and op in ("sum", "avg"):
        # Our sums are exact only while every partial sum is an integer the dtype holds exactly.
        exact = int(2 / torch.finfo(DTYPES[dtype]).eps)
        if size + PERIOD - 1 > exact:
            reason = f"sums reach {size + PERIOD - 1}, beyond {exact}, the largest integer range {dtype} holds exactly"
    return reason


def native_op(library: str, op: str | None) -> Any:
    if op is None:
        return None
    if library == "torch":
        return getattr(_dist().ReduceOp, {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX",
                                          "avg": "AVG"}[op])
    if library == "mpi":
        from mpi4py import MPI

        return {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}[op]
    hvd = _horovod()
    return {"sum": hvd.Sum, "prod": hvd.Product, "min": hvd.Min, "max": hvd.Max, "avg": hvd.Average}[op]


def round_count(primitive: Primitive, count: int, size: int) -> int:
    """Chunked primitives need a count that splits evenly into world-size chunks; round down like nccl-tests."""
    if primitive.layout == "none":
        return 1
    if primitive.layout in ("gather", "scatter", "split"):
        return count // size * size
    return count


CHUNK = 1 << 20  # fill and check big buffers a slice at a time, so float64 temporaries stay small


def _fill(buf: torch.Tensor, values: Callable[[torch.Tensor], torch.Tensor], start: int = 0) -> None:
    for lo in range(0, buf.numel(), CHUNK):
        index = torch.arange(start + lo, start + min(lo + CHUNK, buf.numel()), dtype=torch.float64, device=buf.device)
        buf[lo: lo + index.numel()] = values(index).to(buf.dtype)


@dataclass
class Trial:
    """One primitive, ready to run: run() performs it, reset() rewrites the inputs, wrong() checks a result."""

    primitive: Primitive
    send: torch.Tensor
    recv: torch.Tensor
    run: Run
    reset: Callable[[], None]
    wrong: Callable[[torch.Tensor], tuple[int, int]]  # result -> (wrong elements, checked elements)


def prepare(primitive: Primitive, backend: str, mode: str, dtype: str | None, op: str | None, count: int,
            rank: int, size: int, device: torch.device) -> Trial:
    """Buffers laid out for this primitive and mode, inputs written, the call bound. dtype None: float32."""
    library = LIBRARY[backend]
    impl: Impl = getattr(primitive, library)
    binder = impl.in_place if mode == "in-place" else impl.out_of_place
    assert not isinstance(binder, str), "call unsupported() first"
    torch_dtype, in_place = DTYPES[dtype or "float32"], mode == "in-place"
    chunk = count // size
    empty = lambda n: torch.empty(n, dtype=torch_dtype, device=device)  # noqa: E731
    if primitive.layout == "gather":
        recv = empty(count)
        send = recv[rank * chunk: (rank + 1) * chunk] if in_place else empty(chunk)
    elif primitive.layout == "scatter":
        send = empty(count)
        recv = send[rank * chunk: (rank + 1) * chunk] if in_place else empty(chunk)
    elif primitive.layout == "none":
        send, recv = empty(0), empty(1)
    else:
        send = empty(count)
        recv = send if in_place else empty(count)

    def reset() -> None:
        recv.fill_(-1.0)  # no expected value is negative: a call that writes nothing is caught
        _fill(send, lambda index: rank_input(op, rank, size, index))

    # avg is sum * (1/n) somewhere inside every library: exact when n is a power of two, else rounded.
    tolerance = 0.0 if op != "avg" or size & (size - 1) == 0 else size * torch.finfo(torch_dtype).eps

    def wrong(result: torch.Tensor) -> tuple[int, int]:
        result, bad, checked = result.reshape(-1), 0, 0
        for lo in range(0, result.numel(), CHUNK):
            index = torch.arange(lo, min(lo + CHUNK, result.numel()), dtype=torch.float64, device=result.device)
            expected = primitive.expected(rank, size, chunk, op, index)
            if expected is None:
                return 0, 0
            expected = expected.to(torch_dtype).double()
            got = result[lo: lo + index.numel()].double()
            ok = got == expected if tolerance == 0 else (got - expected).abs() <= tolerance * expected.abs()
            bad, checked = bad + int((~ok).sum()), checked + index.numel()
        return bad, checked

    reset()
    return Trial(primitive, send, recv, binder(Ctx(rank, size, native_op(library, op)), send, recv), reset, wrong)
