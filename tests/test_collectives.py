"""The collectives lab and its table: semantics, exactness, n/a reasons, and checks that can fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import needs

from labs.collectives import collectives
from labs.collectives.primitives import (
    DTYPES,
    OPS,
    PRIMITIVES,
    Ctx,
    lookup,
    observed_barrier,
    prepare,
    rank_input,
    round_count,
    unsupported,
)

LAB = Path(collectives.__file__)
REDUCE = {"sum": lambda x: x.sum(0), "prod": lambda x: x.prod(0), "min": lambda x: x.amin(0),
          "max": lambda x: x.amax(0), "avg": lambda x: x.mean(0)}
DATA = [p for p in PRIMITIVES if p.name != "barrier"]


def brute_force(name: str, op: str | None, size: int, count: int) -> list[torch.Tensor | None]:
    """Each rank's result, from every rank's input and the textbook definition; no closed forms."""
    chunk = count // size
    send = chunk if name == "all_gather" else count
    inputs = [rank_input(op, r, size, torch.arange(send, dtype=torch.float64)) for r in range(size)]
    total = REDUCE[op](torch.stack(inputs)) if op else None
    return [{
        "broadcast": lambda r: inputs[0],
        "reduce": lambda r: total if r == 0 else None,
        "all_reduce": lambda r: total,
        "all_gather": lambda r: torch.cat(inputs),
        "reduce_scatter": lambda r: total[r * chunk:(r + 1) * chunk],
        "all_to_all": lambda r: torch.cat([inputs[j][r * chunk:(r + 1) * chunk] for j in range(size)]),
        "send_recv": lambda r: inputs[(r - 1) % size],
    }[name](r) for r in range(size)]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("primitive", DATA, ids=lambda p: p.name)
def test_expected_values_match_the_textbook_definition(primitive, size):
    count = round_count(primitive, 2 * 61 * size + 6, size)  # long enough to wrap the 61-element period
    for op in OPS if primitive.reduces else [None]:
        for rank, truth in enumerate(brute_force(primitive.name, op, size, count)):
            out = count // size if primitive.layout == "scatter" else count
            expected = primitive.expected(rank, size, count // size, op, torch.arange(out, dtype=torch.float64))
            if truth is None:
                assert expected is None
            else:
                torch.testing.assert_close(expected, truth, rtol=0, atol=1e-12, msg=f"{op} rank {rank}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_reductions_are_exact_in_low_precision_whatever_the_order(dtype, op):
    """Accumulating in the dtype itself, in rank order and reversed, gives exactly the expected value."""
    size, index = 8, torch.arange(400, dtype=torch.float64)
    inputs = [rank_input(op, r, size, index).to(DTYPES[dtype]) for r in range(size)]
    expected = lookup("all_reduce").expected(0, size, 0, op, index).to(DTYPES[dtype])
    for order in (inputs, inputs[::-1]):
        acc = order[0].clone()
        for x in order[1:]:
            acc = REDUCE[op](torch.stack([acc, x]))
        assert torch.equal(acc, expected)


def test_inputs_tell_ranks_and_positions_apart():
    index = torch.arange(8, dtype=torch.float64)
    assert rank_input(None, 0, 4, index).tolist() == [100, 101, 102, 103, 104, 105, 106, 107]
    assert rank_input(None, 3, 4, index)[0] == 400
    summed = sum(rank_input("sum", r, 4, index) for r in range(4))
    assert summed.tolist() == [4 + i for i in range(8)]


@pytest.mark.parametrize(("name", "backend", "mode", "dtype", "op", "size", "says"), [
    ("reduce", "horovod", "in-place", "float32", "sum", 2, "no reduce"),
    ("send_recv", "horovod", "out-of-place", "float32", None, 2, "point-to-point"),
    ("all_reduce", "horovod", "in-place", "bfloat16", "sum", 2, "bfloat16"),
    ("reduce_scatter", "horovod", "out-of-place", "float32", "max", 2, "only sum and avg"),
    ("all_gather", "horovod", "in-place", "float32", None, 2, "new tensor"),
    ("all_reduce", "mpi", "in-place", "float32", "avg", 2, "no average"),
    ("all_reduce", "mpi", "in-place", "bfloat16", "sum", 2, "bfloat16"),
    ("all_reduce", "gloo", "out-of-place", "float32", "sum", 2, "in place"),
    ("broadcast", "mpi", "out-of-place", "float32", None, 2, "one buffer"),
    ("all_to_all", "gloo", "in-place", "float32", None, 2, "wrong values"),
    ("send_recv", "gloo", "out-of-place", "float32", None, 1, "at least 2 ranks"),
    ("all_reduce", "gloo", "in-place", "bfloat16", "sum", 300, "exactly"),
])
def test_unsupported_combinations_say_why(name, backend, mode, dtype, op, size, says):
    assert says in unsupported(lookup(name), backend, mode, dtype, op, size)


@pytest.mark.parametrize(("name", "backend", "mode", "dtype", "op"), [
    ("all_reduce", "gloo", "in-place", "bfloat16", "avg"),
    ("reduce_scatter", "gloo", "in-place", "float16", "prod"),
    ("all_to_all", "mpi", "in-place", "bfloat16", None),  # moved bit for bit as int16
    ("send_recv", "mpi", "in-place", "float32", None),
    ("reduce_scatter", "horovod", "out-of-place", "float16", "avg"),
    ("broadcast", "horovod", "in-place", "float64", None),
])
def test_supported_combinations_are_not_refused(name, backend, mode, dtype, op):
    assert unsupported(lookup(name), backend, mode, dtype, op, 4) is None


def test_names_are_accepted_in_every_spelling():
    assert lookup("allreduce") is lookup("all-reduce") is lookup("ALL_REDUCE")
    with pytest.raises(KeyError):
        lookup("allreduce_sum")


def test_a_barrier_that_does_not_wait_is_caught():
    """The barrier check observes waiting: a no-op barrier lets rank 0 leave before the late rank arrives."""
    flag, no_op = torch.empty(1), SimpleNamespace(barrier=lambda: None)
    early = observed_barrier(lambda: no_op, "barrier")(Ctx(rank=0, size=2, op=None), flag, flag)()
    assert early.item() == 0.0
    wrong = prepare(lookup("barrier"), "gloo", "-", None, None, 1, 0, 2, torch.device("cpu")).wrong
    assert wrong(early) == (1, 1)
    assert wrong(torch.ones(1)) == (0, 1)


def test_a_call_that_writes_nothing_is_caught():
    """Outputs start at -1, so a primitive that returns without writing leaves every element wrong."""
    for name in ("all_gather", "all_to_all", "send_recv", "reduce_scatter"):
        trial = prepare(lookup(name), "gloo", "out-of-place", "float32", "sum", 8, 0, 2, torch.device("cpu"))
        assert trial.wrong(trial.recv) == (trial.recv.numel(), trial.recv.numel())


@pytest.mark.parametrize(("argv", "says"), [
    (["--primitives", "all_reduce,allgatherv"], "unknown 'allgatherv'"),
    (["--dtype", "int8"], "unknown 'int8'"),
    (["--op", "mean"], "unknown 'mean'"),
    (["--corrupt", "nothing"], "unknown 'nothing'"),
    (["--count", "0"], "--count must be at least 1"),
    (["--backend", "ucc"], "invalid choice: 'ucc'"),
])
def test_bad_input_is_a_one_line_error(run_main, argv, says):
    code, err = run_main(collectives.main, "collectives.py", *argv)
    assert code == 2
    assert says in err.splitlines()[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error when no GPU is visible")
def test_nccl_without_a_gpu_is_a_one_line_error():
    done = subprocess.run([sys.executable, str(LAB), "--backend", "nccl"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "error: backend nccl needs GPUs" in done.stderr


def elements_checked(name: str, size: int, count: int) -> int:
    """How many elements a run must have compared, summed over ranks: every one that has a defined value."""
    count = round_count(lookup(name), count, size)
    return {"reduce": count, "reduce_scatter": count, "barrier": size}.get(name, size * count)


# Gloo, the CPU backend of every lab, at 2 and 4 ranks (4 tells apart chunks, roots and peers that 2
# cannot); MPI and Horovod once each, one at 4 and one at 2: their calls, on inputs and expected values
# that primitives.py makes the same way for every backend.
@pytest.mark.integration
@pytest.mark.parametrize(("backend", "world_size"), [pytest.param(*case, marks=needs(None, case[0])) for case in [
    ("gloo", 2), ("gloo", 4), ("mpi", 4), ("horovod", 2)]])
def test_every_primitive_dtype_and_op_is_exact_or_na(distlab_run, backend, world_size):
    result = distlab_run("collectives", world_size, lab_args=["--dtype", "all", "--op", "all"], backend=backend)
    assert result.returncode == 0, result.output[-4000:]
    record = result.record
    assert record["status"] == "ok"
    count = record["metrics"]["count"]
    rows = {(r["primitive"], r["mode"], r["dtype"], r["op"]): r for r in record["metrics"]["results"]}
    # Every combination of the table is reported: run, or n/a with the table's reason. Nothing is skipped.
    wanted = {(p.name, mode, dtype if p.layout != "none" else None, op) for p in PRIMITIVES for mode in p.modes
              for dtype in DTYPES for op in (OPS if p.reduces else [None])}
    assert set(rows) == wanted
    ran = set()
    for (name, mode, dtype, op), row in rows.items():
        reason = unsupported(lookup(name), backend, mode, dtype, op, world_size)
        if reason:
            assert row["status"] == "n/a" and row["reason"] == reason
        else:
            assert row["status"] == "ok" and row["wrong"] == 0, row
            assert row["elements"] == elements_checked(name, world_size, count), row
            ran.add(name)
    lacking = {"horovod": {"reduce", "send_recv"}}.get(backend, set())
    assert ran == {p.name for p in PRIMITIVES} - lacking
    assert all(record["checks"][name]["passed"] for name in ran)
    # Teaching mode (on at these sizes) shows every rank's tensor before and after, on rank 0.
    assert f"rank {world_size - 1}: [{100 * world_size}" in result.output


@pytest.mark.integration
def test_a_corrupted_result_fails_the_run(distlab_run):
    result = distlab_run("collectives", 1, backend="gloo", launcher="python",
                         lab_args=["--primitives", "all_reduce,broadcast,all_gather", "--corrupt", "all-reduce"])
    assert result.returncode == 1, result.output[-3000:]
    record = result.record
    assert record["status"] == "failed"
    assert "check all_reduce failed" in record.get("lab_reason", record["reason"])  # distlab keeps the lab's reason
    wrong = {(r["primitive"], r["mode"]): r.get("wrong") for r in record["metrics"]["results"]}
    assert wrong[("all_reduce", "in-place")] == 1  # exactly the one element rank 0 overwrote
    assert wrong[("broadcast", "in-place")] == 0 and wrong[("all_gather", "out-of-place")] == 0
    assert record["checks"]["all_reduce"]["passed"] is False
    assert record["checks"]["broadcast"]["passed"] is True
    assert "WRONG: 1 of 4 elements" in result.output
