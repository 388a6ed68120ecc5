"""Each submission's runs inside bubblewrap: what it can see, reach, write and use, and every breach named.

The whole launcher (torchrun and its ranks, or the one python process) starts inside one sandbox
per run, so the ranks still meet over loopback, and nothing else is reachable:

    bwrap: new network namespace (loopback only), new pid, ipc and uts namespaces, a new session
      read-only: /usr (and the /bin, /lib links), /etc, the interpreter's prefix, the repository
        (harness, labs, the environment in .nox/env), the submission's own folder, the data
      hidden:    every other folder of the class (submissions, results) under those, by an empty tmpfs
      writable:  the run's own directory; a private /tmp and /dev/shm (tmpfs, charged to its memory)
    setpriv: a uid and gid of the job's own (never root), no capabilities, no_new_privs
    prlimit: open files, processes (per uid: the job's own), file size (its output), no core dumps
    cgroup (v1 or v2, where writable): memory (RAM and swap), processes

The grader creates the job's cgroup and watches it from outside while the job runs (Monitor): a job
that hits the process limit or writes more than its output limit into its folder is stopped at
once, and the kernel's OOM killer ends one that needs more memory than it may have; each breach is
kept by name ("started more than 512 processes"). What the sandbox refused a program (a
connection off loopback, a write to a read-only file) is named from the program's own output
(`denials`): a program that swallows the error is still contained, only not named.

One module per concern; callers import the one they need (no names re-exported here):

    limits.py      what a job may use (Limits), each breach's words
    cgroups.py     the job's cgroup (v1 or v2): memory and process limits, its counters, killing what is in it
    spec.py        one job's sandbox as the entering program reads it (Spec), what every run reads
    bubblewrap.py  bwrap's command line: namespaces, binds, the private /tmp, the job's GPUs
    seccomp.py     the system calls refused inside (keyrings, user namespaces)
    uid.py         a uid of the job's own: claimed per job, rlimits, every process of it ended
    monitor.py     the job watched from outside while it runs; the refusals named from its output
    private.py     uid mode: the grader's files closed to other users, a job's folder handed back to root
    enter.py       the program that enters the sandbox (`python -I enter.py SPEC RUN_DIR -- CMD`): it runs
                   as the grader, joins the cgroup, hands the run directory to the job's uid and execs
                   bwrap (or, in uid mode, the job's command); the standard library and these modules only
"""
