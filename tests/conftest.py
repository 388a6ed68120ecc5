"""Shared fixtures. Integration tests drive labs exactly as users do: through `distlab run`."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

DISTLAB = str(Path(sys.executable).parent / "distlab")


@dataclass
class LabRun:
    returncode: int
    output: str
    run_dir: Path | None
    record: dict[str, Any] | None
    run: dict[str, Any] | None  # the harness's run.json


def run_distlab(args: list[str], timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DISTLAB, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return tmp_path / "results"


@pytest.fixture
def distlab_run(results: Path):
    """result = distlab_run("ddp", world_size=2, lab_args=["--smoke"], launcher=None, backend=None)"""

    def run(lab: str, world_size: int, lab_args: list[str] | tuple[str, ...] = (), launcher: str | None = None,
            backend: str | None = None, threads: int | None = 1, timeout: float = 300,
            extra: list[str] | tuple[str, ...] = ()) -> LabRun:
        args = ["run", lab, "--world-size", str(world_size), "--results", str(results), "--timeout", str(timeout)]
        if launcher:
            args += ["--launcher", launcher]
        if backend:
            args += ["--backend", backend]
        if threads:
            args += ["--threads", str(threads)]
        args += [*extra, "--", *lab_args]
        done = run_distlab(args, timeout=timeout + 120)
        output = done.stdout + done.stderr
        run_dir = None
        for line in output.splitlines():
            if line.startswith("run directory: "):
                run_dir = Path(line.split(": ", 1)[1].strip())
        return LabRun(done.returncode, output, run_dir,
                      _load(run_dir / "record.json") if run_dir else None,
                      _load(run_dir / "run.json") if run_dir else None)

    return run


@pytest.fixture
def run_main(monkeypatch, capsys):
    """Call a lab's main() in this process with argv; return its exit code and stderr.

    For bad-input tests: the lab must stop with SystemExit before starting anything.
    """

    def call(main, program: str, *argv: str) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", [program, *argv])
        with pytest.raises(SystemExit) as stop:
            main()
        return stop.value.code, capsys.readouterr().err

    return call
