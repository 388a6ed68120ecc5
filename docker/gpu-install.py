"""Add to this Python only what it lacks of distlab's needs, from wheels, into a folder of its own.

    python3 docker/gpu-install.py --wheels .nox/gpu-wheels --target .nox/gpu-site [--checkout .] [--also torchvision]
    export PYTHONPATH=.nox/gpu-site

For the borrowed GPU machine (docker/gpu-acceptance.sh runs it): its python3 is itself a venv holding
torch, and a venv made from it does not see that torch (--system-site-packages shows the base
interpreter's packages, not the venv's), so nothing goes into a venv. pip first says, in a dry run
with no index and with what this Python has counted as installed, which wheels it lacks; only those
are installed, without dependencies, into --target, which is made afresh every time: the project's
own wheel is always the one in --wheels (a rebuilt wheel of the same version is not reinstalled over
an old one). With --checkout, the wheel must hold that checkout's code, or nothing is installed.
A record of what was installed lands in the target (.distlab-install.json). Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from urllib.parse import unquote, urlparse


def die(message: str) -> None:
    print(f"gpu-install.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def own_wheel(wheels: Path) -> Path:
    found = sorted(wheels.glob("distlab-*.whl"))
    if not found:
        die(f"no distlab wheel in {wheels}; run `make gpu-wheels` on a host with internet and copy {wheels} here")
    if len(found) > 1:
        die(f"{len(found)} distlab wheels in {wheels} ({', '.join(p.name for p in found)}); keep the newest only, "
            "or run `make gpu-wheels` afresh")
    return found[0]


def checkout_path(member: str) -> str | None:
    """Where a code file of the wheel lies in a checkout (setup.py): the wheel holds one package,
    distlab/, with the checkout's harness/ and labs/ inside it; distlab/'s own files are its distlab/."""
    parts = member.split("/")
    if parts[0] != "distlab" or member.endswith("/") or len(parts) < 2:
        return None  # the .dist-info folder: made by the build, not code
    return "/".join(parts[1:]) if parts[1] in CODE else member


CODE = ("harness", "labs")  # the checkout's folders that the wheel nests under distlab/


def stale_files(wheel: Path, checkout: Path) -> list[str]:
    """The code files of the wheel that differ from the checkout's, and the checkout's that it lacks
    (named as they lie in the checkout)."""
    with zipfile.ZipFile(wheel) as archive:
        packed = {path: archive.read(name) for name in archive.namelist() if (path := checkout_path(name))}
    differ = [name for name, data in packed.items() if not (checkout / name).is_file()
              or (checkout / name).read_bytes() != data]
    missing = [str(path.relative_to(checkout)) for top in (*CODE, "distlab") for path in (checkout / top).rglob("*.py")
               if "__pycache__" not in path.parts and str(path.relative_to(checkout)) not in packed]
    return sorted(differ + missing)


def lacking(wheel: Path, wheels: Path, also: list[str], env: dict[str, str]) -> list[dict]:
    """What pip would install here for distlab (and `also`), from the wheels alone: its dry-run report."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-index",
                               "--find-links", str(wheels), "--report", str(report), str(wheel), *also],
                              capture_output=True, text=True, env=env)
        if done.returncode != 0:
            if "No module named pip" in done.stderr:
                die(f"{sys.executable} has no pip (python3 -m ensurepip, or the system's python3-pip)")
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()] or ["no output"]
            reason = next((line for line in lines if "No matching distribution" in line), lines[-1])
            die(f"{sys.executable} lacks a package that {wheels} does not hold ({reason}); add it to the "
                "gpu-wheels session (noxfile.py) and run `make gpu-wheels`")
        return json.loads(report.read_text()).get("install", [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, required=True, help="the folder `make gpu-wheels` filled")
    parser.add_argument("--target", type=Path, required=True, help="made afresh: the packages go here")
    parser.add_argument("--checkout", type=Path, help="refuse a distlab wheel built from other code than this")
    parser.add_argument("--also", action="append", default=[], help="another requirement (torchvision)")
    args = parser.parse_args()
    started = time.monotonic()
    wheel = own_wheel(args.wheels)
    if args.checkout and (args.checkout / "harness").is_dir():
        stale = stale_files(wheel, args.checkout)
        if stale:
            die(f"{wheel.name} was built from other code than {args.checkout} ({stale[0]} and {len(stale) - 1} more "
                "differ); run `make gpu-wheels` again and copy the wheels here")
    # The dry run counts what this Python has, not the target of an earlier run (made afresh below).
    target = args.target.resolve()
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != target]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    wanted = lacking(wheel, args.wheels, args.also, env)
    files = [Path(unquote(urlparse(item["download_info"]["url"]).path)) for item in wanted]
    files = [wheel] + [f for f in files if f.name != wheel.name]  # the project's own, always
    if target.exists():
        shutil.rmtree(target)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target",
                    str(target), *map(str, files)], check=True, env=env)
    record = {"python": sys.executable, "target": str(target), "seconds": round(time.monotonic() - started, 1),
              "installed": [{"wheel": f.name, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()} for f in files]}
    (target / ".distlab-install.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"installed into {target} in {record['seconds']} s: " + ", ".join(f.name.split("-")[0] + "-"
                                                                             + f.name.split("-")[1] for f in files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
