"""Start the distlab observer in every Python process of a run, then hand over to any other sitecustomize.

Python's `site` imports the first `sitecustomize` on sys.path at start-up. The harness puts this
folder first on the ranks' PYTHONPATH, so this file runs in every rank, and in every other Python
process of the run too (torchrun's agent, horovodrun, DataLoader workers): it must be cheap, and
it does nothing at all unless DISTLAB_OBSERVE_DIR is set. It never raises: a failure of the
observer is written to the observe directory, and the program runs as it would without it.

Being first on the path hides whatever sitecustomize came later (a distribution's, a cluster's),
so that one is found and run afterwards, and its errors reach `site` exactly as they would have.
"""

import os
import sys


def _start_observer() -> None:
    directory = os.environ.get("DISTLAB_OBSERVE_DIR")
    if not directory:
        return
    try:
        # Beside this file: its folder is on sys.path, that is how we were found (mypy checks it as
        # harness.on_ranks.observer.distlab_observer, and cannot know that path).
        import distlab_observer  # type: ignore[import-not-found]

        distlab_observer.install(directory)
    except BaseException as error:  # noqa: BLE001 - the observer must never stop the program
        try:
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, f"observer-errors.{os.getpid()}.txt"), "a") as out:
                out.write(f"start: {type(error).__name__}: {error}\n")
        except BaseException:  # noqa: BLE001, S110 - nowhere left to report it
            pass


def _chain_next_sitecustomize() -> None:
    """Run the sitecustomize this one shadows, as `site` would have (its exceptions go to `site`)."""
    import importlib.machinery
    import importlib.util

    # Skip every folder that holds an observer, this one and any other copy: each would chain to the next.
    rest = [entry for entry in sys.path
            if not os.path.isfile(os.path.join(entry or os.curdir, "distlab_observer", "__init__.py"))]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    chained.append(module)


chained: list = []  # the sitecustomize module run after this one, if any
_start_observer()
_chain_next_sitecustomize()
