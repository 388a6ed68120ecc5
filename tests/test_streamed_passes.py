"""Each loader pass's line, streamed by the observer when the pass ended, against the rank file written
at exit (issue 44, "rewrites the observer"): a record changed in the process after its pass ended is
not taken, and the checks that rest on it are not verified.

The pump's collecting runs through the harness's real OutputPump on a real pipe; the comparison reads
made-up rank files and the notes file the harness writes (keep_streamed_passes). A program that
rewrites its record at exit, run through the real runner, is in tests/test_cheats.py.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from conftest import write_rank_observation

from harness.observe import data_parallel, observations
from harness.observe.check import NOT_VERIFIED, Check
from harness.on_ranks.observer.distlab_observer.digests import pass_digest
from harness.on_ranks.observer.distlab_observer.fileformat import (
    PASS_LINE,
    PASS_LINES_KEPT,
    PASS_NOTES_FILE,
    STOPPED_DIR,
    parse_pass_line,
)
from harness.run.output import OutputPump, StreamedPasses, keep_streamed_passes

SAMPLES, STEPS = 8, 2
# Without set_epoch every epoch is the same permutation; the cheat reverses every other one at exit.
ORDER = [3, 1, 6, 0, 7, 2, 5, 4]
SHARDS = {0: ORDER[0::2], 1: ORDER[1::2]}


def training_pass(indices: list[int]) -> dict:
    return {"dataset_len": SAMPLES, "sampler": "DistributedSampler", "batches": STEPS, "steps": STEPS,
            "batch_sizes": [len(indices) // STEPS], "indices": indices}


def pump(data: bytes) -> OutputPump:
    """The harness's OutputPump draining `data` from a real pipe, as it drains a launcher's output."""
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as stream:
        drained = OutputPump(stream, [], echo=False, on_line=None)
        drained.start()

        def write() -> None:  # the launcher's side: everything, then its end of the pipe closed
            os.write(write_end, data)
            os.close(write_end)

        writer = threading.Thread(target=write)
        writer.start()
        writer.join()
        drained.join()
    return drained


def streamed(folder: Path, lines: list[tuple[int, int, int, str]]) -> None:
    """The notes file as the harness writes it once the run has ended, from lines its pump collected."""
    collected = StreamedPasses()
    for rank, pid, number, digest in lines:
        collected.see(PASS_LINE.format(rank=rank, pid=pid, number=number, digest=digest))
    assert keep_streamed_passes(folder, collected) is None


def run_without_set_epoch(folder: Path, rewritten: bool) -> list[tuple[int, int, int, str]]:
    """Two ranks, two training epochs each in one order; with `rewritten`, each rank's second epoch
    reversed in its record after the pass ended. The lines each rank's observer streamed as they ended."""
    lines = []
    for rank, shard in SHARDS.items():
        epochs = [shard, shard]
        lines += [(rank, 1000 + rank, n, pass_digest(indices, STEPS)) for n, indices in enumerate(epochs)]
        recorded = [shard, shard[::-1]] if rewritten else epochs
        write_rank_observation(folder, rank, loader_passes=[training_pass(i) for i in recorded],
                               optimizer_steps=2 * STEPS)
    return lines


def judged(folder: Path) -> dict[str, Check]:
    seen = observations.load(folder)
    return {c.name: c for c in data_parallel.checks(seen, "gloo", 2, train_set_size=SAMPLES)}


# ------------------------------------------------------------------------------------ the pump's collecting


def test_the_pump_keeps_the_first_line_for_each_pass_behind_a_launcher_prefix():
    first, later, other = "a" * 64, "b" * 64, "c" * 64
    output = (f"[default0]:epoch 0 loss 1.2\n"
              f"[default1]:distlab-observer: rank=1 pid=41 pass=0 sha256={first}\n"
              f"[default1]:distlab-observer: rank=1 pid=41 pass=0 sha256={later}\n"  # printed after: never replaces it
              f"[default0]:progress 50%distlab-observer: rank=0 pid=40 pass=3 sha256={other}\r\n"  # an unended line
              f"distlab-observer: rank=2 pid=42 pass=0 sha256=not-a-digest\n").encode()
    kept = [parse_pass_line(line) for line in pump(output).passes.to_bytes().decode().splitlines()]
    assert kept == [(1, 41, 0, first), (0, 40, 3, other)]


def test_the_pump_keeps_a_bounded_number_of_lines():
    flood = "".join(f"distlab-observer: rank=0 pid=7 pass={n} sha256={'d' * 64}\n" for n in range(PASS_LINES_KEPT + 50))
    kept = pump(flood.encode()).passes.to_bytes().decode().splitlines()
    assert len(kept) == PASS_LINES_KEPT
    assert parse_pass_line(kept[-1]) == (0, 7, PASS_LINES_KEPT - 1, "d" * 64)  # the first ones, in order


def test_the_harness_replaces_a_notes_file_the_program_left_never_following_it(tmp_path):
    folder, elsewhere = tmp_path / "observe", tmp_path / "elsewhere.txt"
    folder.mkdir()
    elsewhere.write_text("the program's\n")
    (folder / PASS_NOTES_FILE).symlink_to(elsewhere)
    streamed(folder, [(0, 5, 0, "e" * 64)])
    assert not (folder / PASS_NOTES_FILE).is_symlink() and elsewhere.read_text() == "the program's\n"
    assert parse_pass_line((folder / PASS_NOTES_FILE).read_text()) == (0, 5, 0, "e" * 64)
    # Where the observer wrote nothing, or a link stands for its folder, the harness writes nothing there.
    assert keep_streamed_passes(tmp_path / "none", StreamedPasses()) is None and not (tmp_path / "none").exists()
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere-folder", target_is_directory=True)
    (tmp_path / "elsewhere-folder").mkdir()
    assert keep_streamed_passes(tmp_path / "linked", StreamedPasses()) is None
    assert list((tmp_path / "elsewhere-folder").iterdir()) == []


# ------------------------------------------------------------------------------------- the comparison


def test_a_record_as_streamed_is_judged(tmp_path):
    streamed(tmp_path, run_without_set_epoch(tmp_path, rewritten=False))
    seen = judged(tmp_path)
    assert seen["observer"].passed, seen["observer"]
    assert seen["shards_disjoint"].passed and seen["shards_disjoint"].applicable
    order = seen["order_changes_per_epoch"]
    assert not order.passed and "same order in epochs 0 and 1" in order.detail


def test_a_record_rewritten_after_its_pass_ended_is_not_taken(tmp_path):
    streamed(tmp_path, run_without_set_epoch(tmp_path, rewritten=True))
    seen = judged(tmp_path)
    assert not seen["observer"].passed
    assert "rank 0's record of loader pass 1 differs from what the observer streamed" in seen["observer"].detail
    for name in ("shards_disjoint", "shards_cover", "order_changes_per_epoch"):
        check = seen[name]
        assert check.passed and not check.applicable, check
        assert check.detail.startswith(f"{NOT_VERIFIED}: rank 0's record of loader pass 1 changed")


def test_passes_the_record_dropped_after_they_were_streamed_show(tmp_path):
    lines = run_without_set_epoch(tmp_path, rewritten=False)
    streamed(tmp_path, [*lines, (1, 1001, 2, pass_digest(SHARDS[1], STEPS))])  # rank 1 streamed a third epoch
    seen = judged(tmp_path)
    assert "rank 1's record of loader pass 2 differs" in seen["observer"].detail
    assert not seen["order_changes_per_epoch"].applicable


def test_a_pass_without_a_line_is_not_verified_and_without_notes_all_is_as_before(tmp_path):
    lines = run_without_set_epoch(tmp_path, rewritten=True)
    streamed(tmp_path, [line for line in lines if line[1] != 1000])  # rank 0's descriptor closed
    seen = judged(tmp_path)
    order = seen["order_changes_per_epoch"]
    assert order.passed and not order.applicable and "no line was streamed for rank 0's loader pass 0" in order.detail
    assert "rank 1's record of loader pass 1 differs" in seen["observer"].detail
    # No notes file at all (observations made without the harness's runner): nothing to compare with.
    (tmp_path / PASS_NOTES_FILE).unlink()
    seen = judged(tmp_path)
    assert seen["observer"].passed and seen["order_changes_per_epoch"].applicable


def test_a_stopped_attempt_is_held_against_its_run_s_lines(tmp_path):
    stopped = tmp_path / STOPPED_DIR
    lines = run_without_set_epoch(stopped, rewritten=True)
    streamed(tmp_path, lines)
    (stopped / PASS_NOTES_FILE).write_text("".join(PASS_LINE.format(rank=rank, pid=pid, number=n, digest=pass_digest(
        SHARDS[rank][::-1] if n else SHARDS[rank], STEPS)) + "\n" for rank, pid, n, _ in lines))
    seen = observations.load(stopped)  # the program's own notes in stopped/ are not the harness's: not read
    assert seen.ranks[0].passes_unverified and "differs from what the observer streamed" in seen.problems[0]


def test_ranks_on_two_hosts_with_one_pid_are_each_held_against_their_own_lines(tmp_path):
    """A pid repeats across hosts and containers (two pods' ranks are often both pid 15): the lines
    are the rank's and the pid's together, so a correct run on two hosts is never taken as changed."""
    lines = []
    for rank, shard in SHARDS.items():
        epochs = [shard, shard[::-1]]
        lines += [(rank, 15, n, pass_digest(indices, STEPS)) for n, indices in enumerate(epochs)]
        write_rank_observation(tmp_path, rank, pid=15, loader_passes=[training_pass(i) for i in epochs],
                               optimizer_steps=2 * STEPS)
    streamed(tmp_path, lines)
    seen = judged(tmp_path)
    assert seen["observer"].passed, seen["observer"]
    assert seen["order_changes_per_epoch"].passed and seen["order_changes_per_epoch"].applicable
