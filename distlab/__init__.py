"""distlab's one top-level package: the `distlab` command and `python -m distlab`.

The harness and the labs import each other absolutely (`harness.x`, `labs.common.x`), and every
rank finds `labs` through the folder that holds harness/ and labs/ on its PYTHONPATH
(harness/run/launch.py; harness/catalog.py calls that folder REPO). A checkout is that folder,
and its editable install puts it on sys.path. An installed wheel keeps harness/ and labs/ inside
this package (pyproject.toml), so that site-packages holds only `distlab` and no generic
`harness` or `labs` that another project could shadow or be shadowed by; the entry point below
puts this folder first on sys.path of the distlab process alone. REPO is then this folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

HOME = Path(__file__).resolve().parent  # an installed wheel's distlab/: harness/ and labs/ inside


def main() -> int:
    """The `distlab` command: the harness's command line, imported from the folder that holds it."""
    if (HOME / "harness").is_dir() and str(HOME) not in sys.path:
        sys.path.insert(0, str(HOME))
    from harness.commands.cli import main as cli_main

    return cli_main()
