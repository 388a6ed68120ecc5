"""What the observer leaves in a run's observe directory, named once. The observer writes these
(output.py); the harness reads them (harness/observe/observations.py, accuracy.py) and checks each
rank's file against harness/schemas/observations.schema.json, the format's one definition.

Standard library only, nothing at import: the grader imports this module by itself.
"""

import re

SCHEMA = "distlab-observations"  # each rank file's "schema"
SCHEMA_VERSION = 3  # 2: every rank's final weights, the steps at each save and before each pass, a stop;
# 3: the libraries seen (libraries.py: forwards and autocast per pass, DDP, no_sync, saves), the backend config
RANK_FILE = "rank.{rank}.json"  # one per rank that observed anything, written at its exit
RANK_FILES = "rank.*.json"
ERRORS_FILE = "observer-errors.{pid}.txt"  # the observer's own failures, per process
ERRORS_FILES = "observer-errors.*.txt"
WEIGHTS_FILE = "final_weights.pt"  # rank 0's final model state, for the harness to evaluate
RANK_WEIGHTS_FILE = "final_weights.{rank}.pt"  # another rank's: where the replicas differ, each is evaluated
# A launched rank that spawned processes itself (mp.spawn under torchrun), noted at the call (libraries.py).
SPAWN_FILE = "spawn.{pid}.json"
SPAWN_FILES = "spawn.*.json"
# Each rank's timeline (rank file's "timeline"): when it reached each of these milestones, in seconds of
# CLOCK_MONOTONIC (originals._stamp), the first time for each but "last_step" (the last optimizer step).
# For the user's information (where a run's time goes: harness/observe/timeline.py), never for a verdict.
TIMELINE = ("observer_loaded",  # sitecustomize ran: the interpreter has started, torch not yet imported
            "torch_imported",  # torch's module has executed (its import, the rank's heaviest start-up cost)
            "process_group_called",  # init_process_group (or hvd.init) called: the program's own imports are done
            "process_group",  # init_process_group (or hvd.init) returned: the rendezvous is done
            "first_batch",  # a loader handed the program its first batch
            "last_step",  # the last optimizer step returned
            "exit")  # the observer's exit handler began: the program is done, its files are written next
# A resume cell (harness/grading/cells.py) stops every rank of the first attempt once this many
# training epochs are done (environment, read by the observer), at the first optimizer step of the
# next; that attempt's observations go to STOPPED_DIR and the ranks exit with STOP_EXIT_CODE, which
# torchrun (--max-restarts) answers by starting them again: the program resumes as it would after a
# failure. Only the first attempt stops (TORCHELASTIC_RESTART_COUNT 0 or unset).
STOP_AFTER_EPOCHS = "DISTLAB_STOP_AFTER_EPOCHS"
STOPPED_DIR = "stopped"
STOP_EXIT_CODE = 75  # EX_TEMPFAIL: "try again"
# Each loader pass, when it ends (and each pass still open at exit, then), one PASS_LINE on the rank's
# stderr, written through a descriptor the observer took when it loaded: evidence that leaves the
# process as it happens, so that a record rewritten before exit shows (issue 44). The harness collects
# the lines from the launcher's output as they arrive (harness/run/output.py: the first line for each
# rank, pid and pass is kept, at most PASS_LINES_KEPT; a pid alone repeats across hosts and
# containers) and writes them, once no process of the run is left, to PASS_NOTES_FILE in the observe
# directory (one PASS_LINE each); observations.py compares each recorded pass with them
# (digests.pass_digest). The observer never writes PASS_NOTES_FILE.
PASS_LINE = "distlab-observer: rank={rank} pid={pid} pass={number} sha256={digest}"
PASS_NOTES_FILE = "passes-streamed.txt"
PASS_LINES_KEPT = 20_000  # 100 epochs of two loaders on 64 ranks is 12,800; some 90 bytes a line
_PASS_LINE = re.compile(r"distlab-observer: rank=(\d{1,10}) pid=(\d{1,10}) pass=(\d{1,10}) sha256=([0-9a-f]{64})")


def parse_pass_line(text: str) -> tuple[int, int, int, str] | None:
    """(rank, pid, pass number, digest) of the PASS_LINE found anywhere in `text` (after a launcher's prefix
    such as torchrun's "[default0]:", or the unfinished line the program had written before it); None
    where there is none."""
    found = _PASS_LINE.search(text)
    return (int(found[1]), int(found[2]), int(found[3]), found[4]) if found else None
