"""Containers, Makefile and workflows: the docker command lines `make lab-NAME` builds (read with
DRY_RUN, no engine needed), refusals before anything starts, the linters on the Dockerfiles,
workflows and scripts, and, where an engine and the built CPU image are present, labs run in it."""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.catalog import LABS

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILES = [ROOT / "docker/Dockerfile.cpu", ROOT / "docker/Dockerfile.gpu"]
# Settings a caller's environment might hold that would change what the Makefile does.
MAKE_SETTINGS = ["GPUS", "NP", "ENGINE", "RUNTIME", "BACKEND", "LAB_ARGS", "IMAGE", "DRY_RUN", "ENGINE_ARGS",
                 "CUDA_VISIBLE_DEVICES", "DATA_DIR", "RESULTS_DIR", "BASE", "TORCH_INDEX_URL", "TORCH_VERSION",
                 "TORCHVISION_VERSION", "EXTRA_CA", "PIP_CERT", "BUILD_NETWORK", "CACHE_FROM", "CACHE_TO",
                 "GITHUB_STEP_SUMMARY", "MAKEFLAGS", "MAKELEVEL"]


@pytest.fixture
def fake_host(tmp_path: Path):
    """A PATH whose nvidia-smi lists N GPUs and whose docker/podman only note that they were called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    called = tmp_path / "engine-called"
    for engine in ("docker", "podman"):
        (bin_dir / engine).write_text(f"#!/bin/sh\necho \"$0 $*\" >> {called}\n")
        (bin_dir / engine).chmod(0o755)

    def host(gpus: int) -> dict[str, str]:
        smi = bin_dir / "nvidia-smi"
        lines = "".join(f'echo "GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})"\n' for i in range(gpus))
        smi.write_text(f"#!/bin/sh\n{lines}")
        smi.chmod(0o755)
        env = {k: v for k, v in os.environ.items() if k not in MAKE_SETTINGS}
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
        return env

    host.called = called
    return host


def make(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def dry_run(*args: str, env: dict[str, str]) -> list[str]:
    """The command `make -n` shows: the last line printed, split like a shell would."""
    done = make("-n", *args, env=env)
    assert done.returncode == 0, done.stderr
    return shlex.split(done.stdout.strip().splitlines()[-1])


def option_values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == option]


def distlab_args(argv: list[str]) -> list[str]:
    return argv[argv.index("distlab") + 1:]


def test_lab_in_docker_gets_gpus_shared_memory_ulimits_volumes_and_the_world_size(fake_host):
    argv = dry_run("lab-ddp", "GPUS=2", "BACKEND=nccl", "LAB_ARGS=--smoke --epochs 1", env=fake_host(4))
    assert argv[:3] == ["docker", "run", "--rm"]
    assert option_values(argv, "--gpus") == ['"device=0,1"']
    assert "--ipc=host" in argv
    assert option_values(argv, "--cap-add") == ["SYS_PTRACE"]  # py-spy's stacks of hung ranks
    assert option_values(argv, "--ulimit") == ["memlock=-1", "stack=67108864"]
    volumes = option_values(argv, "--volume")
    assert [v.split(":")[1] for v in volumes] == ["/workspace/data", "/workspace/results"]
    assert volumes[0].split(":")[0] == str(ROOT / "data") and volumes[1].split(":")[0] == str(ROOT / "results")
    assert argv[argv.index("distlab") - 1] == "distlab:gpu"
    assert distlab_args(argv) == ["run", "ddp", "--world-size", "2", "--backend", "nccl", "--", "--smoke",
                                  "--epochs", "1"]


def test_make_lab_with_gpus_names_no_backend_so_the_run_picks_nccl_for_its_gpus(fake_host):
    # `make lab-ddp GPUS=2`: no BACKEND, so distlab run inside the image applies the one rule
    # (harness/catalog.py backend_for): NCCL when every rank has a GPU (tests/test_gpu_wiring.py).
    argv = dry_run("lab-ddp", "GPUS=2", env=fake_host(2))
    assert option_values(argv, "--gpus") == ['"device=0,1"']
    assert distlab_args(argv) == ["run", "ddp", "--world-size", "2", "--"]


def test_podman_gets_one_cdi_device_per_gpu_and_cuda_visible_devices_picks_them(fake_host):
    env = fake_host(8)
    env["CUDA_VISIBLE_DEVICES"] = "4,6,7"
    argv = dry_run("lab-collectives", "GPUS=2", "ENGINE=podman", env=env)
    assert argv[:2] == ["podman", "run"]
    assert option_values(argv, "--device") == ["nvidia.com/gpu=4", "nvidia.com/gpu=6"]
    assert "--gpus" not in argv
    assert distlab_args(argv)[:4] == ["run", "collectives", "--world-size", "2"]


def test_cpu_ranks_use_the_cpu_image_without_gpus(fake_host):
    argv = dry_run("lab-ddp", "NP=2", "LAB_ARGS=--smoke", env=fake_host(4))
    assert "--gpus" not in argv and "--device" not in argv
    assert argv[argv.index("distlab") - 1] == "distlab:cpu"
    assert distlab_args(argv) == ["run", "ddp", "--world-size", "2", "--", "--smoke"]


@pytest.mark.parametrize("lab", sorted(LABS))
def test_every_lab_has_a_make_target(lab, fake_host):
    argv = dry_run(f"lab-{lab}", "GPUS=1", env=fake_host(1))
    assert distlab_args(argv)[:4] == ["run", lab, "--world-size", "1"]


def test_local_runtime_sets_up_then_runs_distlab_on_the_chosen_gpus(fake_host):
    done = make("-n", "lab-scaling", "GPUS=3", "RUNTIME=local", env=fake_host(4))
    assert done.returncode == 0, done.stderr
    setup, run = done.stdout.strip().splitlines()[-2:]
    assert shlex.split(setup)[-1] == "setup"
    assert shlex.split(run) == ["env", "CUDA_VISIBLE_DEVICES=0,1,2", ".nox/env/bin/distlab", "run", "scaling",
                                "--world-size", "3", "--"]


def test_grade_gpu_uses_every_visible_gpu_and_passes_the_profile(fake_host):
    argv = dry_run("grade-gpu", "PROFILE=h100-8", "WORLD_SIZES=1,2", env=fake_host(2))
    assert option_values(argv, "--gpus") == ['"device=0,1"']
    assert distlab_args(argv) == ["grade", "--profile", "h100-8", "--world-sizes", "1,2"]


@pytest.mark.parametrize(("settings", "gpus", "message"), [
    (["GPUS=2"], 0, "GPUS=2 but this host shows no GPU (nvidia-smi -L); use NP=2 for 2 ranks on the CPU"),
    (["GPUS=4"], 2, "GPUS=4 but this host shows 2 GPU(s) (nvidia-smi -L); use GPUS=2 or fewer"),
    (["GPUS=two"], 2, "GPUS=two is not a whole number"),
    (["NP=0"], 0, "NP=0 is not a whole number of at least 1"),
    (["GPUS=2", "NP=3"], 2, "GPUS=2 and NP=3 disagree"),
    (["ENGINE=lxc"], 0, "ENGINE=lxc: use ENGINE=docker or ENGINE=podman"),
    (["RUNTIME=vm"], 0, "RUNTIME=vm: use RUNTIME=container or RUNTIME=local"),
])
def test_bad_settings_are_one_line_exit_2_and_nothing_starts(settings, gpus, message, fake_host):
    done = make("lab-ddp", *settings, env=fake_host(gpus))
    assert done.returncode == 2
    ours = [line for line in done.stderr.splitlines() if not line.startswith("make")]
    assert len(ours) == 1 and ours[0].startswith("run-lab.sh: error: ") and message in ours[0], done.stderr
    assert not fake_host.called.exists()


def test_grade_gpu_without_gpus_points_to_the_cpu_grade(fake_host):
    done = make("grade-gpu", env=fake_host(0))
    assert done.returncode == 2
    assert "no GPU to grade on (nvidia-smi -L lists none); make grade grades the CPU" in done.stderr
    assert not fake_host.called.exists()


def test_missing_image_is_named_with_the_target_that_builds_it(fake_host):
    env = fake_host(0)
    bin_dir = Path(env["PATH"].split(os.pathsep)[0])
    (bin_dir / "docker").write_text("#!/bin/sh\n[ \"$1\" = info ]\n")  # the engine answers, the image is absent
    done = make("lab-check", "NP=2", env=env)
    assert done.returncode == 2
    assert "image distlab:cpu is missing; build it with make image-cpu" in done.stderr


def test_image_builds_pass_settings_as_build_args_and_the_ca_as_a_secret(fake_host, tmp_path):
    ca = tmp_path / "proxy-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    env = fake_host(0)
    argv = dry_run("image-cpu", "ENGINE=podman", "BASE=localhost/debian:bookworm",
                   "TORCH_INDEX_URL=https://pypi.org/simple", f"EXTRA_CA={ca}", env=env)
    assert argv[:2] == ["podman", "build"] and argv[-1] == "."
    assert option_values(argv, "--file") == ["docker/Dockerfile.cpu"]
    args = option_values(argv, "--build-arg")
    assert "BASE=localhost/debian:bookworm" in args and "TORCH_INDEX_URL=https://pypi.org/simple" in args
    assert option_values(argv, "--secret") == [f"id=extra_ca,src={ca}"]
    assert option_values(argv, "--format") == ["docker"]  # OCI would drop SHELL (bash, pipefail)
    gpu = dry_run("image", "TORCH_INDEX_URL=https://pypi.org/simple", env=env)
    assert option_values(gpu, "--file") == ["docker/Dockerfile.gpu"]
    assert not any(a.startswith("TORCH") for a in option_values(gpu, "--build-arg"))
    assert "--secret" not in gpu


def test_help_lists_every_target_with_one_line(fake_host):
    done = make("help", env=fake_host(0))
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.strip()}
    targets = set(re.findall(r"^([a-z][a-z%-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    assert targets <= listed
    assert {"image", "image-cpu", "lab-%", "grade", "grade-smoke", "grade-gpu", "test", "doctor", "help"} <= listed


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_keeps_secrets_out_and_runs_as_a_user(dockerfile):
    text = dockerfile.read_text()
    steps = re.split(r"\n(?=[A-Z]+ )", text)
    downloads = [s for s in steps if "with-extra-ca" in s and s.startswith("RUN")]
    assert downloads, "no step uses the extra CA"
    for step in downloads:  # the CA is an optional secret mount, never a file in a layer
        assert "--mount=type=secret,id=extra_ca,required=false" in step
    assert not re.search(r"^(ARG|ENV) \S*(TOKEN|PASSWORD|SECRET|KEY)", text, re.MULTILINE)
    assert re.findall(r"^USER (\S+)", text, re.MULTILINE)[-1] == "${DISTLAB_UID}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_arguments_are_in_scope_and_keep_the_cache(dockerfile):
    lines = dockerfile.read_text().splitlines()
    after_from = lines[next(i for i, line in enumerate(lines) if line.startswith("FROM ")) + 1:]
    # An ARG declared before FROM is empty inside the stage unless declared again.
    if any("${BASE}" in line for line in after_from):
        assert "ARG BASE" in after_from
    # A build argument that changes on every build (the time) must come after the last RUN, or
    # no layer is ever reused.
    last_run = max(i for i, line in enumerate(lines) if line.startswith("RUN "))
    for name in ("VCS_REF", "BUILD_DATE"):
        assert lines.index(next(line for line in lines if line.startswith(f"ARG {name}="))) > last_run, name


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_horovod_label_matches_the_recipe(dockerfile):
    spec = importlib.util.spec_from_file_location("build_horovod", ROOT / "docker/horovod/build_horovod.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    assert f"ARG HOROVOD_VERSION={recipe.HOROVOD_VERSION}\n" in dockerfile.read_text()


def test_dockerignore_lets_in_exactly_what_the_dockerfiles_copy():
    patterns = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert patterns[0] == "*"  # deny by default: .nox, .git, results, data and local files stay out
    allowed = [p[1:].rstrip("/") for p in patterns if p.startswith("!")]
    sources = {src for f in DOCKERFILES for line in f.read_text().splitlines() if line.startswith("COPY ")
               for src in line.split()[1:-1] if not src.startswith("--")}
    for src in sources:
        assert (ROOT / src).exists(), src
        assert any(fnmatch.fnmatch(src, p) or src.startswith(p + "/") for p in allowed), src


def test_compose_runs_ddp_on_two_nodes_through_distlab_run():
    # Through `distlab run`, not bare torchrun: each node gets a run directory, the watchdog and
    # the hang report; both nodes differ only in --node-rank.
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    nodes = compose["services"]
    assert sorted(nodes) == ["node0", "node1"]
    commands = []
    for rank, (name, node) in enumerate(sorted(nodes.items())):
        command = node["command"]
        assert node["hostname"] == name and node["networks"] == ["fabric"]
        assert command[:3] == ["distlab", "run", "ddp"]
        assert option_values(command, "--world-size") == ["2"]  # ranks on all nodes together
        assert option_values(command, "--nnodes") == ["2"] and option_values(command, "--node-rank") == [str(rank)]
        assert option_values(command, "--rdzv-endpoint") == ["node0:29400"]
        assert option_values(command, "--backend") == ["gloo"]
        assert option_values(command, "--results") == ["/workspace/results"]
        assert command[command.index("--") + 1:] == ["--smoke"]
        commands.append([arg for arg in command if arg != str(rank)])
    assert commands[0] == commands[1]


def _stages(dockerfile: Path) -> dict[str, tuple[str, str]]:
    """Stage name (or its index) -> (what it is FROM, its text)."""
    stages: dict[str, tuple[str, str]] = {}
    for index, chunk in enumerate(re.split(r"^FROM ", dockerfile.read_text(), flags=re.MULTILINE)[1:]):
        first, _, body = chunk.partition("\n")
        words = first.split()
        name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(index)
        stages[name] = (words[0], body)
    return stages


def test_cpu_image_final_stage_has_no_compilers():
    stages = _stages(ROOT / "docker/Dockerfile.cpu")
    assert "builder" in stages
    # Whole package names: `\b` would not end at the `+` of g++.
    compilers = re.compile(r"(?<![\w.-])(g\+\+|gcc|clang|build-essential|make|cmake|libopenmpi-dev|python3-dev)"
                           r"(?![\w.+-])")
    final = list(stages)[-1]
    # The final stage and every stage it is built on, up to the base image.
    chain, parent = [final], stages[final][0]
    while parent in stages:
        chain.append(parent)
        parent = stages[parent][0]
    assert "builder" not in chain
    assert "builder" in stages[final][1]  # it takes the builder's wheels (a mount, no copy)
    for name in chain:
        installs = [step for step in re.split(r"\n(?=[A-Z]+ )", stages[name][1])
                    if step.startswith("RUN") and ("apt-get install" in step or "pip install" in step)]
        for step in installs:
            assert not compilers.search(step), f"stage {name} installs a compiler: {step}"
    assert compilers.search(stages["builder"][1])


def test_build_cache_settings_reach_buildx_and_only_docker(fake_host):
    env = {**fake_host(0), "CACHE_FROM": "type=gha,scope=x", "CACHE_TO": "type=gha,scope=x,mode=max"}
    argv = dry_run("image-cpu", "ENGINE=docker", env=env)
    assert option_values(argv, "--cache-from") == ["type=gha,scope=x"]
    assert option_values(argv, "--cache-to") == ["type=gha,scope=x,mode=max"]
    assert "--load" in argv
    assert "--load" not in dry_run("image-cpu", "ENGINE=docker", env=fake_host(0))
    done = make("image-cpu", "ENGINE=podman", env=env)
    assert done.returncode == 2 and "CACHE_FROM/CACHE_TO need docker buildx" in done.stderr


WORKFLOW_FILES = sorted((ROOT / ".github").rglob("*.yml"))


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_third_party_actions_are_pinned_by_commit_with_the_release_named(path):
    # A tag can be moved to other code; a commit cannot. The comment says which release it is.
    uses = re.findall(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$", path.read_text(), re.MULTILINE)
    assert uses
    for ref, rest in uses:
        if ref.startswith("./"):
            continue  # this repository's own actions
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), ref
        assert re.fullmatch(r"\s+# v\d+\.\d+\.\d+", rest), f"{ref}: name the release, e.g. `  # v1.2.3`"


# --- With an engine and the built CPU image (nox -s image builds it): labs really run in it. ---

def _engine_with_cpu_image() -> tuple[str | None, str]:
    image = os.environ.get("IMAGE", "distlab:cpu")
    engines = [os.environ["ENGINE"]] if os.environ.get("ENGINE") else ["docker", "podman"]
    for engine in engines:
        if not shutil.which(engine):
            continue
        if subprocess.run([engine, "info"], capture_output=True, timeout=120).returncode != 0:
            continue
        if subprocess.run([engine, "image", "inspect", image], capture_output=True, timeout=120).returncode == 0:
            return engine, image
        return None, f"{engine} has no image {image}; build it with `nox -s image` (or make image-cpu)"
    return None, "no container engine answers here (docker or podman); `nox -s image` installs podman on Debian"


@pytest.mark.engine
@pytest.mark.integration
@pytest.mark.parametrize(("lab", "lab_args"), [("check", ""), ("ddp", "--smoke")])
def test_lab_runs_in_the_cpu_image_as_its_unprivileged_user(lab, lab_args, tmp_path):
    if os.environ.get("DISTLAB_ENGINE_TESTS") != "1":
        # Opt-in: a container engine left on a machine (podman installed by `nox -s image`) may not
        # work in every later sandbox (its network cache, cgroups); `nox -s image` sets this.
        pytest.skip("container tests are opt-in: DISTLAB_ENGINE_TESTS=1 (nox -s image runs them)")
    engine, image = _engine_with_cpu_image()
    if engine is None:
        pytest.skip(image)
    user = subprocess.run([engine, "run", "--rm", image, "id", "-u"], capture_output=True, text=True, timeout=300)
    assert user.returncode == 0 and user.stdout.strip() != "0", user.stderr
    env = {k: v for k, v in os.environ.items() if k not in MAKE_SETTINGS}
    env.update(ENGINE=engine, IMAGE=image, NP="2", LAB_ARGS=lab_args, RESULTS_DIR=str(tmp_path / "results"),
               DATA_DIR=str(tmp_path / "data"))
    done = subprocess.run([str(ROOT / "docker/run-lab.sh"), "lab", lab], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = list((tmp_path / "results" / lab).glob("*/record.json"))
    assert len(records) == 1, done.stdout
    assert '"status": "ok"' in records[0].read_text()
