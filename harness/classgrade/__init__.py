"""`distlab grade-class`: a folder of submissions graded as the untrusted code each is, side by side.

    sandbox.py    bubblewrap around each run's launcher: loopback only, read-only harness, one folder
                  writable, a uid of its own, limits (cgroup + rlimits), each breach named
    job.py        one submission graded in a process of its own, as `distlab grade --program` grades one;
                  what it observed stored, so verdicts can be recomputed without training
    rubric.py     points per check, partial credit, visibility
    lessons.py    what a failed check means, the one-line fix, the lesson that teaches it
    outputs.py    gradebook CSV, class page, feedback pages, Gradescope's and PrairieLearn's results.json
    bundle.py     the Gradescope autograder bundle; gradescope.py: what runs in Gradescope's container
    classroom.py  the command: submissions found, the pool, resume, --rerun, --regrade

Design and threat model: docs/grading-class.md, docs/threat-model.md.
"""
