"""The folder the caller names (--out): acceptance.json (the steps, their seconds, the preflight, the
estimate), acceptance.log (every step's output), doctor.json, the profile, and acceptance.tar.gz
(the whole results folder without weights), all rewritten after each step, so a run cut short still
returns what ran."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tarfile
import time
from pathlib import Path
from typing import Any

from harness.files import write_json
from harness.grading.disk import WEIGHTS
from harness.verdict.profiles import tomllib

# What never goes into the archive: trained weights and checkpoints (grading/disk.WEIGHTS; a ResNet-18
# run leaves about 45 MB, the whole acceptance 450-550 MB), each named with its size in left-out.json instead.
ARCHIVE_MEMBER_MAX = 4 << 20  # a larger file is left out too (and named): the archive must stay a few MiB
OUT_FILES = ("acceptance.json", "acceptance.log", "doctor.json", "acceptance.tar.gz")  # and the profile


class Outbox:
    """The folder the caller names (--out): a handful of small files at its top (the machine lent
    returns at most 8), each replaced whole (written, then renamed) after every step, so that
    whenever the run is stopped, what lies there is complete and readable."""

    def __init__(self, out: Path, folder: Path) -> None:
        self.out, self.folder = out, folder

    def write_json(self, name: str, data: Any) -> None:
        write_json(self.out / name, json.loads(json.dumps(data, default=str)))  # by rename

    def copy(self, source: Path) -> None:
        if source.is_file() and source.resolve().parent != self.out.resolve():
            partial = self.out / f".{source.name}.partial"
            shutil.copyfile(source, partial)
            os.replace(partial, self.out / source.name)

    def archive(self) -> dict[str, Any]:
        """The results folder as acceptance.tar.gz, weights and oversized files left out (and named)."""
        started = time.monotonic()
        left_out = []
        own = {(self.out / name).resolve() for name in OUT_FILES}
        partial = self.out / ".acceptance.tar.gz.partial"
        with tarfile.open(partial, "w:gz") as tar:
            for path in sorted(self.folder.rglob("*")):
                if path.is_symlink() or not path.is_file() or path.resolve() in own or path.name.endswith(".partial"):
                    continue
                size = path.stat().st_size
                if path.suffix in WEIGHTS or size > ARCHIVE_MEMBER_MAX:
                    left_out.append({"path": str(path.relative_to(self.folder)), "bytes": size})
                    continue
                with contextlib.suppress(OSError):  # a file a run is still writing may vanish
                    tar.add(path, arcname=f"{self.folder.name}/{path.relative_to(self.folder)}", recursive=False)
            listing = json.dumps(left_out, indent=1).encode()
            info = tarfile.TarInfo(f"{self.folder.name}/left-out.json")
            info.size, info.mtime = len(listing), int(time.time())
            tar.addfile(info, io.BytesIO(listing))
        os.replace(partial, self.out / "acceptance.tar.gz")
        return {"bytes": (self.out / "acceptance.tar.gz").stat().st_size, "left_out": len(left_out),
                "left_out_bytes": sum(item["bytes"] for item in left_out),
                "seconds": round(time.monotonic() - started, 2)}

    def collect(self, name: str, summary: dict[str, Any]) -> None:
        """After every step: the doctor's facts, the profile, the grade's summary, the archive, the summary."""
        profile = self.folder / "profiles" / f"{name}.toml"
        self.copy(self.folder / "doctor.json")
        self.copy(profile)
        with contextlib.suppress(OSError, ValueError):
            summary["grade"] = json.loads((self.folder / "grade.json").read_text())
        with contextlib.suppress(OSError):
            summary["claim_spread"] = (self.folder / "claim-spread.txt").read_text().splitlines()
        with contextlib.suppress(OSError, ValueError):
            written = sorted(tomllib.loads(profile.read_text()).get("labs", {}))
            summary["profile_rows"] = written
            summary["rows_left_out_of_profile"] = [row for row in summary["rows"] if row not in written]
        summary["archive"] = self.archive()
        self.write_json("acceptance.json", summary)
