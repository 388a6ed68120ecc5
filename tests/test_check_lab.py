"""labs/check through every real launcher, and what a failing rank looks like.

Ctrl-C during a run, under each launcher: tests/test_reliability.py (the network surface test)."""

import json

import pytest
from conftest import needs

from harness.run.processes import run_processes

pytestmark = pytest.mark.integration

LAUNCHES = [
    # (world size, launcher, backend)
    (1, None, "gloo"),  # plain python, a process group of one
    (2, "torchrun", "gloo"),
    (2, "horovodrun", "horovod"),
    (2, "mpirun", "mpi"),  # mpi4py
    (2, "mpirun", "horovod"),  # Horovod over its MPI controller
    (2, "mpirun", "gloo"),  # torch.distributed started by mpirun
]


@pytest.mark.parametrize(("world_size", "launcher", "backend"),
                         [pytest.param(*launch, marks=needs(launch[1], launch[2])) for launch in LAUNCHES])
def test_check_passes_and_records_every_rank(distlab_run, world_size, launcher, backend):
    result = distlab_run("check", world_size, lab_args=["--elements", "4096"], launcher=launcher, backend=backend)
    assert result.returncode == 0, result.output
    record = result.record
    assert record["status"] == "ok"
    assert record["checks"]["allreduce_value"] == {"passed": True, "expected": world_size * (world_size + 1) / 2,
                                                   "wrong_elements": 0}
    assert [r["rank"] for r in record["ranks"]] == list(range(world_size))
    assert len({r["pid"] for r in record["ranks"]}) == world_size
    prov = record["provenance"]
    assert (prov["world_size"], prov["backend"], prov["threads_per_rank"]) == (world_size, backend, 1)
    assert prov["launcher"] == ("none" if world_size == 1 else launcher)
    # rank 0 prints one line per rank; the other ranks print nothing for people
    for rank in range(world_size):
        assert f"rank {rank} (local {rank})" in (result.run_dir / "rank.0.log").read_text()
    assert result.run["status"] == "ok"
    assert "OMP_NUM_THREADS=1" in (result.run_dir / "command.txt").read_text()


@pytest.mark.parametrize(("launcher", "backend"), [pytest.param(*pair, marks=needs(*pair)) for pair in [
    ("torchrun", "gloo"), ("horovodrun", "horovod"), ("mpirun", "mpi")]])
def test_a_failing_rank_is_named_with_its_log_and_leaves_no_process(distlab_run, launcher, backend):
    result = distlab_run("check", 2, lab_args=["--fail-rank", "1"], launcher=launcher, backend=backend)
    assert result.returncode == 1
    assert "FAILED" in result.output
    assert "rank 1 exited with code 3" in result.output
    assert "exiting with code 3 as asked by --fail-rank" in result.output  # the tail of rank 1's log
    assert result.record["status"] == "failed"
    assert "rank 1" in result.record["reason"]
    assert result.run["failure"] == {"rank": 1, "exit_code": 3, "signal": None}
    assert run_processes(result.run["run_id"]) == []


def test_runs_never_overwrite_each_other(distlab_run, results):
    first = distlab_run("check", 1, lab_args=["--elements", "16"])
    second = distlab_run("check", 1, lab_args=["--elements", "32"])
    assert first.run_dir != second.run_dir
    assert json.loads((first.run_dir / "record.json").read_text())["config"]["elements"] == 16
    assert json.loads((second.run_dir / "record.json").read_text())["config"]["elements"] == 32


def test_a_hung_run_is_ended_by_the_watchdog_with_every_ranks_last_lines(distlab_run):
    # --timeout 600 in the lab: the collective would wait longer than the harness's watchdog. The
    # watchdog's 60 s leave the ranks time to start and reach the hang on a machine 8x slower and
    # busy (torch's import alone took 3 s here under load).
    result = distlab_run("check", 2, lab_args=["--hang-rank", "1", "--timeout", "600"], timeout=60)
    assert result.returncode == 1
    assert "timed out after 60 s, still running: a hang, or more work than the time limit allows" in result.output
    assert "last lines of rank.1" in result.output and "hanging as asked by --hang-rank" in result.output
    assert result.run["timed_out"] is True
    assert result.record["status"] == "failed" and "timed out after 60 s" in result.record["reason"]
    assert run_processes(result.run["run_id"]) == []
