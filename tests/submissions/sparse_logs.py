"""Hostile: makes its own output files sparse and huge (ftruncate of stdout and stderr to 60 MiB each,
taking no disk): a grader copying rank logs without a bound writes 240 MiB for two ranks, as root,
and the monitor then blames the program for the grader's copies."""
import os

for fd in (1, 2):  # torchrun's redirect of this rank's stdout and stderr: logs/<run>/attempt_0/<rank>/
    os.ftruncate(fd, 60 << 20)
raise SystemExit(1)
