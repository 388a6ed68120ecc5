"""What the real run needs, checked before anything starts: torch importable, CUDA visible or why
not (PROBE, in a process of its own), the launcher the Gloo rows use, Horovod; also what `--dry-run`
checks."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from labs.common.host import REPO

# Run in a process of its own: the acceptance itself never holds a CUDA context (it would keep GPU
# memory for the whole run), and an import that fails says why in its own words.
PROBE = r"""
import json, os, sys, time
started = time.monotonic()
facts = {"python": sys.executable, "torch": None, "cuda_visible": False, "devices": [], "why_no_cuda": None}
try:
    import torch
except Exception as error:
    facts["torch_error"] = f"{type(error).__name__}: {error}"
    print(json.dumps(facts)); sys.exit(0)
facts.update(torch=torch.__version__, torch_file=torch.__file__, cuda_build=torch.version.cuda,
             nccl=torch.distributed.is_nccl_available(), gloo=torch.distributed.is_gloo_available())
facts["import_s"] = time.monotonic() - started
if torch.version.cuda is None:
    facts["why_no_cuda"] = f"torch {torch.__version__} is a CPU-only build"
elif os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
    facts["why_no_cuda"] = f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} hides every GPU"
elif not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/nvidia0")):
    facts["why_no_cuda"] = "no NVIDIA driver here (/dev/nvidiactl, /proc/driver/nvidia)"
else:
    try:
        torch.cuda.init()
        facts["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        facts["cuda_visible"] = bool(facts["devices"])
        torch.zeros(1, device="cuda").sum().item()  # a context and a kernel: the first CUDA load, paid here
    except Exception as error:
        facts["why_no_cuda"] = f"torch.cuda: {type(error).__name__}: {str(error).strip().splitlines()[0]}"
    if facts["devices"]:
        try:  # provenance only: a failure here says nothing about the GPU
            facts.update(bf16=torch.cuda.is_bf16_supported(), cudnn=torch.backends.cudnn.version(),
                         nccl_version=str(torch.cuda.nccl.version()))
        except Exception as error:
            facts["provenance_error"] = repr(error)
    if not facts["devices"] and not facts["why_no_cuda"]:
        facts["why_no_cuda"] = "torch.cuda.device_count() is 0"
facts["seconds"] = time.monotonic() - started
print(json.dumps(facts))
"""


def probe_torch(timeout_s: float = 300.0) -> dict[str, Any]:
    """torch and CUDA as the steps will find them (PROBE), in a fresh process of this interpreter."""
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=timeout_s)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as error:
        return {"python": sys.executable, "torch": None, "torch_error": f"the probe failed: {error}"}


def horovod_with_nccl(python: str = sys.executable) -> tuple[bool, str]:
    """Whether Horovod is installed and built with NCCL, and if not, why (for the skipped step)."""
    probe = "import horovod.torch as hvd; print(int(hvd.nccl_built()))"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as error:
        return False, f"Horovod could not be asked ({error})"
    if done.returncode != 0:
        return False, "Horovod is not installed (`make setup` builds it; on this host with NCCL)"
    if not int(done.stdout.split()[-1] or 0):
        return False, "Horovod was built without NCCL (`nox -s horovod-nccl` or `make setup` on a GPU host builds it)"
    return True, "Horovod built with NCCL"


def horovod_for_cpus(python: str = sys.executable) -> tuple[bool, str]:
    """The CPU proxy's Horovod row: any Horovod with PyTorch (it runs over Gloo there)."""
    done = subprocess.run([python, "-c", "import horovod.torch"], capture_output=True, text=True, timeout=120)
    return (True, "Horovod installed") if done.returncode == 0 else (
        False, "Horovod is not installed (the GPU machine has none; `make setup` builds it)")


def launcher_env(folder: Path) -> dict[str, str]:
    """The steps' environment: the Gloo rows' torchrun must be this interpreter's own. The harness
    takes the one beside the interpreter first (a venv's bin), then PATH; where this interpreter has
    none beside it (its packages installed with --target), PATH could find another torch's, so a
    torchrun of this interpreter (`python -m torch.distributed.run`) goes first on PATH."""
    shims = folder / "bin"
    shims.mkdir(parents=True, exist_ok=True)
    shim = shims / "torchrun"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run "$@"\n')
    shim.chmod(0o755)
    return {**os.environ, "PATH": os.pathsep.join([str(shims), os.environ.get("PATH", "")])}


def torchrun_for_rows(env: dict[str, str] | None) -> tuple[str | None, bool]:
    """The torchrun the Gloo rows will start (as the harness picks it: beside the interpreter, then
    PATH), and whether it runs this interpreter. env None: before launcher_env made its shim."""
    beside = Path(sys.executable).parent / "torchrun"
    if beside.exists():
        return str(beside), True
    if env is None:
        return f"{sys.executable} -m torch.distributed.run (a shim the run puts first on PATH)", True
    tool = shutil.which("torchrun", path=env.get("PATH"))
    if tool is not None:
        with contextlib.suppress(OSError):
            return tool, sys.executable in Path(tool).read_text(errors="replace")[:400]
    return tool, False


def install_record() -> dict[str, Any] | None:
    """What docker/gpu-install.py installed for this run: it leaves a record at the top of its target,
    beside the distlab package, whose folder REPO is in an installed wheel (none in a checkout)."""
    if not (REPO / "__init__.py").is_file():
        return None  # a checkout: harness/ and labs/ at its top, no install of ours
    with contextlib.suppress(OSError, ValueError):
        return json.loads((REPO.parent / ".distlab-install.json").read_text())
    return None


def preflight(cpu_proxy: bool, env: dict[str, str] | None) -> tuple[dict[str, Any], list[str]]:
    """What the real run needs, checked before anything starts: the facts, and each problem that
    would stop it, in one line naming the fix."""
    torch = probe_torch()
    tool, own = torchrun_for_rows(env)
    facts = {"torch": torch, "distlab_from": str(REPO), "installed": install_record(), "torchrun": tool,
             "torchrun_is_this_pythons": own}
    problems = []
    if not torch.get("torch"):
        problems.append(f"torch is not importable by {sys.executable} ({torch.get('torch_error')}); run this with "
                        "the Python that has torch (docker/gpu-acceptance.sh: PYTHON=/path/to/python3)")
    elif not cpu_proxy and not torch.get("cuda_visible"):
        problems.append(f"no GPU is visible to torch {torch['torch']} ({torch.get('why_no_cuda')}); the GPU "
                        "acceptance needs one (`--cpu-proxy` runs its plan on the CPUs, `make grade` grades them)")
    if not own:
        problems.append(f"the Gloo rows would start {tool or 'no torchrun'}, not this Python's ({sys.executable})")
    return facts, problems
