"""What a submission leaves is hostile input too (issue 36), part by part, without a class grade: the one
reader and the folder walk, the submissions folder read defensively, the sandbox's environment, binds
and seccomp filter, names that reach files and spreadsheets, text that reaches Markdown, and the
grader's own deadline. tests/test_grade_class.py grades the hostile submissions themselves."""

from __future__ import annotations

import errno
import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import write_rank_observation

from harness import files
from harness.catalog import REPO
from harness.classgrade import account, feedback, outputs, pool, submissions
from harness.classgrade.sandbox import cgroups
from harness.classgrade.sandbox.bubblewrap import bwrap_argv
from harness.classgrade.sandbox.cgroups import Cgroup
from harness.classgrade.sandbox.limits import Limits
from harness.classgrade.sandbox.monitor import folder_usage
from harness.classgrade.sandbox.seccomp import (
    _ALLOW,
    _ERRNO,
    _JEQ,
    _JGE,
    _JSET,
    _LD_ABS,
    _RET,
    ARCHES,
    CLONE_NEWUSER,
    SYSCALLS,
    X32_SYSCALL_BIT,
    seccomp_fd,
    seccomp_filter,
)
from harness.classgrade.sandbox.spec import Spec, base_read_only
from harness.classgrade.sandbox.uid import FIRST_UID
from harness.observe import observations
from harness.report.pages import md_code
from harness.run import launch
from harness.run.request import RunRequest

MARKER = "distlab-test-secret-b1f3"


def within(seconds: float, call, *args):
    """call(*args) in a thread; its result, or a failure if it has not returned in `seconds` (it blocked)."""
    result: list = []
    worker = threading.Thread(target=lambda: result.append(call(*args)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"{call.__name__} blocked for {seconds} s"
    return result[0]


# ------------------------------------------------------------------------------------ the one reader

def test_a_folder_is_measured_past_path_max_without_following_a_link(tmp_path):
    top = tmp_path / "run"
    top.mkdir()
    deep = os.open(top, os.O_RDONLY)
    for level in range(20):  # 20 x 250 characters: past PATH_MAX (4096), where a walk by paths fails
        name = f"{level:02d}" + "d" * 248
        os.mkdir(name, dir_fd=deep)
        deeper = os.open(name, os.O_RDONLY, dir_fd=deep)
        os.close(deep)
        deep = deeper
    fd = os.open("payload", os.O_WRONLY | os.O_CREAT, dir_fd=deep)
    os.write(fd, b"\1" * (1 << 20))
    os.close(fd)
    os.close(deep)
    (tmp_path / "big").write_bytes(b"\1" * (4 << 20))
    (top / "link").symlink_to(tmp_path / "big")  # its target's 4 MiB are not the folder's
    os.mkfifo(top / "pipe")
    usage = files.tree_usage(top)
    assert usage.error is None and usage.depth == 20 and usage.entries == 23  # 20 folders, the payload, 2
    assert (1 << 20) <= usage.bytes < (2 << 20)
    assert sorted(usage.special) == [("link", "a symbolic link"), ("pipe", "a FIFO")]
    assert "more than 10 entries" in files.tree_usage(top, max_entries=10).error
    assert "nested more than 5 deep" in files.tree_usage(top, max_depth=5).error


def test_the_sandbox_breaches_on_size_entries_depth_and_what_it_cannot_measure(tmp_path):
    limits = Limits(output_bytes=1 << 20, files=5, depth=2)
    (tmp_path / "a").mkdir()
    assert folder_usage(tmp_path, limits)[1] is None
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    assert folder_usage(tmp_path, limits)[1] == "depth"
    shutil.rmtree(tmp_path / "a")
    for n in range(6):
        (tmp_path / str(n)).write_text("")
    assert folder_usage(tmp_path, limits)[1] == "files"
    for n in range(6):
        (tmp_path / str(n)).unlink()
    (tmp_path / "f").write_bytes(b"\1" * (2 << 20))
    assert folder_usage(tmp_path, limits)[1] == "output"
    assert folder_usage(tmp_path / "missing", limits)[1] == "unmeasurable"
    assert "could not measure" in limits.breach("unmeasurable")


def test_observations_planted_as_links_fifos_and_devices_are_problems_never_read(tmp_path):
    secret = tmp_path / "classmate.py"
    secret.write_text("alice's first line\n")
    write_rank_observation(tmp_path, 1)
    (tmp_path / "observer-errors.0.txt").symlink_to(secret)
    (tmp_path / "rank.0.json").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "observer-errors.1.txt")
    os.mkfifo(tmp_path / "rank.2.json")
    seen = within(30, observations.load, tmp_path)
    assert sorted(seen.ranks) == [1]
    text = " ".join(seen.problems)
    assert "alice's first line" not in text
    assert "rank.0.json unreadable" in text and "is a symbolic link" in text
    assert "rank.2.json unreadable" in text and "is a FIFO" in text
    assert "observer error in observer-errors.0.txt: ?" in text  # the link: nothing of its target read


def test_a_rank_file_that_is_not_the_observers_format_is_refused_by_its_schema(tmp_path):
    write_rank_observation(tmp_path, 0, optimizer_steps=-3)
    (tmp_path / "rank.1.json").write_text(json.dumps({"schema": "distlab-observations", "rank": 1}))
    problems = " ".join(observations.load(tmp_path).problems)
    assert "rank.0.json unreadable" in problems and "optimizer_steps" in problems
    assert "rank.1.json unreadable" in problems and "not the observer's format: missing field" in problems


def test_the_evaluator_never_reads_weights_that_are_not_a_regular_file(tmp_path):
    from harness.observe import accuracy

    write_rank_observation(tmp_path, 0, model={"state_sha256": "a" * 64})
    (tmp_path / "final_weights.pt").symlink_to("/dev/zero")
    answer = within(120, accuracy.answer, tmp_path, ["--smoke"])
    assert answer["accuracy"] is None and "is a symbolic link, not a regular file" in answer["error"]


# ------------------------------------------------------------------------------------ submissions

def test_a_submissions_folder_of_hostile_entries_is_read_without_blocking_or_crashing(tmp_path):
    root = tmp_path / "week4"
    root.mkdir()
    (root / "bob").mkdir()
    (root / "bob" / "train.py").write_text("print('bob')\n")
    (root / "bob" / "kmsg").symlink_to("/proc/kmsg")  # a reader that follows it waits forever
    with open(os.fsencode(root / "bob") + b"/r\xe9sum\xe9.txt", "wb") as latin1:
        latin1.write(b"latin-1\n")
    (root / "eve").mkdir()
    (root / "eve" / "train.py").write_text("print('eve')\n")
    os.mkfifo(root / "eve" / "pipe")
    (root / "mallory.py").symlink_to("/dev/zero")
    os.mkdir(os.fsencode(root) + b"/caf\xe9")
    (root / ("n" * 240)).mkdir()
    (root / "=cmd()").mkdir()
    found = {s.id: s for s in within(60, submissions.find_submissions, root)}
    assert found["bob"].program == root / "bob" / "train.py" and not found["bob"].problem
    digest = within(60, found["bob"].digest)
    (root / "bob" / "kmsg").unlink()
    (root / "bob" / "kmsg").symlink_to("/etc/hostname")  # a link pointing elsewhere: another submission
    assert within(60, found["bob"].digest) != digest
    assert "pipe in its folder is a FIFO" in found["eve"].problem and found["eve"].program is None
    assert "it is a link" in found["mallory.py"].problem
    assert "not a plain student id" in found["caf\ufffd"].problem
    keys = {s.key for s in found.values()}
    assert len(keys) == len(found) and all(submissions.STUDENT_ID.fullmatch(key) for key in keys)
    assert found["n" * 240].key.startswith("submission-") and found["=cmd()"].key.startswith("submission-")


def test_a_program_whose_name_holds_a_control_character_is_refused_and_shown_escaped(tmp_path):
    (tmp_path / "carl").mkdir()
    (tmp_path / "carl" / "\x1b[31mtrain.py").write_text("")
    carl = submissions.find_submissions(tmp_path)[0]
    assert carl.program is None and "\\x1b[31mtrain.py" in carl.problem and "\x1b" not in carl.problem


def test_a_command_shown_for_pasting_escapes_control_characters(tmp_path):
    assert launch.shell_word("plain") == "plain" and launch.shell_word("a b") == "'a b'"
    word = "x\x1b[31m'y\\"
    quoted = launch.shell_word(word)
    assert "\x1b" not in quoted
    assert subprocess.run(["bash", "-c", f"printf %s {quoted}"], capture_output=True).stdout.decode() == word
    program = tmp_path / "\x1b[2Jevil.py"
    program.write_text("")
    request = RunRequest(lab="check", program=program, world_size=1, launcher="python", backend="none",
                         lab_args=[], threads=1, timeout_s=60.0, results_root=tmp_path)
    shown = launch.dry_run(request)
    assert "\x1b" not in shown and "$'" in shown


# ------------------------------------------------------------------------------------ outputs

def test_spreadsheet_formulas_are_kept_as_text_in_the_gradebook(tmp_path):
    from harness.classgrade.rubric import load

    the_rubric = load(REPO / "harness/classgrade/rubrics/ddp.toml")
    outcomes = [account.Outcome(name, "ungradable", reason) for name, reason in
                (("=HYPERLINK(\"http:x\",\"y\")", "+1"), ("@SUM(A1)", "-x"), ("\tt", "=1+1"), ("plain", "ok"))]
    outputs.gradebook_csv(tmp_path / "book.csv", the_rubric, outcomes)
    import csv

    rows = list(csv.reader((tmp_path / "book.csv").open(newline="")))[2:]  # after the header and the maxima
    assert [(row[0], row[-1]) for row in rows] == [("'=HYPERLINK(\"http:x\",\"y\")", "'+1"), ("'@SUM(A1)", "'-x"),
                                                    ("'\tt", "'=1+1"), ("plain", "ok")]


def test_a_programs_text_becomes_one_inert_code_span_in_markdown():
    text = "line one\n# Score: 14 / 14\n<script>x</script> [a](javascript:y) ``tick`` `"
    span = md_code(text)
    assert "\n" not in span and span.startswith("``` ") and span.endswith(" ```")  # longer than any run inside
    assert "# Score: 14 / 14" in span and "<script>" in span  # shown as it is, inside the span
    assert md_code("\x1b[31mred") == "`\\x1b[31mred`"


# ------------------------------------------------------------------------------------ the sandbox

def test_a_sandboxed_launch_gets_only_the_environment_it_needs(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTLAB_GRADER_SECRET", MARKER)
    monkeypatch.setenv("GITHUB_TOKEN", MARKER)
    monkeypatch.setenv("OMP_PLACES", "cores")
    request = RunRequest(lab="check", program=REPO / "labs/check/check.py", world_size=1, launcher="python",
                         backend="none", lab_args=[], threads=1, timeout_s=60.0, results_root=tmp_path,
                         sandbox=["sandbox-prefix"])
    env = launch.launch_plan(request, tmp_path / "run", "id")[0]
    assert MARKER not in env.values() and "GITHUB_TOKEN" not in env
    assert env["OMP_PLACES"] == "cores" and env["PATH"] == os.environ["PATH"]
    assert env["PYTHONPATH"].split(os.pathsep)[-1] == str(REPO)  # the launch's own, the grader's not added
    unsandboxed = launch.launch_plan(RunRequest(**{**request.__dict__, "sandbox": []}), tmp_path / "run", "id")[0]
    assert unsandboxed["DISTLAB_GRADER_SECRET"] == MARKER  # `distlab run`: the user's environment, as it is


def test_of_the_checkout_the_sandbox_binds_the_harness_and_the_labs_only(tmp_path):
    spec = Spec(uid=FIRST_UID, limits={}, read_only=base_read_only(), hidden=[])
    argv = bwrap_argv(spec, str(tmp_path / "run"), ["true"], seccomp_fd=7)
    bound = {argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "--ro-bind"}
    assert {str(REPO / "harness"), str(REPO / "labs")} <= bound
    assert str(REPO) not in bound and not any(path.startswith(str(REPO / ".git")) for path in bound)
    assert argv[argv.index("--seccomp") + 1] == "7"


def run_filter(program: bytes, arch: int, nr: int, arg0: int = 0) -> int:
    """What a classic BPF seccomp program returns for one system call: a small interpreter of the five
    instructions the sandbox's filter uses (load, three jumps, return), over struct seccomp_data."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    steps = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    for _ in range(len(steps) + 1):
        code, jt, jf, k = steps[pc]
        if code == _LD_ABS:
            acc, pc = struct.unpack_from("=I", data, k)[0], pc + 1
        elif code == _RET:
            return k
        else:
            taken = {_JEQ: acc == k, _JGE: acc >= k, _JSET: bool(acc & k)}[code]
            pc += 1 + (jt if taken else jf)
    raise AssertionError("the filter never returned")


@pytest.mark.parametrize("machine", sorted(ARCHES))
def test_the_seccomp_filter_refuses_keyrings_and_user_namespaces_and_other_abis(machine):
    program = seccomp_filter(machine)
    arch, column = ARCHES[machine]
    nr = {name: numbers[column] for name, numbers in SYSCALLS.items()}
    allow, eperm, enosys = _ALLOW, _ERRNO | errno.EPERM, _ERRNO | errno.ENOSYS
    for name in ("keyctl", "add_key", "request_key"):
        assert run_filter(program, arch, nr[name]) == eperm, name
    assert run_filter(program, arch, nr["unshare"], CLONE_NEWUSER) == eperm
    assert run_filter(program, arch, nr["unshare"], 0x20000) == allow  # CLONE_NEWNS alone
    assert run_filter(program, arch, nr["clone"], CLONE_NEWUSER | 0x11) == eperm
    assert run_filter(program, arch, nr["clone"], 0x3D0F00) == allow  # what pthread_create passes
    assert run_filter(program, arch, nr["clone3"]) == enosys  # libc then uses clone, which is checked
    assert run_filter(program, arch, 0) == allow and run_filter(program, arch, 59) == allow
    assert run_filter(program, 0x40000003, 288) == enosys  # i386's keyctl, through int 0x80
    if machine == "x86_64":
        assert run_filter(program, arch, X32_SYSCALL_BIT | 250) == enosys  # x32's
    assert seccomp_filter("riscv64") is None


@pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0 or platform.machine() not in ARCHES,
                    reason="needs bubblewrap, root and an architecture the filter knows")
def test_under_the_filter_a_process_runs_but_keeps_no_key_and_makes_no_user_namespace(tmp_path):
    probe = ("import ctypes, os, subprocess, threading\n"
             "libc = ctypes.CDLL(None, use_errno=True)\n"
             "key = libc.syscall(%d, b'user', b'k', b'v', 1, -4)\n"
             "print('add_key', key, os.strerror(ctypes.get_errno()) if key < 0 else '')\n"
             "print('unshare', libc.unshare(0x10000000), os.strerror(ctypes.get_errno()))\n"
             "print('spawn', subprocess.run(['true']).returncode)\n"
             "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n")
    probe %= SYSCALLS["add_key"][ARCHES[platform.machine()][1]]
    fd = seccomp_fd()
    try:
        done = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--seccomp", str(fd), "setpriv",
                               f"--reuid={FIRST_UID + 999}", f"--regid={FIRST_UID + 999}",
                               "--clear-groups", sys.executable, "-c", probe], pass_fds=(fd,), capture_output=True,
                              text=True, timeout=120)
    finally:
        os.close(fd)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["add_key -1 Operation not permitted", "unshare -1 Operation not permitted",
                                        "spawn 0", "thread"]


@pytest.mark.skipif(platform.machine() not in ARCHES, reason="no filter for this architecture")
def test_without_bwrap_the_same_filter_is_loaded_by_prctl():
    """uid mode has no bwrap: the entering program loads the filter itself, for all it execs."""
    code = ("import ctypes, os, sys\n"
            f"sys.path.insert(0, {str(REPO)!r})\n"
            "from harness.classgrade.sandbox.seccomp import ARCHES, SYSCALLS, load_seccomp\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "number = SYSCALLS['add_key'][ARCHES[os.uname().machine][1]]\n"
            "print(libc.syscall(number, b'user', b'k', b'v', 1, -4) >= 0)\n"
            "print(load_seccomp())\n"
            "print(libc.syscall(number, b'user', b'k', b'v', 1, -4), os.strerror(ctypes.get_errno()))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[1:] == ["True", "-1 Operation not permitted"], done.stdout + done.stderr


def test_a_cgroup_left_by_a_job_ended_before_its_clean_up_is_removed(tmp_path, monkeypatch):
    for kind in ("memory", "pids"):
        (tmp_path / kind).mkdir()
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", tmp_path)
    removed = []
    monkeypatch.setattr(Cgroup, "remove", lambda self: removed.append(sorted(map(str, self.dirs.values()))))
    Cgroup.remove_named("class-ghost")
    assert removed == []  # none there: nothing to do
    Cgroup.create("class-left", Limits())
    Cgroup.remove_named("class-left")
    assert removed == [[str(tmp_path / "memory/distlab/class-left"), str(tmp_path / "pids/distlab/class-left")]]


def test_a_job_past_its_deadline_is_ended_with_its_processes_and_the_reason(tmp_path):
    folder = tmp_path / "jobs" / "slow"
    folder.mkdir(parents=True)
    (folder / "job.json").write_text("{}")
    # The job and a child of its own: both are in its session, both end with it.
    command = (sys.executable, "-c", "import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', "
               "'import time; time.sleep(600)']); print(child.pid, flush=True); time.sleep(600)")
    jobs = pool.Pool(1, sandboxed=False, command=command)
    jobs.start(0, "slow", folder / "job.json", dict(os.environ), deadline_s=1.0)
    deadline = time.monotonic() + 120
    while not (folder / "stdout.log").read_text().strip():  # the child has started
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int((folder / "stdout.log").read_text().split()[0])
    ended = []
    while not ended:
        ended = jobs.finished()
        assert time.monotonic() < deadline, "the pool never ended the job past its deadline"
        time.sleep(0.1)
    assert ended[0].student == "slow" and "ran past its deadline of 1 s" in ended[0].reason
    assert not jobs.running
    while True:  # the session's SIGTERM reaches the child too: it is gone, or this fails in 2 min
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the job's child outlived it"
        time.sleep(0.05)


def test_a_jobs_deadline_covers_every_run_and_evaluation_of_its_plan(tmp_path):
    from harness.grading.plan import plan_grade
    from harness.verdict.profiles import load_profile

    student = tmp_path / "s.py"
    student.write_text("")
    plan = plan_grade(load_profile(REPO / "harness/profiles/cpu-smoke.toml"), labs=["ddp"], world_sizes=[2],
                      programs={"ddp": student}, results_root=tmp_path, timeout_s=100.0)
    # Three paired runs of the program and four of the course lab, 100 s each; an evaluation after each of
    # the program's; the extra pairs' budget, the last pair at its timeouts and evaluation; the margin.
    extra = plan.profile.speed_budget_s + 2 * 100 + pool.EVALUATOR_S
    assert pool.job_deadline_s(plan) == pytest.approx(3 * (100 + pool.EVALUATOR_S) + 4 * 100 + extra
                                                      + pool.DEADLINE_MARGIN_S)


HEADERS = {"x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
           "aarch64": Path("/usr/include/asm-generic/unistd.h")}  # Linux's own tables (linux-libc-dev)


@pytest.mark.parametrize("machine", sorted(ARCHES))
def test_the_filters_system_call_numbers_are_linuxs(machine):
    if not HEADERS[machine].is_file():
        pytest.skip(f"no {HEADERS[machine]} here (Debian's linux-libc-dev)")
    import re

    defined = dict(re.findall(r"#define __NR_(\w+) (\d+)", HEADERS[machine].read_text()))
    column = ARCHES[machine][1]
    assert {name: numbers[column] for name, numbers in SYSCALLS.items()} == \
        {name: int(defined[name]) for name in SYSCALLS}


# ------------------------------------------------- the second round of hostile submissions (issue 45)

@pytest.mark.parametrize(("text", "message"), [
    ('{"step_times": [NaN, 1.0]}', "NaN is not a number JSON allows"),
    ('{"a": -Infinity}', "-Infinity is not a number JSON allows"),
    ('{"pid": 1, "pid": 4242}', "the key 'pid' is given twice"),
    ("[" * 100_000 + "]" * 100_000, "levels deep, more than the 64 allowed"),
    (b'{"a": "\xff"}', "not UTF-8"),
], ids=["nan", "infinity", "key-twice", "deep", "not-utf8"])
def test_json_a_program_wrote_is_read_with_bounds_or_refused_by_name(text, message):
    with pytest.raises(files.UntrustedJSON, match=message):
        files.parse_json(text)


def test_observations_with_a_nan_clock_or_nested_past_recursion_are_unreadable_never_a_crash(tmp_path):
    """nan_clock.py and deep_observation.py: the observer's file read by the one bounded reader."""
    nan = write_rank_observation(tmp_path / "nan", 0)
    nan.write_text(nan.read_text().replace('"loader_passes": []', '"loader_passes": [{"step_times": [NaN]}]'))
    assert "NaN" in nan.read_text()
    deep = tmp_path / "deep" / "rank.0.json"
    deep.parent.mkdir()
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for folder in (nan.parent, deep.parent):
        with pytest.raises(ValueError):
            observations.read_rank_file(folder / "rank.0.json")
        loaded = observations.load(folder)
        assert loaded.ranks == {} and "rank.0.json unreadable (UntrustedJSON" in loaded.problems[0], loaded.problems


def test_one_submission_that_cannot_be_judged_is_its_own_error_row_never_the_classs(tmp_path):
    """What a job stored cannot be judged (a NaN where a number was, as an older grader stored it): that
    row is "error", in words without the grader's paths; the class goes on."""
    from harness.classgrade import classroom, rubric

    (tmp_path / "week").mkdir()
    shutil.copy(REPO / "tests/programs/ddp_program.py", tmp_path / "week" / "alice.py")
    student = submissions.find_submissions(tmp_path / "week")[0]
    folder = tmp_path / "results" / "jobs" / "alice"
    folder.mkdir(parents=True)
    (folder / "observations.json").write_text('{"done": {"ddp@2": [{"wall_seconds": NaN}]}, "references": {}}')
    job = {"folder": str(folder), "lab": "ddp", "profile": "cpu-smoke", "world_sizes": [2], "program": "alice.py",
           "submission": str(student.path), "gpus": None, "limits": {}}
    room = classroom.Classroom(classroom.ClassRequest(tmp_path / "week"), rubric.load(rubric.DEFAULT), [student],
                               {"alice": job}, None, 1)
    outcome = room.outcome(student)
    assert outcome.status == "error" and "could not judge what its runs left (UntrustedJSON)" in outcome.reason
    assert str(tmp_path) not in outcome.reason and "/" not in outcome.reason
    (folder / "job-error.txt").write_text(f"job exit code 1: FileNotFoundError: '{folder}/runs/x' (see {folder})\n")
    (folder / "observations.json").unlink()
    room.outcomes.clear()
    failed = room.outcome(student)  # the grader's own failure: its paths are staff's (the console, the log)
    assert failed.status == "error" and "FileNotFoundError" in failed.reason and str(tmp_path) not in failed.reason


def test_rank_logs_are_gathered_by_descriptors_each_part_s_tail_only(tmp_path, monkeypatch):
    """odd_rank_folder.py and sparse_logs.py: a folder named like no rank passed over, a link in place of
    an attempt's folder never followed, a huge sparse log kept as its tail (here 1 MiB of a 16 MiB one)."""
    from types import SimpleNamespace

    from harness.run import output

    monkeypatch.setattr(output, "RANK_LOG_BYTES", 1 << 20, raising=False)
    attempt = tmp_path / "logs" / "run" / "attempt_0"
    for rank in ("0", "1", "x", "7"):
        (attempt / rank).mkdir(parents=True)
        (attempt / rank / "stdout.log").write_text(f"rank {rank} says hello\n")
    with open(attempt / "0" / "stderr.log", "wb") as sparse:
        sparse.truncate(16 << 20)
        sparse.seek(16 << 20)
        sparse.write(b"the last line\n")
    (tmp_path / "elsewhere" / "0").mkdir(parents=True)
    (tmp_path / "elsewhere" / "0" / "stdout.log").write_text("PLANTED-THROUGH-A-LINK\n")
    (tmp_path / "logs" / "run" / "attempt_9").symlink_to(tmp_path / "elsewhere")
    gathered = output.gather_rank_logs(SimpleNamespace(launcher="torchrun", world_size=2), tmp_path)
    assert sorted(gathered) == [0, 1]  # no rank "x", none past the world size
    zero = gathered[0].read_bytes()
    assert b"rank 0 says hello" in zero and b"the last line\n" in zero and b"PLANTED" not in zero
    assert len(zero) < (1 << 20) + 4096, len(zero)


def test_a_class_folder_nested_past_path_max_is_made_private_by_descriptors(tmp_path):
    """deep_path.py's run folder left in the results: closing the class to other users walks it whole
    (a walk by paths stopped the class before any job), and a link in it is never followed."""
    from harness.classgrade import gradescope

    results, outside = tmp_path / "results", tmp_path / "outside.txt"
    outside.write_text("not the class's\n")
    os.chmod(outside, 0o644)
    deep = results
    deep.mkdir()
    descriptor = os.open(deep, os.O_RDONLY)
    for level in range(20):  # 20 x 250 characters: past PATH_MAX (4096)
        name = f"{level:02d}" + "d" * 248
        os.mkdir(name, dir_fd=descriptor)
        inner = os.open(name, os.O_RDONLY, dir_fd=descriptor)
        os.close(descriptor)
        descriptor = inner
    os.close(os.open("left.txt", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=descriptor))
    os.symlink(outside, "link", dir_fd=descriptor)
    gradescope.make_private(tmp_path / "source", results)
    assert os.stat("left.txt", dir_fd=descriptor).st_mode & 0o777 == 0o640
    os.close(descriptor)
    assert os.stat(results).st_mode & 0o007 == 0 and os.stat(outside).st_mode & 0o777 == 0o644


def test_a_link_in_place_of_the_observers_folder_is_tampering_and_never_read(tmp_path):
    """links_observe.py: observe/ itself a link (to observations of another run), not only entries in it."""
    from harness.grading import samples

    elsewhere = tmp_path / "elsewhere"
    write_rank_observation(elsewhere, 0)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "observe").symlink_to(elsewhere)
    found = samples.inspect_run_dir(tmp_path / "run")
    assert found == ["observe is a symbolic link"]
    assert samples.tampers_with_the_grader(found) == found
    loaded = observations.load(tmp_path / "run" / "observe")
    assert loaded.ranks == {} and "symbolic link" in loaded.problems[0]


def _claimed_uid():
    from harness.classgrade.sandbox.uid import claim_uid

    return claim_uid()


@pytest.mark.skipif(os.geteuid() != 0, reason="handing files back from a job's uid needs root")
def test_a_uid_jobs_folder_is_handed_back_to_root_and_closed_at_its_end(tmp_path):
    """reads_classmate.py: the next job runs as the same uid; nothing the earlier one owned stays its own."""
    from harness.classgrade.sandbox import private

    job_uid, claim = _claimed_uid()
    try:
        run = tmp_path / "job" / "runs" / "r1"
        run.mkdir(parents=True)
        for path, mode in ((run / "rank.0.log", 0o644), (run / "program", 0o4755)):
            path.write_text("x\n")
            os.chown(path, job_uid, job_uid)
            os.chmod(path, mode)
        os.chown(run, job_uid, job_uid)
        os.chmod(run, 0o777)
        (run / "link").symlink_to("/etc/hostname")
        os.chown(run / "link", job_uid, job_uid, follow_symlinks=False)
        hostname = os.stat("/etc/hostname")
        private.hand_back(tmp_path / "job", job_uid)
        for path in (run, run / "rank.0.log", run / "program"):
            info = os.stat(path)
            assert (info.st_uid, info.st_gid) == (0, 0) and info.st_mode & 0o6007 == 0, (path, oct(info.st_mode))
        assert os.lstat(run / "link").st_uid == 0 and os.stat("/etc/hostname") == hostname  # never followed
    finally:
        os.close(claim)


@pytest.mark.skipif(os.geteuid() != 0, reason="files of another uid need root")
def test_what_a_uid_job_leaves_in_the_shared_scratch_folders_is_found_sized_and_removed(tmp_path):
    """leaves_scratch.py: /tmp, /var/tmp, /dev/shm (here a folder standing for them), and a world-writable
    folder in them; another uid's files stay."""
    from harness.classgrade.sandbox.uid import remove_scratch, scratch_left

    job_uid, claim = _claimed_uid()
    try:
        shared = tmp_path / "shared"
        (shared / "x11").mkdir(parents=True)
        os.chmod(shared / "x11", 0o1777)
        for path in (shared / "left.bin", shared / "x11" / "left.bin", shared / "kept.bin"):
            path.write_bytes(b"\1" * (1 << 20))
        os.chown(shared / "left.bin", job_uid, job_uid)
        os.chown(shared / "x11" / "left.bin", job_uid, job_uid)
        found = dict(scratch_left(job_uid, (str(shared),)))
        assert set(found) == {str(shared / "left.bin"), str(shared / "x11" / "left.bin")}
        assert all(size >= 1 << 20 for size in found.values())
        remove_scratch(job_uid, (str(shared),))
        assert sorted(p.name for p in shared.rglob("*.bin")) == ["kept.bin"]
    finally:
        os.close(claim)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="runs a command as a job's uid")
def test_a_uid_run_ends_only_once_no_process_of_its_uid_is_left(tmp_path):
    """fork_loop.py: a process forking a new pid every 50 ms, its parents exiting; the entering program
    returns (and the run is accounted) only once none of the uid's processes is left."""
    from harness.classgrade.sandbox.uid import processes_left

    job_uid, claim = _claimed_uid()
    loop = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    while True:\n"
            "        time.sleep(0.05)\n"
            "        if os.fork():\n"
            "            os._exit(0)\n"
            "print('launched')\n")
    code = ("import sys\n"
            f"sys.path.insert(0, {str(REPO)!r})\n"
            "from harness.classgrade.sandbox.enter import run_to_the_end\n"
            f"sys.exit(run_to_the_end({job_uid}, ['setpriv', '--reuid={job_uid}', '--regid={job_uid}', "
            f"'--clear-groups', {sys.executable!r}, '-c', {loop!r}], dict(os.environ)))\n").replace(
        "import sys\n", "import os, sys\n", 1)
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
        assert done.returncode == 0 and "launched" in done.stdout, done.stderr
    finally:
        os.close(claim)
    assert processes_left(job_uid) == []


def test_a_student_s_folder_and_program_of_one_name_are_refused_as_ambiguous(tmp_path):
    """alice/ and alice.py: one key; the correct one's 16 became 9. Neither is graded, each says why."""
    (tmp_path / "alice").mkdir()
    shutil.copy(REPO / "tests/programs/ddp_program.py", tmp_path / "alice" / "train.py")
    shutil.copy(REPO / "tests/programs/ddp_program.py", tmp_path / "alice.py")
    (tmp_path / "bob.py").write_text("print('bob')\n")
    found = submissions.find_submissions(tmp_path)
    alices = [s for s in found if s.id == "alice"]
    assert len(alices) == 2 and len({s.key for s in found}) == 3
    for sub in alices:
        assert sub.program is None and "ambiguous: alice/ and alice.py are both" in sub.problem, sub
    assert next(s for s in found if s.id == "bob").problem == ""


def test_bidirectional_overrides_are_shown_escaped_like_control_characters():
    from harness.console import printable

    text = "it wrote \u202eexe.txt\u2066 here\x1b[2J"
    for shown in (printable(text), md_code(text), feedback.html_text(text)):
        assert "\u202e" not in shown and "\u2066" not in shown and "\x1b" not in shown, shown
        assert "\\u202e" in shown and "\\x1b" in shown


def test_the_gradescope_runner_writes_privately_and_keeps_the_rubric_from_the_job(tmp_path):
    """The rubric (with its hidden items, due date in) and the grade's log are the runner's alone (umask
    077), whatever the container's umask: a job's uid read work/rubric.toml and printed it."""
    root = tmp_path / "autograder"
    source = root / "source"
    (source / "distlab").parent.mkdir(parents=True)
    (source / "distlab").symlink_to(REPO)
    shutil.copy(REPO / "harness/classgrade/rubrics/ddp.toml", source / "rubric.toml")
    (root / "submission").mkdir()
    shutil.copy(REPO / "tests/programs/ddp_program.py", root / "submission" / "train.py")
    (root / "submission_metadata.json").write_text(json.dumps({"assignment": {"due_date": "2030-01-01T00:00:00Z"}}))
    (source / "autograder.json").write_text(json.dumps({"lab": "ddp", "rubric": "rubric.toml", "profile": "cpu-smoke",
                                                        "lessons": "https://example.org/", "timeout_s": 1}))
    done = subprocess.run([sys.executable, "-c", "import os, sys; os.umask(0o022); "
                           f"sys.path.insert(0, {str(REPO)!r}); from harness.classgrade import gradescope; "
                           f"sys.exit(gradescope.main([{str(source / 'autograder.json')!r}]))"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    work = root / "work"
    for written in (work / "rubric.toml", work / "grade-class.log", root / "results" / "results.json"):
        assert os.stat(written).st_mode & 0o077 == 0, (written, oct(os.stat(written).st_mode))
