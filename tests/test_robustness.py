"""The robustness sweep's plan and figure, and the speed-verdict benchmark's mutant (no grade runs here:
`distlab bench robustness` and `distlab bench verdict` run them)."""

from itertools import combinations
from pathlib import Path

import pytest

from harness.benchmarks import robustness
from harness.benchmarks import verdict as bench_verdict
from harness.verdict.profiles import load_profile

REPO = Path(__file__).resolve().parent.parent


def test_the_sweep_meets_every_pair_of_levels_of_any_two_factors():
    conditions = robustness.conditions()
    assert len(conditions) == 9
    factors = [[c.capability for c in conditions], [c.seed for c in conditions], [c.threads for c in conditions],
               [c.load for c in conditions]]
    assert {c.seed for c in conditions} == {0, 1, 2} and {c.threads for c in conditions} == {1, 2}
    assert {"avx2", "default"} <= {c.capability for c in conditions} and {c.load for c in conditions} == {0, 2}
    for a, b in combinations(range(4), 2):
        pairs = set(zip(factors[a], factors[b], strict=True))
        assert pairs == {(x, y) for x in set(factors[a]) for y in set(factors[b])}, (a, b)


def test_a_derived_profile_carries_the_seed_and_threads_and_stays_valid(tmp_path):
    condition = robustness.Condition("avx2", 2, 2, 0)
    path = robustness.derived_profile(REPO / "harness/profiles/cpu-smoke.toml", condition, tmp_path)
    profile = load_profile(path)
    assert profile.threads_per_rank == 2 and not profile.auto_select
    assert all(exp.args[-2:] == ("--seed", "2") for exp in profile.labs.values())


def test_the_smallest_margin_of_each_check_is_kept_with_where_it_was_seen():
    def verdict(check, margin, measured="x"):
        return {"lab": "ddp", "world_size": 2, "check": check, "margin": margin, "measured": measured,
                "expected": "y", "passed": margin is None or margin >= 0}

    grades = [{"condition": "idle", "verdicts": [verdict("time", 0.5), verdict("img_per_sec_ratio", 0.3),
                                                 verdict("run", None)]},
              {"condition": "busy", "verdicts": [verdict("time", 0.2), verdict("img_per_sec_ratio", 0.4)]}]
    margins = robustness.smallest_margins(grades)
    assert [(m["check"], m["margin"], m["condition"]) for m in margins] == [
        ("time", 0.2, "busy"), ("img_per_sec_ratio", 0.3, "idle")]  # smallest first; no margin, no row


def test_the_twice_slower_mutant_is_the_lab_with_a_busy_wait_before_each_step():
    lab = bench_verdict.LAB.read_text()
    slow = bench_verdict.mutate(lab, bench_verdict.TWICE_SLOWER)
    assert slow.count("while time.perf_counter() < busy_until:") == 1
    assert slow.index("busy_until") < slow.index("precision.scaler.step(optimizer)")
    compile(slow, "mutant", "exec")
    with pytest.raises(ValueError, match="not found once"):
        bench_verdict.mutate("no loop here", bench_verdict.TWICE_SLOWER)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_the_busy_processes_end_with_their_maker_however_it_is_stopped(tmp_path, how):
    import signal
    import subprocess
    import sys
    import time

    import psutil

    code = ("import os, sys, time\nfrom harness.benchmarks.load import busy_processes\nimport psutil\n"
            "with busy_processes(2):\n"
            "    print(*(c.pid for c in psutil.Process().children()), flush=True)\n"
            "    time.sleep(600)\n")
    maker = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    children = [int(pid) for pid in maker.stdout.readline().split()]
    assert len(children) == 2 and all(psutil.pid_exists(pid) for pid in children)
    maker.send_signal(getattr(signal, how))
    maker.wait(timeout=120)
    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 120  # an event, not a speed: each child is gone, or this fails after 2 min
    while any(alive(pid) for pid in children):
        assert time.monotonic() < deadline, "a busy process outlived the process that made it"
        time.sleep(0.05)
