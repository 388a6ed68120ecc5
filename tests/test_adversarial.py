"""What clusters, CI and careless or hostile users do to a run, and how each ends.

Kinds: signals to the harness, hostile rank output, broken records, hostile profiles and
hostfiles, argument injection, a full or unwritable results folder, concurrent runs. Every case
asserts the exit code, the one-line message where a refusal is due, run.json and its reason, that
no process of the run is left (the processes a program spawned, clean environment and session of
their own included) and that nothing was written outside the results root.

Programs are tiny and hostile, written here (PROGRAM) and run through `distlab run check
--program`, mostly by plain python (world size 1), under torchrun where the launcher matters.
A signal is sent only once the program has proven it is running (a file it creates); the time
limits are limits against hangs only, generous for a slow, loaded machine.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import DISTLAB

from harness.run import accounting, errors, job_templates, multinode, processes, record, runner
from harness.run.errors import RunRefused
from harness.run.launchers import harness_flag
from harness.run.processes import run_processes
from harness.run.request import RunRequest
from harness.run.run_dir import new_run_dir
from harness.verdict import profiles
from labs.common.contract import Record
from labs.common.topology import Topology

LIMIT = 180  # seconds: against hangs only
REPO = Path(__file__).resolve().parent.parent

PROGRAM = r'''
import os, signal, sys, time

argv = sys.argv[1:]


def opt(name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default


mode, work = opt("--mode"), opt("--dir")
record = opt("--record")
run_dir = os.path.dirname(record)
rank = os.environ.get("RANK", "0")


def mark(name):
    with open(os.path.join(work, name + ".tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(work, name + ".tmp"), os.path.join(work, name))


def write_record():
    if rank == "0" and opt("--raw"):
        with open(opt("--raw"), "rb") as src, open(record + ".tmp", "wb") as dst:
            dst.write(src.read())
        os.rename(record + ".tmp", record)


def daemon():
    """A grandchild with an empty environment and a session of its own: no marker, no group."""
    pidfile = os.path.join(work, "daemon." + rank)
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            code = ("import os, sys, time; open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); "
                    "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(100000)")
            os.execve(sys.executable, [sys.executable, "-c", code, pidfile], {})
        os._exit(0)
    os.waitpid(child, 0)
    while not os.path.exists(pidfile):
        time.sleep(0.02)


out = sys.stdout.buffer
if mode in ("daemon", "daemon-exit"):
    daemon()
if mode == "stubborn":
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
if mode == "bytes":
    out.write(bytes.fromhex(opt("--hex")))
    out.flush()
if mode == "flood":
    line = b"x" * 1023 + b"\n"
    for _ in range(int(opt("--kib"))):
        out.write(line)
    out.flush()
if mode == "longline":
    out.write(b"y" * (5 << 20))
    out.flush()
if mode == "record-fifo":
    os.mkfifo(record)
if mode == "record-dir":
    os.makedirs(os.path.join(record, "inside"))
if mode == "record-link":
    os.symlink(opt("--target"), record)
if mode == "plant":
    what, name, target = opt("--kind"), opt("--name"), opt("--target")
    path = os.path.join(run_dir, name)
    if os.path.lexists(path):
        os.unlink(path)
    if what == "dir":
        os.makedirs(os.path.join(path, "inside"))
    elif what == "fifo":
        os.mkfifo(path)
    else:
        os.symlink(target, path)
if mode == "fail":
    print("failing on purpose", flush=True)
    sys.exit(3)
if not mode.startswith("record-"):
    write_record()
print("ready", flush=True)
mark("ready." + rank)
if mode in ("daemon", "stubborn", "sleep"):
    while True:
        time.sleep(1)
if mode == "wait":
    while not os.path.exists(os.path.join(work, "go")):
        time.sleep(0.05)
print("done", flush=True)
'''


# --- helpers ------------------------------------------------------------------------------------

def good_record_text() -> str:
    rec = Record(lab="check", config={}, topology=Topology(), backend="gloo")
    rec.metrics["elements"] = 16
    rec.check("allreduce_value", True, wrong_elements=0)
    return json.dumps(rec.to_dict())


class Lab:
    """One tmp_path laid out for a hostile run: the program, its work folder, the results root and
    a cwd, so that anything written outside the results root shows."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.program = tmp_path / "prog.py"
        self.program.write_text(PROGRAM)
        self.work = tmp_path / "work"
        self.work.mkdir()
        self.results = tmp_path / "results"
        self.cwd = tmp_path / "cwd"
        self.cwd.mkdir()
        self.good = tmp_path / "good.json"
        self.good.write_text(good_record_text())
        self.results_roots = [self.results]  # where runs may write
        self.before = self.outside()

    def outside(self) -> dict[str, tuple[int, int]]:
        """Everything under tmp_path but the results root and the program's work folder."""
        seen = {}
        for path in self.root.rglob("*"):
            if path == self.work or self.work in path.parents or any(
                    path == root or root in path.parents for root in self.results_roots):
                continue
            info = path.lstat()
            seen[str(path)] = (info.st_size, info.st_mtime_ns)
        return seen

    def argv(self, *lab_args: str, n: int = 1, extra: tuple[str, ...] = (), raw: Path | None = None,
             results: Path | None = None) -> list[str]:
        return [DISTLAB, "run", "check", "-n", str(n), "--threads", "1", "--program", str(self.program),
                "--results", str(results or self.results), "--timeout", "300", *extra, "--",
                "--dir", str(self.work), "--raw", str(raw or self.good), *lab_args]

    def start(self, *lab_args: str, **kwargs) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(*lab_args, **kwargs), cwd=self.cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, errors="replace")

    def run(self, *lab_args: str, **kwargs) -> tuple[int, str, str]:
        process = self.start(*lab_args, **kwargs)
        out, err = process.communicate(timeout=LIMIT)
        return process.returncode, out, err

    def wait_for(self, names: list[str], process: subprocess.Popen[str]) -> None:
        """Until the program has created every file in `names`: proof that the run is in progress."""
        deadline = time.monotonic() + LIMIT
        while not all((self.work / name).exists() for name in names):
            if process.poll() is not None:
                out, err = process.communicate()
                pytest.fail(f"the run ended before {names} appeared:\n{out}\n{err}")
            if time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"{names} never appeared")
            time.sleep(0.05)

    def run_dirs(self, results: Path | None = None) -> list[Path]:
        return sorted(path.parent for path in (results or self.results).glob("check/*/command.txt"))

    def only_run(self, results: Path | None = None) -> tuple[Path, dict]:
        dirs = self.run_dirs(results)
        assert len(dirs) == 1, dirs
        return dirs[0], json.loads((dirs[0] / "run.json").read_text())

    def assert_clean(self, run: dict | None = None) -> None:
        """No process of the run left (by marker, by the launcher's session, and every pid the
        program wrote down), and nothing written outside the results root."""
        if run is not None:
            assert run_processes(run["run_id"], session=run["launcher_pid"]) == []
        for pidfile in self.work.glob("daemon.*"):
            assert not _alive(int(pidfile.read_text())), f"{pidfile.name} outlived its run"
        for pidfile in self.work.glob("ready.*"):
            assert not _alive(int(pidfile.read_text())), f"the rank of {pidfile.name} outlived its run"
        assert self.outside() == self.before


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    return Lab(tmp_path)


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 3 MiB tmpfs: a results folder that fills up."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'mount refused'}); needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


# --- signals ------------------------------------------------------------------------------------

SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]


@pytest.mark.integration
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_to_the_harness_stops_the_run_and_every_process_of_it(lab, sig):
    process = lab.start("--mode", "daemon")
    lab.wait_for(["ready.0", "daemon.0"], process)
    process.send_signal(sig)
    out, err = process.communicate(timeout=LIMIT)
    assert process.returncode not in (0, 1), out + err  # stopped, not ended by itself
    run_dir, run = lab.only_run()
    expected = "interrupted (Ctrl-C)" if sig == signal.SIGINT else f"stopped by {sig.name}"
    assert (run["status"], run["reason"], run["stopped_by"], run["interrupted"]) == ("failed", expected, sig.name,
                                                                                     True)
    rec = json.loads((run_dir / "record.json").read_text())
    assert rec["status"] == "failed" and rec["reason"] == expected
    assert "ready" in (run_dir / "rank.0.log").read_text()
    lab.assert_clean(run)


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_ends_distlab_with_128_plus_its_number_and_one_line(lab, sig):
    process = lab.start("--mode", "sleep")
    lab.wait_for(["ready.0"], process)
    process.send_signal(sig)
    out, err = process.communicate(timeout=LIMIT)
    assert process.returncode == 128 + sig, out + err
    line = one_line(err)
    assert ("interrupted" if sig == signal.SIGINT else f"stopped by {sig.name}") in line
    lab.assert_clean(lab.only_run()[1])


@pytest.mark.integration
def test_sigterm_under_torchrun_reaches_the_agent_and_ranks_and_the_rendezvous_stays_on_loopback(lab):
    with socket.socket() as probe:  # a free port for the explicit endpoint
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = lab.start("--mode", "daemon", n=2, extra=("--rdzv-endpoint", f"127.0.0.1:{port}"))
    lab.wait_for(["ready.0", "ready.1", "daemon.0", "daemon.1"], process)
    listening = _listening(str(lab.results))
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=LIMIT)
    run_dir, run = lab.only_run()
    assert run["reason"] == "stopped by SIGTERM" and run["launcher"] == "torchrun", out + err
    assert ("127.0.0.1", port) in listening  # the rendezvous store was served, and only there
    assert all(address.startswith("127.") for address, _ in listening), listening
    lab.assert_clean(run)


def _listening(marker: str) -> set[tuple[str, int]]:
    """(address, port) every process with `marker` in its command line listens on."""
    found = set()
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []):
                found |= {(c.laddr.ip, c.laddr.port) for c in proc.net_connections("inet")
                          if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            continue
    return found


@pytest.mark.integration
def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace_period(lab):
    process = lab.start("--mode", "stubborn")
    lab.wait_for(["ready.0"], process)
    stopped = time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=LIMIT)
    assert time.monotonic() - stopped < processes.KILL_GRACE_S + 60
    run_dir, run = lab.only_run()
    assert run["reason"] == "stopped by SIGTERM"
    assert run["returncode"] == -signal.SIGKILL  # it took SIGKILL
    lab.assert_clean(run)


# --- hostile output -----------------------------------------------------------------------------

RAW = bytes([0xff, 0xfe, 0x80]) + b"caf\xe9 \xc3\x28 done\n"  # invalid UTF-8 in three ways


@pytest.mark.integration
@pytest.mark.parametrize("n", [1, 2], ids=["python", "torchrun"])
def test_output_that_is_not_utf8_is_kept_byte_for_byte(lab, n):
    code, out, err = lab.run("--mode", "bytes", "--hex", RAW.hex(), n=n)
    assert code == 0, out + err
    run_dir, run = lab.only_run()
    assert run["status"] == "ok" and run["harness_errors"] == []
    assert RAW in (run_dir / "rank.0.log").read_bytes()
    if n == 1:
        assert RAW in (run_dir / "launcher.log").read_bytes()
    assert "caf\ufffd" in out  # shown with replacement characters
    lab.assert_clean(run)


@pytest.mark.integration
def test_terminal_escape_sequences_are_shown_not_obeyed(lab):
    hostile = b"\x1b]0;owned\x07\x1b[2J\x9b31m\n"
    code, out, err = lab.run("--mode", "bytes", "--hex", hostile.hex())
    assert code == 0, out + err
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
    assert "\\x1b]0;owned\\x07" in out
    run_dir, run = lab.only_run()
    assert hostile in (run_dir / "launcher.log").read_bytes()
    lab.assert_clean(run)


@pytest.mark.integration
@pytest.mark.parametrize(("mode", "size"), [("longline", 5 << 20), ("flood", 16 << 20)])
def test_a_line_without_end_or_a_flood_of_output_is_drained_and_kept(lab, mode, size):
    code, out, err = lab.run("--mode", mode, "--kib", str(size >> 10))
    assert code == 0, err
    run_dir, run = lab.only_run()
    assert run["status"] == "ok"
    assert (run_dir / "launcher.log").stat().st_size >= size
    lab.assert_clean(run)


@pytest.mark.integration
def test_a_reader_that_goes_away_does_not_stall_the_run(lab):
    """`distlab run ... | head -1`: the harness's own stdout closes while the rank still prints."""
    process = subprocess.Popen(lab.argv("--mode", "flood", "--kib", "4096"), cwd=lab.cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    process.stdout.readline()
    process.stdout.close()
    process.wait(timeout=LIMIT)
    run_dir, run = lab.only_run()
    assert run["status"] == "ok" and (run_dir / "launcher.log").stat().st_size >= 4 << 20
    lab.assert_clean(run)


@pytest.mark.integration
@pytest.mark.parametrize(("kind", "name"), [("fifo", "launcher.log"), ("fifo", "logs/rank.0.out"),
                                            ("symlink", "rank.0.log"), ("dir", "run.json")])
def test_a_file_planted_in_the_run_directory_is_neither_read_nor_followed(lab, kind, name):
    victim = lab.root / "victim.txt"
    victim.write_text("precious\n")
    lab.before = lab.outside()
    code, out, err = lab.run("--mode", "plant", "--kind", kind, "--name", name, "--target", str(victim))
    assert code == 0, out + err
    run_dir, run = lab.only_run()  # run.json is a file, even where the program put a directory
    assert run["status"] == "ok"
    assert victim.read_text() == "precious\n"
    assert (run_dir / "rank.0.log").is_file() and not (run_dir / "rank.0.log").is_symlink()
    if name == "logs/rank.0.out":
        assert "is a FIFO, not a regular file" in (run_dir / "rank.0.log").read_text()
    if name == "run.json":
        assert (run_dir / "run.corrupt.json" / "inside").is_dir()  # set aside, not deleted
    lab.assert_clean(run)


# --- broken records -----------------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize(("lab_args", "raw", "message"), [
    (("--mode", "record-fifo"), None, "is a FIFO, not a regular file"),
    (("--mode", "record-dir"), None, "is a directory, not a regular file"),
    (("--mode", "record-link", "--target", "GOOD"), None, "is a symbolic link, not a regular file"),
    (("--mode", "raw"), "[" * 200_000 + "]" * 200_000, "levels deep, more than the 64"),
    (("--mode", "raw"), "HUGE", "is out of range"),
], ids=["fifo", "directory", "symlink", "nested", "huge-int"])
def test_a_broken_record_fails_the_run_with_its_reason_and_is_kept_aside(lab, lab_args, raw, message):
    path = None
    if raw is not None:
        path = lab.root / "raw.json"
        text = good_record_text().replace('"elements": 16', '"elements": ' + "9" * 5000) if raw == "HUGE" else raw
        path.write_text(text)
        lab.before = lab.outside()
    lab_args = tuple(str(lab.good) if arg == "GOOD" else arg for arg in lab_args)
    started = time.monotonic()
    code, out, err = lab.run(*lab_args, raw=path)
    assert code == 1, out + err
    assert time.monotonic() - started < 120  # a FIFO must not stall the harness until its watchdog
    run_dir, run = lab.only_run()
    assert run["status"] == "failed" and message in run["record_error"] and message in run["reason"]
    rec = json.loads((run_dir / "record.json").read_text())
    assert rec["provenance"]["written_by"] == "harness" and message in rec["reason"]
    assert os.path.lexists(run_dir / "record.corrupt.json")  # kept for inspection
    assert "Traceback" not in err  # the harness's own; rank output goes to stdout
    lab.assert_clean(run)


@pytest.mark.parametrize(("text", "message"), [
    ('{"a": NaN}', "NaN is not a number JSON allows"),
    ('{"a": Infinity}', "Infinity is not a number JSON allows"),
    ('{"a": -Infinity}', "-Infinity is not a number JSON allows"),
    ('{"a": 1e999}', "out of range"),
    ('{"a": ' + "1" * 5000 + "}", "out of range"),
    ('{"a": 18446744073709551616}', "out of range"),
    ("[" * 65 + "]" * 65, "65 levels deep"),
    ('{"a": "\\ud800"}', "not valid Unicode"),
    ("[]", "not a JSON object"),
], ids=["nan", "inf", "-inf", "1e999", "5000-digits", "2**64", "depth-65", "lone-surrogate", "array"])
def test_record_values_no_consumer_can_use_are_refused_by_name(tmp_path, text, message):
    path = tmp_path / "record.json"
    path.write_text(text)
    with pytest.raises(record.RecordError, match=message):
        record.load(path)


def test_a_record_file_that_is_too_large_or_not_utf8_is_refused_unread(tmp_path):
    path = tmp_path / "record.json"
    path.write_bytes(b" " * (record.MAX_RECORD_BYTES + 1))
    with pytest.raises(record.RecordError, match="more than the"):
        record.load(path)
    path.write_bytes(b'{"lab": "caf\xe9"}')
    with pytest.raises(record.RecordError, match="not UTF-8"):
        record.load(path)


def test_validate_refuses_non_finite_numbers_given_as_python_objects():
    data = json.loads(good_record_text())
    data["metrics"]["img_per_sec"] = float("nan")
    with pytest.raises(record.RecordError, match="'metrics.img_per_sec' is nan"):
        record.validate(data)


# --- hostile profiles and hostfiles -------------------------------------------------------------

PROFILE = """name = "{name}"
[measured]
where = "here"
how = "by hand"
date = "2026-11-30"
[match]
gpus = 0
[labs.check]
world_sizes = {sizes}
time_budget_s = {budget}
args = {args}
"""


def profile_text(name="mine", sizes="[1, 2]", budget="60", args="[]") -> str:
    return PROFILE.format(name=name, sizes=sizes, budget=budget, args=args)


@pytest.mark.parametrize(("content", "message"), [
    (profile_text(name="../../../escape"), "key 'name': expected one plain name"),
    (profile_text(name="a/b"), "key 'name': expected one plain name"),
    (profile_text().encode("utf-8").replace(b"by hand", b"by h\xe4nd"), "not UTF-8 text"),
    ("DIR", "is a directory, not a regular file"),
    ("FIFO", "is a FIFO, not a regular file"),
    (profile_text(sizes="[1, 2, 2]"), "each world size once"),
    (profile_text(budget="nan"), "key 'labs.check.time_budget_s': expected a finite number"),
    (profile_text(budget="9" * 400), "expected a finite number"),
    (profile_text(args='["--record", "/tmp/elsewhere.json"]'), "--record is set by the harness"),
    (profile_text(args='["--rec=/tmp/x"]'), "--record is set by the harness"),
    (profile_text() + '[labs.check.world_size_args]\n"\u00b2" = ["--x"]\n', "world_size_args.\u00b2"),
    ("a = " + "[" * 5000 + "]" * 5000, "nested too deeply"),
], ids=["name-traversal", "name-slash", "not-utf8", "directory", "fifo", "repeated-world-size", "nan",
        "huge-int", "owned-flag", "owned-flag-abbreviated", "superscript-key", "nested"])
def test_a_hostile_profile_is_refused_in_one_line(tmp_path, content, message):
    path = tmp_path / "hostile.toml"
    if content == "DIR":
        path.mkdir()
    elif content == "FIFO":
        os.mkfifo(path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(profiles.ProfileError, match=message) as refused:
        profiles.load_profile(path)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("kind", ["name-traversal", "not-utf8"])
def test_grade_with_a_hostile_profile_exits_2_and_writes_nothing(tmp_path, kind):
    path = tmp_path / "evil.toml"
    if kind == "not-utf8":
        path.write_bytes(b"name = \"\xff\"\n")
    else:
        path.write_text(profile_text(name="../../../../escape"))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    done = subprocess.run([DISTLAB, "grade", "--profile", str(path), "--results", str(tmp_path / "results")],
                          cwd=cwd, capture_output=True, text=True, timeout=LIMIT)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "profile" in one_line(done.stderr) and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["cwd", "evil.toml"]


@pytest.mark.parametrize(("content", "message"), [
    (b"node0 slots=2\nn\xf6de1 slots=2\n", "not UTF-8 text"),
    ("DIR", "is a directory, not a regular file"),
    ("FIFO", "is a FIFO, not a regular file"),
    (b"-oProxyCommand=touch slots=1\n", "is not a host name"),
    (b"node0 slots=\xc2\xb2\n", "is not slots=N"),
], ids=["not-utf8", "directory", "fifo", "option-as-host", "superscript-slots"])
def test_a_hostile_hostfile_is_refused_in_one_line(tmp_path, content, message):
    path = tmp_path / "hosts"
    if content == "DIR":
        path.mkdir()
    elif content == "FIFO":
        os.mkfifo(path)
    else:
        path.write_bytes(content)
    with pytest.raises(multinode.PlacementError, match=message) as refused:
        multinode.parse_hostfile(path)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: multinode.parse_hosts("node0:\u00b2"), "slots must be a whole number"),
    (lambda: multinode.parse_hosts("--mca:1"), "is not a host name"),
    (lambda: multinode.parse_endpoint("node0:\u00b2\u00b2"), "must be HOST:PORT"),
], ids=["superscript-slots", "option-as-host", "superscript-port"])
def test_hosts_and_endpoints_are_refused_not_crashed_on(call, message):
    with pytest.raises(multinode.PlacementError, match=message):
        call()


def test_run_with_a_hostfile_that_is_not_utf8_exits_2_in_one_line(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_bytes(b"n\xf6de0 slots=2\n")
    done = subprocess.run([DISTLAB, "run", "check", "-n", "2", "--backend", "mpi", "--hostfile", str(hosts),
                           "--results", str(tmp_path / "results")], capture_output=True, text=True, timeout=LIMIT,
                          cwd=tmp_path)
    if "mpi4py" in done.stderr and "needs" in done.stderr:
        pytest.skip("mpi4py is not installed here")
    assert done.returncode == 2
    assert "not UTF-8 text" in one_line(done.stderr)
    assert not (tmp_path / "results").exists()


# --- argument injection -------------------------------------------------------------------------

@pytest.mark.parametrize("injected", [["--record", "OUT"], ["--record=OUT"], ["--rec", "OUT"], ["--backend", "nccl"]],
                         ids=["record", "record=", "abbreviated", "backend"])
def test_lab_arguments_cannot_override_the_harness_own_flags(lab, injected):
    outside = lab.root / "overwritten.json"
    argv = [DISTLAB, "run", "check", "-n", "1", "--program", str(lab.program), "--results", str(lab.results), "--",
            *(str(outside) if arg == "OUT" else arg for arg in injected)]
    done = subprocess.run(argv, cwd=lab.cwd, capture_output=True, text=True, timeout=LIMIT)
    assert done.returncode == 2, done.stdout + done.stderr
    line = one_line(done.stderr)
    assert "which distlab run sets itself" in line and injected[0].split("=")[0] in line
    assert not outside.exists() and not lab.results.exists()
    assert lab.outside() == lab.before


def test_a_flag_after_the_labs_own_separator_is_the_labs_positional_argument():
    assert harness_flag("--records-dir") is None and harness_flag("--rate") is None and harness_flag("-r") is None
    request = RunRequest(lab="check", program=Path("x.py"), world_size=1, launcher="python", backend="gloo",
                         lab_args=["--", "--record", "as a positional"])
    assert request.lab_args[-1] == "as a positional"


@pytest.mark.parametrize(("change", "message"), [
    ({"timeout_s": float("nan")}, "finite number of seconds"),
    ({"timeout_s": float("inf")}, "finite number of seconds"),
    ({"timeout_s": 0}, "finite number of seconds"),
    ({"timeout_s": -5.0}, "finite number of seconds"),
    ({"lab": "../../etc"}, "lab name '../../etc' may hold only"),
    ({"launcher": "python/../x"}, "launcher name"),
    ({"lab_args": ["a\0b"]}, "NUL byte"),
    ({"world_size": 0}, "world size 0 must be a whole number >= 1"),
], ids=["nan", "inf", "zero", "negative", "lab-path", "launcher-path", "nul", "world-size"])
def test_the_runner_refuses_a_request_no_run_can_start_with(tmp_path, change, message):
    fields = dict(lab="check", program=Path("x.py"), world_size=1, launcher="python", backend="gloo",
                  results_root=tmp_path / "results")
    with pytest.raises(RunRefused, match=message):
        RunRequest(**{**fields, **change})
    request = RunRequest(**fields)
    for key, value in change.items():  # changed after creation: run_lab checks again
        setattr(request, key, value)
    with pytest.raises(RunRefused, match=message):
        runner.run_lab(request, echo=False)
    assert list(tmp_path.iterdir()) == []


def test_a_name_that_is_a_path_never_becomes_a_folder(tmp_path):
    for lab_name, launcher in (("..", "python"), ("check", "../../grade"), ("check", "a/b")):
        with pytest.raises(RunRefused, match="may hold only"):
            new_run_dir(tmp_path / "results", lab_name, 1, launcher)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("change", "message"), [
    ({"ifname": "eth0; touch /tmp/x"}, "--ifname 'eth0; touch /tmp/x' is not an interface name"),
    ({"time_limit": "1:00\n#SBATCH --uid=0"}, "--time .* is not a Slurm time"),
    ({"image": 'img" ; touch /tmp/x ; "'}, "--image .* is not an image"),
    ({"lab_args": ("--epochs", "1\nrm -rf ~")}, "holds a line break"),
    ({"lab_args": ("--record", "/etc/x")}, "would override --record"),
], ids=["ifname", "time-newline", "image-quote", "lab-arg-newline", "owned-flag"])
def test_a_template_value_that_could_change_the_job_is_refused(change, message):
    shape = job_templates.JobShape("ddp", nodes=2, gpus_per_node=4, backend="nccl", **change)
    for name in job_templates.TEMPLATES:
        with pytest.raises(job_templates.TemplateError, match=message):
            job_templates.render(name, shape)


HOSTILE_ARGS = ("x'; touch PWNED; '", "$(touch PWNED)", "`touch PWNED`", 'say "hi"', "a b", "*")


@pytest.mark.parametrize("name", ["slurm-torchrun", "slurm-mpi"])
def test_template_lab_arguments_reach_the_program_exactly_as_given(tmp_path, name):
    """The rendered job, run by bash with srun and friends faked: every argument arrives as one
    word, unexpanded, and nothing else runs."""
    lab = "horovod" if name == "slurm-mpi" else "ddp"
    shape = job_templates.JobShape(lab, nodes=2, gpus_per_node=1, backend="horovod" if lab == "horovod" else "gloo",
                               image="registry.example/distlab:gpu", ifname="eth0", lab_args=HOSTILE_ARGS)
    script = tmp_path / "job.sh"
    script.write_text(job_templates.render(name, shape))
    fake = tmp_path / "bin"
    fake.mkdir()
    argv_file = tmp_path / "argv"
    recorder = f'#!/bin/bash\nprintf "%s\\0" "$@" > {argv_file}\n'
    (fake / "scontrol").write_text("#!/bin/bash\necho node0\n")
    # srun: drop its own options, run the rest (bash -c '...' or python ...)
    (fake / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    (fake / "distlab").write_text(recorder)
    (fake / "python").write_text(recorder)
    for tool in fake.iterdir():
        tool.chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "node0", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_NODEID": "0", "SLURM_JOB_ID": "7", "HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    argv = argv_file.read_text().split("\0")[:-1]
    assert tuple(argv[-len(HOSTILE_ARGS):]) == HOSTILE_ARGS
    assert not list(tmp_path.rglob("PWNED"))


def test_distlab_template_with_a_newline_in_time_exits_2_in_one_line(tmp_path):
    done = subprocess.run([DISTLAB, "template", "slurm-torchrun", "--time", "1:00\n#SBATCH --uid=0"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=LIMIT)
    assert done.returncode == 2
    assert "is not a Slurm time" in one_line(done.stderr)


# --- a full or unwritable results folder --------------------------------------------------------

@pytest.mark.integration
def test_output_that_fills_the_results_folder_ends_the_run_accounted_for(lab, small_disk):
    results = small_disk / "results"
    lab.results_roots.append(small_disk)
    code, out, err = lab.run("--mode", "ok", results=results)
    assert code == 0, out + err
    (earlier,) = lab.run_dirs(results)
    kept = {path: path.read_bytes() for path in earlier.rglob("*") if path.is_file()}
    code, out, err = lab.run("--mode", "flood", "--kib", str(8 << 10), results=results)
    assert code == 1, out + err
    assert "Traceback" not in err  # the harness's own; rank output goes to stdout
    run_dir = next(path for path in lab.run_dirs(results) if path != earlier)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "failed"
    assert "could not keep the run's output" in run["reason"] and "No space left on device" in run["reason"]
    assert json.loads((run_dir / "record.json").read_text())["status"] == "failed"
    assert {path: path.read_bytes() for path in earlier.rglob("*") if path.is_file()} == kept
    lab.assert_clean(run)


@pytest.mark.integration
def test_a_results_folder_already_full_is_refused_in_one_line(lab, small_disk):
    lab.results_roots.append(small_disk)
    with (small_disk / "filler").open("wb", buffering=0) as filler, pytest.raises(OSError) as full:
        while True:
            filler.write(b"\0" * (64 << 10))
            filler.flush()
    assert full.value.errno == errno.ENOSPC
    code, out, err = lab.run("--mode", "ok", results=small_disk / "results")
    assert code == 2, out + err
    assert "is full" in one_line(err) and "choose another --results" in err
    assert not list((small_disk / "results").glob("check/*"))
    lab.assert_clean()


@pytest.mark.parametrize("kind", ["read-only", "a-file"])
def test_a_results_folder_that_cannot_be_written_is_refused_in_one_line(lab, kind):
    target = lab.root / "ro"
    if kind == "a-file":
        target.write_text("not a folder\n")
        results = target / "results"
    else:
        target.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(target)], capture_output=True,
                              text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs here ({done.stderr.strip()}); needs root")
        results = target
    lab.before = lab.outside()
    try:
        code, out, err = lab.run("--mode", "ok", results=results)
        after = lab.outside()
    finally:
        if kind == "read-only":
            subprocess.run(["umount", "-l", str(target)], capture_output=True)
    assert code == 2, out + err
    line = one_line(err)
    assert "is not writable" in line and "choose another --results" in line
    assert after == lab.before


# --- concurrent runs ----------------------------------------------------------------------------

@pytest.mark.integration
def test_one_runs_failure_leaves_a_concurrent_runs_processes_alone(lab):
    waiting = lab.start("--mode", "wait")
    lab.wait_for(["ready.0"], waiting)
    rank = int((lab.work / "ready.0").read_text())
    (lab.work / "ready.0").rename(lab.work / "first.0")
    code, out, err = lab.run("--mode", "fail")
    assert code == 1 and "rank 0 exited with code 3" in out, out + err
    assert waiting.poll() is None and _alive(rank)  # the other run's rank was not touched
    (lab.work / "go").touch()
    out, err = waiting.communicate(timeout=LIMIT)
    assert waiting.returncode == 0, out + err
    runs = [json.loads((path / "run.json").read_text()) for path in lab.run_dirs()]
    assert sorted(run["status"] for run in runs) == ["failed", "ok"]
    assert len({run["run_id"] for run in runs}) == 2
    for run in runs:
        lab.assert_clean(run)


@pytest.mark.integration
def test_runs_started_together_claim_their_own_directories(lab):
    processes = [lab.start("--mode", "ok") for _ in range(3)]
    for process in processes:
        out, err = process.communicate(timeout=LIMIT)
        assert process.returncode == 0, out + err
    dirs = lab.run_dirs()
    assert len(dirs) == 3
    assert all(json.loads((d / "run.json").read_text())["status"] == "ok" for d in dirs)


def test_new_run_dir_claims_are_atomic_across_threads(tmp_path):
    claimed: list[Path] = []
    threads = [threading.Thread(target=lambda: claimed.append(new_run_dir(tmp_path, "check", 2, "python")))
               for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(claimed)) == 20


# --- processes the program hides, and the harness's own failure ----------------------------------

@pytest.mark.integration
def test_a_daemon_with_a_clean_environment_is_stopped_when_a_run_succeeds(lab):
    code, out, err = lab.run("--mode", "daemon-exit")
    assert code == 0, out + err
    run_dir, run = lab.only_run()
    assert run["status"] == "ok" and (lab.work / "daemon.0").exists()
    lab.assert_clean(run)


@pytest.mark.integration
def test_an_error_of_the_harness_still_stops_the_run_and_writes_run_json(lab, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the harness broke")

    monkeypatch.setattr(accounting, "gather_rank_logs", broken)
    request = RunRequest(lab="check", program=lab.program, world_size=1, launcher="python", backend="gloo",
                         lab_args=["--dir", str(lab.work), "--raw", str(lab.good), "--mode", "daemon-exit"],
                         results_root=lab.results, timeout_s=300, python=sys.executable)
    with pytest.raises(errors.HarnessError, match="the harness broke") as error:
        runner.run_lab(request, echo=False)
    assert "\n" not in str(error.value)
    run_dir, run = lab.only_run()
    assert run["status"] == "failed" and run["reason"].startswith("harness error: RuntimeError: the harness broke")
    assert "Traceback" in (run_dir / "harness-error.txt").read_text()
    assert (lab.work / "daemon.0").exists()
    lab.assert_clean(run)


def test_harness_flag_reads_abbreviations_as_argparse_does():
    assert [harness_flag(a) for a in ("--record", "--record=x", "--rec", "--r", "--backend", "--back=gloo",
                                      "--b", "--timeout", "--", "record")] == \
        ["--record", "--record", "--record", "--record", "--backend", "--backend", "--backend", None, None, None]
