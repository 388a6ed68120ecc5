"""A real two-node Slurm cluster on this one host, for tests/test_slurm.py (`nox -s slurm`).

    python tests/slurm_cluster.py -- pytest tests/test_slurm.py

starts munged, slurmctld and two slurmd (`-N n1`, `-N n2`) from Debian's packages, each with its
own port, spool, temporary folder and log in a fresh folder, runs the command with SLURM_CONF
pointing at the cluster, then stops everything it started by PID: the jobs left (scancel), the
daemons (SIGTERM, then SIGKILL), and any process that still carries the cluster's SLURM_CONF,
on any exit, a failure or a signal included. The node names resolve nowhere: every node has
NodeAddr=127.0.0.1, which is what the templates' rendezvous address comes from.

Why each setting (found on Slurm 22.05.8, Debian 12):
- TmpFS per node (%n): PMIx's client folder is TmpFS/spmix_appdir_<uid>_<job>.<step>; two
  slurmd on one host sharing /tmp make the second step fail "Cannot create directory ... File
  exists".
- jobcomp/filetxt: the one accounting that needs no slurmdbd and MySQL; `sacct -c` reads it
  (state, exit code, node list, elapsed).
- proctrack/linuxproc and task/none: no cgroup hierarchy to set up in a container.
- MinJobAge=4: `sbatch --wait` sleeps 2 s, then 8, then 32 between its polls while that sleep is
  under MinJobAge / 2 (so that a job is not purged unseen); at 4 it polls every 2 s, and a job of
  13 s returns in about 15 s instead of 42 (measured here).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from labs.common.host import free_port

NODES = ("n1", "n2")
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "sacct", "scontrol", "sinfo", "squeue", "scancel")
READY_S = 60.0  # slurmd registers within a few seconds here; a loaded CI machine gets 10x


def missing_tools() -> list[str]:
    return [tool for tool in DAEMONS if not shutil.which(tool)]



def write_config(folder: Path, cpus: int) -> Path:
    """slurm.conf for a controller and two nodes on 127.0.0.1, every path inside `folder`."""
    ctld_port, *node_ports = (free_port() for _ in range(1 + len(NODES)))
    host = socket.gethostname()
    for sub in ("state", "spool", *(f"tmp/{n}" for n in NODES)):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    nodes = "\n".join(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} State=UNKNOWN"
                      for name, port in zip(NODES, node_ports, strict=True))
    conf = folder / "slurm.conf"
    conf.write_text(f"""\
ClusterName=distlab
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={folder}/munge.socket
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
TmpFS={folder}/tmp/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=5
MinJobAge=4
JobCompType=jobcomp/filetxt
JobCompLoc={folder}/jobcomp.txt
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/none
{nodes}
PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
""")
    return conf


class Cluster:
    """The daemons of one cluster, started in order and stopped in reverse, each by its PID."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.conf = write_config(folder, os.cpu_count() or 1)
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.daemons: list[tuple[str, subprocess.Popen[bytes]]] = []

    def _start(self, name: str, *argv: str) -> None:
        log = open(self.folder / f"{name}.out", "wb")  # noqa: SIM115 (closed by the process's end)
        self.daemons.append((name, subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                                    start_new_session=True)))
        log.close()

    def start(self) -> None:
        key = self.folder / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        self._start("munged", "munged", "--foreground", "--force", f"--socket={self.folder}/munge.socket",
                    f"--key-file={key}", f"--pid-file={self.folder}/munged.pid",
                    f"--log-file={self.folder}/munged.log", f"--seed-file={self.folder}/munged.seed")
        self._wait(lambda: (self.folder / "munge.socket").exists(), "munged's socket")
        self._start("slurmctld", "slurmctld", "-D", "-f", str(self.conf))
        for node in NODES:
            self._start(f"slurmd-{node}", "slurmd", "-D", "-f", str(self.conf), "-N", node)
        self._wait(self._nodes_idle, "both nodes idle in sinfo")

    def _nodes_idle(self) -> bool:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env, capture_output=True, text=True)
        states = dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)
        return all(states.get(node) == "idle" for node in NODES)

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + READY_S
        while not ready():
            for name, proc in self.daemons:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}; see {self.folder}/{name}.out")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {READY_S:.0f} s; logs in {self.folder}")
            time.sleep(0.2)  # polling a daemon's state: there is no event to wait on

    def stop(self) -> None:
        if any(name == "slurmctld" and proc.poll() is None for name, proc in self.daemons):
            subprocess.run(["scancel", "--full", "--quiet", "--partition", "debug"], env=self.env,
                           capture_output=True, timeout=30)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and subprocess.run(
                    ["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True).stdout.strip():
                time.sleep(0.2)
        for _, proc in reversed(self.daemons):
            if proc.poll() is None:
                proc.terminate()
        for _, proc in reversed(self.daemons):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in self.leftovers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def leftovers(self) -> list[int]:
        """Processes that still carry this cluster's SLURM_CONF: steps and ranks a killed job left."""
        mark = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    if mark in (entry / "environ").read_bytes().split(b"\0"):
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: python tests/slurm_cluster.py -- COMMAND...", file=sys.stderr)
        return 2
    command = argv[argv.index("--") + 1:]
    if missing_tools():
        print(f"slurm_cluster: missing {', '.join(missing_tools())}: apt-get install slurm-wlm munge libpmix-dev",
              file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp(prefix="distlab-slurm-"))
    folder.chmod(0o711)  # munged wants its socket's folder searchable by all, writable by none
    cluster = Cluster(folder)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # finally: below runs
    started = time.monotonic()
    code = 1
    try:
        cluster.start()
        print(f"slurm_cluster: nodes {', '.join(NODES)} up in {time.monotonic() - started:.1f} s ({cluster.conf})",
              flush=True)
        code = subprocess.run(command, env={**cluster.env, "DISTLAB_SLURM_CLUSTER": str(folder)}).returncode
    finally:
        cluster.stop()
        left = cluster.leftovers()
        print(f"slurm_cluster: stopped after {time.monotonic() - started:.0f} s"
              + (f"; processes still there: {left}" if left else ""), flush=True)
        if code == 0 and not left:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"slurm_cluster: logs kept in {folder}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
