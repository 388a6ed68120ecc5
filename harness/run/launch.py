"""What a run starts: the ranks' environment, the launch spec and the launcher's command line."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from harness.catalog import REPO
from harness.on_ranks import OBSERVER
from harness.run.launchers import LAUNCHERS, LaunchSpec
from harness.run.request import RunRequest
from harness.run.run_dir import OBSERVE_DIR, RUN_DIR_PLACEHOLDER
from labs.common.host import free_port, git_commit

# Collective timeout handed to the labs (their --timeout): under the watchdog, so a backend names
# the stuck collective before the watchdog has to end the run, but never so short that a slow
# start or a checkpoint write on rank 0 trips it.
LAB_TIMEOUT_BOUNDS_S = (30.0, 120.0)


def lab_timeout_s(watchdog_s: float) -> float:
    low, high = LAB_TIMEOUT_BOUNDS_S
    return min(high, max(low, watchdog_s / 2))


# What a sandboxed run (grade-class: an untrusted program) gets of the grader's environment: the
# system's and the numeric libraries' settings, by name, and nothing else. A token, a password or a
# path in the grader's environment never reaches a student's program (the launch adds its own).
SANDBOX_ENV_NAMES = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES",
                     "CUDA_HOME", "CUDA_DEVICE_ORDER")
SANDBOX_ENV_PREFIXES = ("LC_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "ATEN_", "NCCL_", "GLOO_")


def sandbox_environment(environ: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in environ.items()
            if name in SANDBOX_ENV_NAMES or name.startswith(SANDBOX_ENV_PREFIXES)}


def _gives(args: list[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in args)


def launch_plan(request: RunRequest, run_dir: Path, run_id: str, store_served: bool = False
                ) -> tuple[dict[str, str], LaunchSpec, list[str], str]:
    """What a run starts: the environment, the launch spec, the launcher's command line, and that
    command as a person would paste it (the settings that matter in front)."""
    env = sandbox_environment(dict(os.environ)) if request.sandbox else dict(os.environ)
    observer = [str(OBSERVER)] if request.observe else []
    env.update({
        "DISTLAB_RUN_ID": run_id,
        "OMP_NUM_THREADS": str(request.threads),
        "PYTHONUNBUFFERED": "1",  # ranks' lines reach the logs as they happen
        "MASTER_ADDR": "127.0.0.1",  # single node: rendezvous stays on loopback
        "MASTER_PORT": str(free_port()),
        "PYTHONPATH": os.pathsep.join(filter(None, [*observer, str(REPO), env.get("PYTHONPATH")])),
        **({"DISTLAB_OBSERVE_DIR": str(run_dir / OBSERVE_DIR)} if request.observe else {}),
        **backend_env(request.backend, run_dir),
        **LAUNCHERS[request.launcher].env,
        **request.extra_env,
    })
    commit = git_commit()
    if commit:
        env["DISTLAB_GIT_COMMIT"] = commit
    spec = LaunchSpec(
        program=request.program,
        lab_args=["--backend", request.backend, "--record", str(run_dir / "record.json"),
                  *([] if _gives(request.lab_args, "--timeout") else
                    ["--timeout", f"{lab_timeout_s(request.timeout_s):g}"]),
                  *(arg.replace(RUN_DIR_PLACEHOLDER, str(run_dir)) for arg in request.lab_args)],
        world_size=request.world_size,
        log_dir=run_dir / "logs",
        python=request.python,
        env_names=tuple(name for name in ("DISTLAB_RUN_ID", "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "MASTER_ADDR",
                                          "MASTER_PORT", "PYTHONPATH", "DISTLAB_GIT_COMMIT", "DISTLAB_OBSERVE_DIR",
                                          *backend_env(request.backend, run_dir), *request.extra_env)
                        if name in env),
        max_restarts=request.max_restarts,
        rdzv_store_served=store_served,
        **request.placement,
    )
    command = [*(arg.replace(RUN_DIR_PLACEHOLDER, str(run_dir)) for arg in request.sandbox),
               *LAUNCHERS[request.launcher].command(spec)]
    shown_env = {"OMP_NUM_THREADS": str(request.threads), **backend_env(request.backend, run_dir),
                 **LAUNCHERS[request.launcher].env}
    shown = " ".join(f"{name}={shell_word(value)}" for name, value in shown_env.items()) + \
        " " + " ".join(map(shell_word, command))
    return env, spec, command, shown


def shell_word(word: str) -> str:
    """One word of a command a person pastes into bash (command.txt, --dry-run): quoted by shlex, or,
    where it holds a control character (a program's file name can), in bash's $'...' with the
    character as an escape: shown, never obeyed by the terminal that shows it."""
    if word.isprintable():
        return shlex.quote(word)
    return "$'" + "".join(c if c.isprintable() and c not in "'\\" else
                          f"\\{c}" if c in "'\\" else f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
                          for c in word) + "'"


def backend_env(backend: str, run_dir: Path) -> dict[str, str]:
    """Settings a backend needs from the environment. NCCL: torch's flight recorder keeps the last
    collectives of every rank and dumps them into the run directory when a collective times out,
    so a GPU hang report says which collective each rank was in."""
    if backend != "nccl":
        return {}
    return {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_FR_DUMP_TEMP_FILE": str(run_dir / "nccl_flight_recorder.rank_")}


def dry_run(request: RunRequest) -> str:
    """The command `run_lab` would start for this request, started nothing and written nothing."""
    run_dir = request.results_root / request.lab / "<new run>"
    return launch_plan(request, run_dir, "<run id>")[3]
