"""How a cell's run is made, where it is more than one launch on this host (a profile row's `cell`).

- one-host: the run, through the runner, as `distlab run` starts it (grading/execute.py does that).
- two-hosts: the world split over two "hosts" made on this machine (two network namespaces joined by
  a veth pair, addresses from 198.18.0.0/15, which is never routed), one `distlab run` per node meeting
  at torchrun's rendezvous on node 0, as on a cluster (docs/multinode.md). Both nodes see one folder
  where the row's arguments say {run_dir}: a shared file system, as clusters have. A program that
  saves when LOCAL_RANK == 0 has one writer per node there, and observed:one_writer_per_checkpoint
  sees both ranks write the same file. Node 0 runs in the grader's process (its launcher inside the
  first namespace); node 1 is a `distlab run --node-rank 1` of its own inside the second. Their
  observations are judged as one run's (observe/observations.merge).
- resume: an uninterrupted run first, then the same run under torchrun --max-restarts 1 whose first
  attempt the observer stops once `stop_after_epochs` training epochs are done (at the first step
  of the next; fileformat.STOP_AFTER_EPOCHS): torchrun starts every rank again, the program resumes
  from its checkpoint, and observe/resume.py compares the two attempts' epochs, sample orders and
  steps with the uninterrupted run's (an off-by-one resume epoch retrains an epoch).

A cell that cannot run here (no root or iproute2 for the namespaces; inside the class sandbox) is
not run, and its one verdict says why (Sample.status NOT_RUN).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from harness.console import printable
from harness.files import write_bytes
from harness.grading import samples
from harness.observe import accuracy, observations, resume, timeline
from harness.on_ranks.observer.distlab_observer.fileformat import STOP_AFTER_EPOCHS, STOPPED_DIR
from harness.run.request import RunRequest
from harness.run.run_dir import OBSERVE_DIR, RUN_DIR_PLACEHOLDER, new_run_dir
from harness.run.runner import run_lab
from harness.verdict.expectations import LabExpectation
from harness.verdict.verdicts import NOT_RUN, Sample

SUBNET = "198.18.{}.{}"  # RFC 2544's benchmarking range: never routed anywhere
INTERFACE = "dl0"  # each namespace's end of the veth pair
RENDEZVOUS_PORT = 29400  # in node 0's own namespace: nothing else listens there
NODE_GRACE_S = 120.0  # node 1 may take this much longer than the run's own watchdog: start-up, its accounts
SANDBOXED = ("the two-host cell does not run in the class sandbox: the sandbox gives each run a network of its "
             "own with loopback only (bwrap --unshare-net, GLOO_SOCKET_IFNAME=lo) and binds only the run's "
             "folder writable, so the hosts' link and their shared folder are not in it; grade this row with "
             "`distlab grade --program`")


def refused(exp: LabExpectation, request: RunRequest) -> str | None:
    """Why this row's cell cannot run here (None: it can)."""
    if exp.cell == "two-hosts":
        if request.sandbox:
            return SANDBOXED
        if os.geteuid() != 0 or not shutil.which("ip"):
            return "the two-host cell makes two network namespaces, which needs root and iproute2 (ip)"
        if request.launcher != "torchrun":
            return f"the two-host cell runs torchrun's rendezvous; this row's launcher is {request.launcher}"
    if exp.cell == "resume" and request.launcher != "torchrun":
        return f"the resume cell restarts the ranks with torchrun --max-restarts; this row's launcher is " \
               f"{request.launcher}"
    return None


def run_cell(exp: LabExpectation, request: RunRequest, evaluator: accuracy.Evaluator,
             on_line: Callable[[str], None] | None = None) -> Sample:
    """One run of a row's cell, as the grader judges it."""
    problem = refused(exp, request)
    if problem:  # a folder of its own all the same: whoever reads a sample's run folder finds one, empty but this
        folder = new_run_dir(request.results_root, request.lab, request.world_size, "not-run")
        write_bytes(folder / "not-run.txt", (problem + "\n").encode())
        return Sample(str(folder), NOT_RUN, problem, 0.0, None)
    if exp.cell == "two-hosts":
        return two_hosts(exp, request, evaluator, on_line)
    if exp.cell == "resume":
        return stopped_and_resumed(exp, request, evaluator, on_line)
    return samples.observed_sample(run_lab(request, echo=False, on_line=on_line), exp, request, evaluator)


# ------------------------------------------------------------------------------------------- two hosts


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def two_namespaces() -> Iterator[list[tuple[str, str]]]:
    """Two network namespaces joined by one veth pair: [(name, address)] of each, removed on the way out."""
    tag = uuid.uuid4().hex[:6]
    names = [f"dl{tag}a", f"dl{tag}b"]
    net = int(tag[:2], 16) % 250 + 1
    try:
        for ns in names:
            _ip("netns", "add", ns)
        _ip("link", "add", f"v{tag}a", "type", "veth", "peer", "name", f"v{tag}b")
        hosts = []
        for index, (ns, end) in enumerate(zip(names, "ab", strict=True), 1):
            _ip("link", "set", f"v{tag}{end}", "netns", ns)
            _ip("-n", ns, "link", "set", f"v{tag}{end}", "name", INTERFACE)
            address = SUBNET.format(net, index)
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", INTERFACE)
            _ip("-n", ns, "link", "set", INTERFACE, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            hosts.append((ns, address))
        yield hosts
    finally:  # deleting a namespace removes its end of the veth pair, and so the pair
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def two_hosts(exp: LabExpectation, request: RunRequest, evaluator: accuracy.Evaluator,
              on_line: Callable[[str], None] | None) -> Sample:
    shared = new_run_dir(request.results_root, request.lab, request.world_size, "shared")
    lab_args = [arg.replace(RUN_DIR_PLACEHOLDER, str(shared)) for arg in request.lab_args]
    try:
        with two_namespaces() as ((ns0, addr0), (ns1, _)):
            endpoint = f"{addr0}:{RENDEZVOUS_PORT}"
            rdzv_id = uuid.uuid4().hex[:12]
            node0 = dataclasses.replace(
                request, lab_args=lab_args, sandbox=["ip", "netns", "exec", ns0],
                extra_env={**request.extra_env, "GLOO_SOCKET_IFNAME": INTERFACE},
                placement={"nnodes": 2, "node_rank": 0, "rdzv_endpoint": endpoint, "rdzv_id": rdzv_id,
                           "rdzv_timeout_s": 60.0, "local_addr": addr0})
            # Node 1 first: it waits for node 0's endpoint (--rdzv-timeout), node 0 then starts at once.
            node1_root = shared / "node1"
            command = ["ip", "netns", "exec", ns1, request.python, "-m", "harness.commands.cli", "run", request.lab,
                       "--program", str(request.program), "--world-size", str(request.world_size),
                       "--threads", str(request.threads), "--backend", request.backend, "--launcher", "torchrun",
                       "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id,
                       "--rdzv-timeout", "60", "--gloo-ifname", INTERFACE, "--timeout", f"{request.timeout_s:g}",
                       "--results", str(node1_root), "--", *lab_args]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                                             os.environ.get("PYTHONPATH")]))}
            with open(shared / "node1.log", "wb") as log:
                node1 = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
                try:
                    result = run_lab(node0, echo=False, on_line=on_line)
                    node1.wait(timeout=request.timeout_s + NODE_GRACE_S)
                finally:
                    if node1.poll() is None:  # stopped (Ctrl-C), or past its time: its own run ends it
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(node1.pid, signal.SIGTERM)
                        node1.wait(timeout=60)
    except subprocess.CalledProcessError as error:
        return Sample(str(shared), NOT_RUN, f"the two hosts could not be made: {printable(error.stderr.strip())}",
                      0.0, None)
    node1_dirs = sorted(node1_root.glob(f"{request.lab}/*"))
    node1_run = _run_json(node1_dirs[-1]) if node1_dirs else {}
    sample = samples.observed_sample(result, exp, node0, evaluator,
                                     more_dirs=[d / OBSERVE_DIR for d in node1_dirs[-1:]], roots=[shared])
    if node1_run.get("status") != "ok":
        why = node1_run.get("reason") or f"no run of node 1 (exit {node1.returncode}; {shared / 'node1.log'})"
        sample.status, sample.reason = "failed", f"node 1: {why}" + (f"; node 0: {sample.reason}"
                                                                     if sample.reason else "")
    return sample


def _run_json(run_dir: Path) -> dict:
    """The run.json a node's own `distlab run` wrote (the harness's file, by rename)."""
    try:
        return json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}


# ---------------------------------------------------------------------------------------------- resume


def stopped_and_resumed(exp: LabExpectation, request: RunRequest, evaluator: accuracy.Evaluator,
                        on_line: Callable[[str], None] | None) -> Sample:
    uninterrupted = run_lab(request, echo=False, on_line=on_line)
    restarted = dataclasses.replace(request, max_restarts=max(1, request.max_restarts),
                                    extra_env={**request.extra_env, STOP_AFTER_EPOCHS: str(exp.stop_after_epochs)})
    result = run_lab(restarted, echo=False, on_line=on_line)
    sample = samples.observed_sample(result, exp, restarted, evaluator)
    observe_dir = result.run_dir / OBSERVE_DIR
    first = observations.load(uninterrupted.run_dir / OBSERVE_DIR)
    stopped, resumed = observations.load(observe_dir / STOPPED_DIR), observations.load(observe_dir)
    if not uninterrupted.ok:
        check = resume.not_comparable(f"the uninterrupted run failed ({uninterrupted.reason})")
    else:
        check = resume.check_resume(first, stopped, resumed, exp.stop_after_epochs)
    sample.observed.append(check.to_dict())
    sample.wall_seconds += uninterrupted.wall_seconds
    # Both launches' phases summed; the restart's from its stopped attempt's milestones and then the resumed one's.
    sample.phases = timeline.add(timeline.run_phases(result, stopped, resumed),
                                 timeline.run_phases(uninterrupted, first))
    return sample
