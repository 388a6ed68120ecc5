"""noxfile.py, the one list of what can be run: every session the project tells people to run exists.

A merge once dropped the `@nox.session` line of `k8s`: the function stayed, `nox -s k8s` (named in
README.md and docs/multinode.md) answered "Sessions not found: k8s", and nothing noticed. The
registry is read from the noxfile's source (the decorators nox reads), so this runs without nox.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# `nox -s NAME`, `$(NOX) -s NAME`, `nox -s "bench(what='train')"`: the session is the name before "(".
NAMED = re.compile(r"(?:\bnox|\$\(NOX\))(?:\s+-[A-Za-z]+)*\s+-s\s+(\"[^\"]+\"|'[^']+'|[\w-]+)")
WHERE_NAMED = ("README.md", "Makefile", "docs", ".github", "docker", "noxfile.py")


def registered_sessions(source: str) -> set[str]:
    """The sessions nox would list: each function decorated with nox.session, by its name= or its own."""
    names = set()
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            target = call.func if call else decorator
            if ast.unparse(target) != "nox.session":
                continue
            given = [k.value.value for k in (call.keywords if call else []) if k.arg == "name"]
            names.add(given[0] if given else node.name)
    return names


def named_sessions() -> dict[str, str]:
    """Every session the docs, README, Makefile, workflows and scripts tell someone to run, and where."""
    files = [p for where in WHERE_NAMED for p in ([REPO / where] if (REPO / where).is_file()
                                                  else sorted((REPO / where).rglob("*")))
             if p.is_file() and p.suffix in ("", ".md", ".yml", ".yaml", ".sh", ".py")]
    named = {}
    for path in files:
        for match in NAMED.finditer(path.read_text(errors="replace")):
            named.setdefault(match.group(1).strip("\"'").split("(")[0], str(path.relative_to(REPO)))
    return named


def test_every_session_the_docs_name_is_one_nox_lists():
    sessions = registered_sessions((REPO / "noxfile.py").read_text())
    named = named_sessions()
    assert {"tests", "k8s", "gpu-proxy", "slurm", "gradescope"} <= set(named)  # the scan finds what is there
    missing = {name: where for name, where in named.items() if name not in sessions}
    assert not missing, f"named but not a nox session (an @nox.session line lost?): {missing}"


def test_a_session_without_its_decorator_is_not_listed():
    """The check itself: the noxfile with k8s's decorator dropped, as the merge left it."""
    source = (REPO / "noxfile.py").read_text()
    decorated = '@nox.session(venv_backend="none", requires=["env"], default=False)\ndef k8s('
    assert decorated in source
    assert "k8s" in registered_sessions(source)
    assert "k8s" not in registered_sessions(source.replace(decorated, "def k8s("))


def noxfile_module(monkeypatch) -> types.ModuleType:
    """noxfile.py imported where nox is not installed: a stand-in for nox's decorators (nox's own
    code, not distlab's), so that the noxfile's own functions can be called."""
    fake = types.ModuleType("nox")

    def session(*args, **kwargs):
        return args[0] if args and callable(args[0]) else (lambda function: function)

    fake.session, fake.parametrize = session, lambda *a, **k: (lambda function: function)
    fake.options = types.SimpleNamespace()
    fake.Session = object
    fake.project = types.SimpleNamespace(load_toml=lambda path: __import__("tomllib").loads(Path(path).read_text()))
    monkeypatch.setitem(sys.modules, "nox", fake)
    spec = importlib.util.spec_from_file_location("distlab_noxfile", REPO / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{text}\n")
    path.chmod(0o755)
    return path


def test_the_gpu_proxy_skips_pyenv_s_shim_and_finds_an_installed_3_12(tmp_path, monkeypatch):
    """On a pyenv host python3.12 on PATH is the shim, which exits 127 unless 3.12 is active: the
    session ended there, exit 127, its hint never printed. The shim and the install stand for the
    machine's; each is run as the session runs it."""
    noxfile = noxfile_module(monkeypatch)
    shim = script(tmp_path / "shims" / "python3.12", "echo \"pyenv: python3.12: command not found\" >&2; exit 127")
    monkeypatch.setenv("PATH", f"{shim.parent}:/usr/bin:/bin")
    monkeypatch.delenv("GPU_PROXY_PYTHON", raising=False)
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    base, tried = noxfile.gpu_host_base()
    assert base is None and tried == [f"{shim} (exit 127)"]  # named in the session's one-line error
    installed = script(tmp_path / "pyenv" / "versions" / "3.12.3" / "bin" / "python3.12", "echo 3.12")
    assert noxfile.gpu_host_base() == (str(installed), [f"{shim} (exit 127)"])
    monkeypatch.setenv("GPU_PROXY_PYTHON", str(shim))  # what a person names is the only one tried
    assert noxfile.gpu_host_base() == (None, [f"{shim} (exit 127)"])



def test_verify_deploy_names_each_place_s_first_cause_or_why_it_cannot_run_here(monkeypatch):
    noxfile = noxfile_module(monkeypatch)
    assert [place for _, place, _ in noxfile.DEPLOY_PLACES] == ["gpu-proxy", "gradescope", "k8s", "slurm"]
    assert sum(minutes for *_, minutes in noxfile.DEPLOY_PLACES) <= 90
    log = ("nox > Running session k8s\ncollected 4 items\ntests/test_k8s_operators.py F\n"
           "E   AssertionError: the launcher exited 1\nE   more\nFAILED tests/test_k8s_operators.py::x\n"
           "nox > Session k8s failed.\n")
    assert noxfile.first_cause(log) == "E   AssertionError: the launcher exited 1"
    assert noxfile.first_cause("nox > Running session slurm\nnox > error: needs Debian's slurm-wlm\n"
                               "nox > Session slurm failed.") == "nox > error: needs Debian's slurm-wlm"
    monkeypatch.setattr(noxfile.shutil, "which", lambda name: None)  # a host with none of the tools
    monkeypatch.setattr(noxfile.os, "geteuid", lambda: 1000)
    assert "bubblewrap" in noxfile.deploy_refusal("gpu-proxy")
    assert "no container engine" in noxfile.deploy_refusal("gradescope")
    assert "no Slurm" in noxfile.deploy_refusal("slurm")
    # Where we are root with apt-get, what the sessions install themselves (bubblewrap, podman, Slurm)
    # is no reason: a fresh host proves every place.
    monkeypatch.setattr(noxfile.shutil, "which", lambda name: "/usr/bin/apt-get" if name == "apt-get" else None)
    monkeypatch.setattr(noxfile.os, "geteuid", lambda: 0)
    monkeypatch.setattr(noxfile, "gpu_host_base", lambda: ("/usr/bin/python3.12", []))
    assert [noxfile.deploy_refusal(place) for place in ("gpu-proxy", "gradescope", "k8s", "slurm")] == [None] * 4


def test_the_engine_is_read_from_engine_sh_s_last_line_after_its_progress(monkeypatch):
    """A fresh host: docker/engine.sh installs podman and builds a base first, and a silent session.run
    returns that progress with the answer (`nox -s k8s` failed: "too many values to unpack")."""
    noxfile = noxfile_module(monkeypatch)

    class Session:
        def run(self, *args, **kwargs):
            assert args[0] == "docker/engine.sh" and kwargs["silent"]
            return "Setting up podman (4.3.1) ...\nwrote /etc/containers/containers.conf\n" \
                   "podman localhost/distlab-base:bookworm\n"

    assert noxfile._engine(Session()) == ("podman", "localhost/distlab-base:bookworm")
