"""`distlab bench submission`: one submission's grade beside an earlier commit's, in a box of its own.

The benchmark as installed, on one cell (the course's DDP lab at world size 2, no reference runs), and
the checkout's own HEAD as the earlier commit: both versions grade the same program the same way, and
each grade's seconds and, as root, the peak memory of its cgroup are printed. No time is asserted."""

from __future__ import annotations

import os
import re

import pytest
from conftest import run_distlab
from test_grade_class import class_profile  # the class tests' one cell: cpu-smoke's ddp at 2, no band


def test_bad_sizes_and_commits_are_one_line_and_exit_2(tmp_path):
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "earlier-grade").write_text("kept")
    for args, words in ((["--memory", "12"], "less than 64 MB"), (["--memory", "lots"], "size such as 768M"),
                        (["--cpus", "0"], "more than 0"), (["--against", "no-such-commit"], "no such commit"),
                        (["--keep", str(kept)], "is not empty")):
        done = run_distlab(["bench", "submission", *args, *(["--keep", str(tmp_path / "k")] if "--keep" not in args
                                                             else [])])
        assert done.returncode == 2 and words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done
    assert [p.name for p in kept.iterdir()] == ["earlier-grade"]  # nothing of it touched


@pytest.mark.integration
def test_this_checkout_and_an_earlier_commit_grade_the_course_lab_alike(tmp_path):
    done = run_distlab(["bench", "submission", "--against", "HEAD", "--repeats", "1",
                        "--profile", str(class_profile(tmp_path)), "--keep", str(tmp_path / "bench")], timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = re.findall(r"^  (this checkout|--against HEAD) 1: graded (\S+) in [\d.]+ s(.*)$", done.stdout, re.M)
    assert [name for name, _, _ in lines] == ["this checkout", "--against HEAD"], done.stdout
    assert len({score for _, score, _ in lines}) == 1  # the same program, the same grade
    assert re.search(r"this checkout / HEAD: [\d.]+ x the seconds per submission", done.stdout)
    if os.geteuid() == 0:  # a cgroup per grade: its peak memory (torch at two ranks: hundreds of MiB)
        peaks = [int(m) for _, _, rest in lines for m in re.findall(r"peak (\d+) MiB", rest)]
        assert len(peaks) == 2 and all(peak > 200 for peak in peaks), done.stdout
    # The earlier commit ran from its own files, beside the checkout's.
    assert list((tmp_path / "bench").glob("distlab-*/harness/commands/cli.py"))
