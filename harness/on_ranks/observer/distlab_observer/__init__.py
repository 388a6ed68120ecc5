"""The observer of one rank (observer.py and the modules beside it: what it records, and how):
`install(directory)` arms it.

This package's folder goes first on the ranks' PYTHONPATH, so it holds one name only (a sibling
module would shadow a student's module of the same name); nothing is imported at start-up but what
`install` needs, and nothing of torch until the program imports it. The grader imports fileformat.py
(the file names) and digests.py (the evaluator) from here without starting anything.
"""


def install(directory: str) -> None:
    """Arm the hooks in this process (once); they take effect when torch and horovod.torch load."""
    from .observer import install as arm

    arm(directory)
