"""One job's sandbox as the entering program reads it, and what every run reads."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Spec:
    """One job's sandbox, as the entering program reads it (JSON, written by the grader)."""

    uid: int
    limits: dict
    read_only: list[str]  # folders and files bound read-only at their own paths: the system, the repository
    hidden: list[str]  # folders masked by an empty tmpfs (other submissions, the class's results)
    own: list[str] = field(default_factory=list)  # the submission's own folder, read-only, bound after `hidden`
    cgroup_procs: list[str] = field(default_factory=list)  # cgroup.procs files the entering process joins
    gpus: list[int] | None = None  # GPU indices of this job: only their device files bound
    env: dict[str, str] = field(default_factory=dict)
    # "bwrap": the namespaces above; "uid": where namespaces are refused (a container), the job's uid,
    # its limits and its cgroup alone (uid_argv), with the grader's files made private (make_private).
    mode: str = "bwrap"
    job_folder: str = ""  # uid mode: the folders from here down to a run's are made passable to the uid

    def write(self, path: Path) -> Path:
        from harness.files import write_json  # here: the entering program has only the standard library

        write_json(path, asdict(self))
        return path


# Of the repository, what a run reads: the harness (the observer, the reference loops) and the labs
# (the course's programs, labs/common). Never the rest: .git, caches, earlier results, another week's
# submissions kept in the checkout.
REPOSITORY_PARTS = ("harness", "labs")


def base_read_only(python: str = sys.executable) -> list[str]:
    """What every run needs to read: the system, the interpreter the environment was made from, the
    environment, the repository's harness and labs."""
    from harness.catalog import REPO  # imported here: the entering program has only the standard library

    prefixes = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    interpreter = Path(os.path.realpath(python)).parent.parent  # the venv's python: a link into its base prefix
    return sorted({"/usr", "/etc", *(str(REPO / part) for part in REPOSITORY_PARTS), str(interpreter), *prefixes})
