"""A class graded: a folder of submissions, each graded as the untrusted code it is, side by side.

A stage between grading/ (each submission is graded as `distlab grade --program` grades one) and the
`grade-class` command (harness/commands/grade_class.py):

    submissions.py  the class's folder read: one submission per student, or why one cannot be graded
    sandbox/        bubblewrap around each run's launcher: loopback only, read-only harness, one folder
                    writable, a uid of its own, limits (cgroup + rlimits), each breach named; a module
                    per concern (bubblewrap, uid, cgroups, seccomp, limits, monitor, enter)
    job.py          one submission graded in a process of its own (grading.plan_grade, execute); what
                    it observed stored, so verdicts can be recomputed without training
    pool.py         up to N jobs at once, each on a slot (its GPUs), stopped together
    classroom.py    the class opened: its request checked, its settings, which to grade (resume, rerun, regrade)
    grading_loop.py the class graded: the pool's jobs (or a Slurm array's), pages as each ends, the gradebook
    outcome.py      a job's outcome: its stored runs judged and scored, what ended a run early
    cluster.py      the class on Slurm (--slurm): one array task per job, each graded on its node as here
    rubric.py       points per check, partial credit, visibility
    lessons.py      what a failed check means, the one-line fix, the lesson that teaches it
    account.py      one account of a submission: the cause first, not reached, each item's reason, points
    outputs.py      gradebook CSV, class page, each student's files (feedback.py: feedback pages;
                    platforms.py: Gradescope's and PrairieLearn's results.json)
    bundle.py       the Gradescope autograder bundle; gradescope.py: what runs in Gradescope's container

Design and threat model: docs/grading-class.md, docs/threat-model.md.
"""
