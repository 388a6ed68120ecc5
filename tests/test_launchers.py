"""Launcher command lines and failure reports, without starting anything."""

import os
from pathlib import Path

import pytest

from harness.run import launchers
from harness.run.launchers import LAUNCHERS, LaunchSpec
from labs.common import host
from labs.common.host import Cores


def spec(world_size: int = 2) -> LaunchSpec:
    return LaunchSpec(program=Path("/repo/labs/check/check.py"), lab_args=["--backend", "gloo", "--record", "r.json"],
                      world_size=world_size, log_dir=Path("/run/logs"), python="/venv/bin/python",
                      env_names=("OMP_NUM_THREADS", "MASTER_ADDR"))


def test_torchrun_on_one_node_meets_in_a_file_and_serves_no_port_of_its_own():
    command = LAUNCHERS["torchrun"].command(spec(4))
    # The rendezvous state lives in a file of the run's own; the workers' store on loopback.
    assert command[command.index("--rdzv-endpoint") + 1] == "/run/logs/rendezvous"
    assert command[command.index("--rdzv-conf") + 1] == "store_type=file"
    assert command[command.index("--local-addr") + 1] == "127.0.0.1"
    # Each restart attempt gets a fresh store (the agent's shared one keeps a failed attempt's keys):
    # the setting reaches the command a run starts, and only torchrun's.
    from harness.run.launch import dry_run
    from harness.run.request import build_request

    for launcher, expected in (("torchrun", True), ("mpirun", False)):
        request = build_request("check", 2, [], launcher=launcher, results_root=Path("/nonexistent"))
        assert ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in dry_run(request)) is expected, launcher
    assert command[command.index("--nproc-per-node") + 1] == "4"
    assert command[command.index("--log-dir") + 1] == "/run/logs"
    assert command[-5:] == ["/repo/labs/check/check.py", "--backend", "gloo", "--record", "r.json"]


def test_horovodrun_uses_gloo_on_localhost_slots():
    command = LAUNCHERS["horovodrun"].command(spec(3))
    assert command[1:4] == ["--gloo", "-np", "3"]
    assert command[command.index("-H") + 1] == "localhost:3"
    assert command[command.index("--output-filename") + 1] == "/run/logs"
    assert "/venv/bin/python" in command


@pytest.mark.parametrize(("euid", "cores", "world_size", "root_flag", "oversubscribe"), [
    (0, 2, 2, True, False), (1000, 2, 2, False, False), (0, 2, 4, True, True), (1000, 1, 2, False, True)])
def test_mpirun_flags_only_when_needed(monkeypatch, euid, cores, world_size, root_flag, oversubscribe):
    monkeypatch.setattr(launchers.os, "geteuid", lambda: euid)
    monkeypatch.setattr(launchers, "usable_cores", lambda: Cores(cores, "affinity", 8, cores, None))
    command = LAUNCHERS["mpirun"].command(spec(world_size))
    assert command[command.index("btl") + 1] == "^tcp"  # one host: shared memory, no rank listens on TCP
    assert ("--allow-run-as-root" in command) is root_flag
    assert ("--oversubscribe" in command) is oversubscribe
    assert command[command.index("-np") + 1] == str(world_size)
    assert command[command.index("--bind-to") + 1] == "none"
    exported = [command[i + 1] for i, word in enumerate(command) if word == "-x"]
    assert exported == ["OMP_NUM_THREADS", "MASTER_ADDR"]


def test_python_is_one_plain_process():
    assert LAUNCHERS["python"].command(spec(1)) == ["/venv/bin/python", "/repo/labs/check/check.py", "--backend",
                                                    "gloo", "--record", "r.json"]


# Real launcher output, captured from torch 2.14.1, Horovod 0.28.1 and Open MPI 5.0.11.
TORCHRUN_OUTPUT = """\
Failures:
[1]:
  time      : 2026-11-30_04:43:15
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 5648)  (SIGTERM)
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_04:43:15
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 5649)  (SIGKILL)
"""
HOROVODRUN_OUTPUT = """\
RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the job to be \
terminated. The first process to do so was:
Process name: 1
Exit code: 3
"""
MPIRUN_EXIT = """\
prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-vm-5482@1,1]
   Exit code:    3
"""
MPIRUN_SIGNAL = """\
prterun noticed that process rank 1 with PID 5522 on node vm exited on
signal 9 (Killed).
"""


@pytest.mark.parametrize(("launcher", "output", "rank", "code", "signal"), [
    ("torchrun", TORCHRUN_OUTPUT, 1, -9, "SIGKILL"),
    ("horovodrun", HOROVODRUN_OUTPUT, 1, 3, None),
    ("mpirun", MPIRUN_EXIT, 1, 3, None),
    ("mpirun", MPIRUN_SIGNAL, 1, None, "SIGKILL"),
])
def test_failing_rank_is_read_from_the_launcher(launcher, output, rank, code, signal):
    failure = LAUNCHERS[launcher].failure(output)
    assert (failure.rank, failure.exit_code, failure.signal) == (rank, code, signal)


def test_unrecognised_output_names_no_rank():
    assert all(LAUNCHERS[name].failure("something else entirely") is None for name in LAUNCHERS)


def test_mpirun_tagged_output_is_split_per_rank(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "launcher.log").write_text(
        "[1,0]<stdout>: hello from 0\n[1,1]<stderr>: oops on 1\nuntagged launcher line\n[1,1]<stdout>: bye\n")
    logs = LAUNCHERS["mpirun"].rank_logs(tmp_path / "logs")
    assert sorted(logs) == [0, 1]
    assert logs[1][0].read_text() == "oops on 1\nbye\n"
    assert logs[0][0].read_text() == "hello from 0\n"


@pytest.mark.parametrize(("logs", "expected"), [
    # Gloo reports the same timeout two ways, depending on where the waiting rank stood.
    ({0: "RuntimeError: [pair.cc:545] Timed out waiting 8000ms for recv operation to complete", 1: "fault: hang"},
     "a collective timed out on rank 0; rank 1 never reported it"),
    ({0: "RuntimeError: Application timeout caused pair closure", 1: "fault: hang"},
     "a collective timed out on rank 0; rank 1 never reported it"),
    ({0: "Watchdog caught collective operation timeout", 1: "Timed out waiting 8000ms for send operation"},
     "a collective timed out on every rank, each waiting in a different one"),
    ({0: "RuntimeError: Connection reset by peer", 1: "exit 3"}, None),
])
def test_a_backend_collective_timeout_is_read_as_a_hang(tmp_path, logs, expected):
    from harness.run.hangs import hang_reason

    rank_logs = {}
    for rank, text in logs.items():
        rank_logs[rank] = tmp_path / f"rank.{rank}.log"
        rank_logs[rank].write_text(text + "\n")
    reason = hang_reason(rank_logs, "")
    assert (reason is None) if expected is None else (expected in reason)


def test_horovods_stall_shutdown_is_read_as_a_hang(tmp_path):
    from harness.run.hangs import hang_reason

    output = "Missing ranks:\n0!: [allreduce.noname.309]\nOne or more rank (marked by \"!\") is stalled for " \
             "longer than 10 seconds. Will shutdown."
    assert "Horovod's stall inspector shut the job down" in hang_reason({}, output)


@pytest.mark.parametrize(("launcher", "output", "expected"), [
    ("torchrun", TORCHRUN_OUTPUT.replace("-9 (pid", "-6 (pid"), (1, -6, "SIGABRT")),
    ("torchrun", TORCHRUN_OUTPUT.replace("-9 (pid", "-11 (pid"), (1, -11, "SIGSEGV")),
    ("horovodrun", HOROVODRUN_OUTPUT.replace("Exit code: 3", "Exit code: -7"), (1, -7, "SIGBUS")),
    ("mpirun", MPIRUN_SIGNAL.replace("signal 9 (Killed)", "signal 15 (Terminated)"), (1, None, "SIGTERM")),
    ("torchrun", TORCHRUN_OUTPUT.replace("-9 (pid", "-200 (pid"), (1, -200, "signal 200")),
], ids=["abort", "segfault", "bus-error", "mpirun-term", "no-such-signal"])
def test_any_signal_is_named_as_the_system_names_it(launcher, output, expected):
    failure = LAUNCHERS[launcher].failure(output)
    assert (failure.rank, failure.exit_code, failure.signal) == expected


def test_a_loopback_endpoint_served_by_the_harness_makes_every_torchrun_a_client():
    def conf(**placement) -> str:
        command = LAUNCHERS["torchrun"].command(LaunchSpec(program=Path("/p/x.py"), lab_args=[], world_size=2,
                                                           log_dir=Path("/l"), python="python", **placement))
        return command[command.index("--rdzv-conf") + 1]

    assert conf(rdzv_endpoint="127.0.0.1:29400", rdzv_store_served=True) == "join_timeout=60,is_host=0"
    assert conf(rdzv_endpoint="node0:29400") == "join_timeout=60,is_host=1"


def test_tagged_output_that_is_not_utf8_is_split_byte_for_byte(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "launcher.log").write_bytes(b"[1,0]<stdout>: caf\xe9\n[1,1]<stdout>: \xff\xfe\nnoise \x80\n")
    logs = LAUNCHERS["mpirun"].rank_logs(tmp_path / "logs")
    assert logs[0][0].read_bytes() == b"caf\xe9\n" and logs[1][0].read_bytes() == b"\xff\xfe\n"


def test_tagged_output_replaced_by_a_fifo_is_not_read(tmp_path):
    (tmp_path / "logs").mkdir()
    os.mkfifo(tmp_path / "launcher.log")
    assert LAUNCHERS["mpirun"].rank_logs(tmp_path / "logs") == {}


@pytest.mark.parametrize(("version", "tag"), [("mpirun (Open MPI) 4.1.4", ["--tag-output"]),
                                              ("mpirun (Open MPI) 5.0.11", ["--output", "tag"])])
def test_mpirun_tags_rank_output_in_its_own_open_mpi_s_spelling(tmp_path, version, tag):
    """Open MPI 4 (Debian's, the CPU image's) refuses --output ("unknown option"), 5 (PyPI's) has
    no --tag-output: found in the CPU image's MPIJob launcher (tests/test_k8s_operators.py)."""
    fake = tmp_path / "bin" / "mpirun"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "{version}"\n')
    fake.chmod(0o755)
    command = LAUNCHERS["mpirun"].command(LaunchSpec(
        program=Path("/p.py"), lab_args=[], world_size=2, log_dir=Path("/l"), python=str(fake.parent / "python")))
    assert command[0] == str(fake)
    at = command.index(tag[0])
    assert command[at:at + len(tag)] == tag
    assert ("--output" in command) is (tag[0] == "--output") and ("--tag-output" in command) is (len(tag) == 1)


def test_the_rendezvous_port_is_one_no_socket_of_the_kernels_choosing_can_take(monkeypatch, tmp_path):
    """MASTER_PORT is bound later, by rank 0: from the ephemeral range, an outgoing connection or a
    listener of Gloo or mpirun could take it in between (CI: "Address already in use" on rank 0)."""
    low, high = host.ephemeral_ports()
    ports = {host.free_port() for _ in range(20)}
    assert all(host.LOWEST_PORT <= port < low or high < port <= 65535 for port in ports), (ports, low, high)
    assert len(ports) > 1  # chosen at random: two runs starting together do not pick one port
    # A range that leaves nothing outside it: the kernel picks, as before.
    whole = tmp_path / "ip_local_port_range"
    whole.write_text("1024\t65535\n")
    monkeypatch.setattr(host, "EPHEMERAL_PORTS_FILE", whole)
    assert host.ephemeral_ports() == (1024, 65535)
    assert 1024 <= host.free_port() <= 65535
