"""Faults injected on purpose (--fault), and what the harness makes of them.

Crash, and elastic recovery from it: tests/test_check_lab.py and test_training_labs.py. Here: a
hung rank named by the backend's collective timeout, a skipped collective, the network surface of
a run (loopback only) and Ctrl-C during it, and Ctrl-C during a grade.
"""

import ipaddress
import json
import signal
import subprocess
import time

import psutil
import pytest
from conftest import DISTLAB, needs_horovod, needs_mpi

from harness.run.processes import run_processes

pytestmark = pytest.mark.integration

# 256 images, batch 32 per rank, 2 ranks: 4 steps an epoch; every fault here is at step 2, in the first.
SMOKE = ["--smoke"]


def test_a_hung_rank_is_named_by_the_collective_timeout_before_the_watchdog(distlab_run):
    # --timeout 15: long enough that a slow start under load is not taken for the hang.
    result = distlab_run("ddp", 2, lab_args=[*SMOKE, "--timeout", "15", "--fault", "hang:rank=1:step=2"], timeout=240)
    assert result.returncode == 1
    assert result.run["timed_out"] is False and result.run["hang_suspected"] is True
    # Rank 0 waited in the all-reduce and timed out; rank 1, asleep, never did: look there.
    assert "hang suspected: a collective timed out on rank 0; rank 1 never reported it" in result.run["reason"]
    assert result.record["reason"] == result.run["reason"]
    assert "last lines of rank.1" in result.output
    assert run_processes(result.run["run_id"]) == []


def test_a_skipped_allreduce_leaves_every_rank_waiting_in_a_different_collective(distlab_run):
    result = distlab_run("ddp", 2, lab_args=[*SMOKE, "--timeout", "15", "--fault", "skip:rank=1:step=2"], timeout=240)
    assert result.returncode == 1
    assert "fault: skip on rank 1 at step 2" in result.output
    assert result.run["hang_suspected"] is True and result.run["timed_out"] is False
    assert "hang suspected: a collective timed out" in result.run["reason"]


@needs_horovod
@needs_mpi
def test_horovod_under_mpirun_names_the_rank_that_skipped_an_allreduce(distlab_run):
    result = distlab_run("horovod", 2, launcher="mpirun",
                         lab_args=[*SMOKE, "--timeout", "10", "--fault", "skip:rank=1:step=2"], timeout=240)
    assert result.returncode == 1
    assert "hang suspected: Horovod's stall inspector shut the job down" in result.run["reason"]
    assert "Missing ranks:" in result.output


def _listening(marker: str) -> dict[str, set[str]]:
    """The addresses the processes whose command line holds `marker` listen on, by process name."""
    found: dict[str, set[str]] = {}
    for process in psutil.process_iter(["name", "cmdline"]):
        try:
            if marker not in " ".join(process.info["cmdline"] or []):
                continue
            for connection in process.net_connections(kind="inet"):
                if connection.status == psutil.CONN_LISTEN:
                    found.setdefault(process.info["name"], set()).add(connection.laddr.ip)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize(("launcher", "backend", "runtime"), [
    ("torchrun", "gloo", set()),
    pytest.param("horovodrun", "horovod", set(), marks=needs_horovod),
    # Open MPI 5's runtime daemon listens on every interface and refuses loopback only (PRRTE
    # reports no usable interface); the ranks themselves listen nowhere else.
    pytest.param("mpirun", "gloo", {"prterun", "prte"}, marks=needs_mpi),
])
def test_a_one_host_run_listens_on_loopback_only_and_ends_cleanly_on_ctrl_c(results, launcher, backend, runtime):
    # The check lab joins its process group as the training labs do (labs/common/process_group.py;
    # hvd.init for Horovod), and then rank 1 stops answering: by then every store, rendezvous and
    # peer connection is up, and rank 0 waits in its all-reduce.
    process = subprocess.Popen([DISTLAB, "run", "check", "-n", "2", "--launcher", launcher, "--backend", backend,
                                "--threads", "1", "--results", str(results), "--timeout", "120", "--",
                                "--hang-rank", "1", "--timeout", "600"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: dict[str, set[str]] = {}
    try:
        # Sample until rank 1 says it hangs.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            for name, addresses in _listening(str(results)).items():
                seen.setdefault(name, set()).update(addresses)
            logs = [*results.rglob("std*"), *results.rglob("launcher.log")]  # per-rank files, or tagged lines
            if any("hanging as asked by --hang-rank" in log.read_text(errors="replace") for log in logs):
                break
            time.sleep(0.3)
        else:
            pytest.fail("the run never reached its hang")
        for name, addresses in _listening(str(results)).items():
            seen.setdefault(name, set()).update(addresses)
    finally:
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=60)[0]
    assert seen, output  # the ranks' collectives listen somewhere: finding nothing means a broken probe
    open_to_network = {name: sorted(addresses) for name, addresses in seen.items() if name not in runtime
                       for address in addresses if not ipaddress.ip_address(address).is_loopback}
    assert open_to_network == {}, output
    # Ctrl-C, while the run is provably in progress: the run is kept, marked, and leaves no process.
    assert process.returncode == 130, output
    assert "interrupted" in output
    run = json.loads(next(results.rglob("run.json")).read_text())
    assert run["interrupted"] is True and run["status"] == "failed"
    assert run_processes(run["run_id"]) == []


def test_ctrl_c_during_a_grade_keeps_the_finished_runs_and_reports_them(results):
    # check at world sizes 1 and 2, two repeats: Ctrl-C once the first run has finished.
    process = subprocess.Popen([DISTLAB, "grade", "--profile", "cpu-smoke", "--labs", "check", "--repeats", "2",
                                "--results", str(results)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    deadline = time.monotonic() + 120
    while not list(results.glob("check/*/run.json")) and time.monotonic() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 130, output
    assert "interrupted; finished runs are kept" in output
    finished = [json.loads(path.read_text()) for path in results.glob("check/*/run.json")]
    assert any(run["status"] == "ok" for run in finished), output
    summary = json.loads(next(results.glob("grade/*/summary.json")).read_text())
    assert summary["interrupted"] is True
    verdicts = json.loads(next(results.glob("grade/*/verdicts.json")).read_text())
    assert {"lab": "grade", "check": "completed", "passed": False}.items() <= verdicts[-1].items()
    assert all(run_processes(run["run_id"]) == [] for run in finished)
