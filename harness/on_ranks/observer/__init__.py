"""The observer the harness puts on every rank of a run (see sitecustomize.py).

This folder itself goes first on the ranks' PYTHONPATH, so that Python's `site` imports its
sitecustomize.py at start-up; the package distlab_observer/ holds the hooks (observer.py, which
arms them, and the modules beside it), the names of the files they leave (fileformat.py) and the
state digests (digests.py). Nothing here imports torch until the program does.
"""
