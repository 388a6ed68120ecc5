"""Hostile: puts a link in place of the observer's folder itself (observe/ -> a folder of its own),
so that a grader checking only the entries below observe/ reads whatever the link points at: another
run's observations, where the sandbox lets it reach them."""
import os
import pathlib

directory = pathlib.Path(os.environ["DISTLAB_OBSERVE_DIR"])  # any program can read its environment
if os.environ.get("RANK", "0") == "0":
    elsewhere = directory.parent / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    if directory.is_dir() and not directory.is_symlink():
        os.rename(directory, directory.parent / "observe.before")
    os.symlink(elsewhere, directory)
