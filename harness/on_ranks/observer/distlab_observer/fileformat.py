"""What the observer leaves in a run's observe directory, named once. The observer writes these
(observer.py); the harness reads them (harness/observe/observations.py, accuracy.py) and checks each
rank's file against harness/schemas/observations.schema.json, the format's one definition.

Standard library only, nothing at import: the grader imports this module by itself.
"""

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
# A resume cell (harness/grading/cells.py) stops every rank of the first attempt once this many
# training epochs are done (environment, read by the observer), at the first optimizer step of the
# next; that attempt's observations go to STOPPED_DIR and the ranks exit with STOP_EXIT_CODE, which
# torchrun (--max-restarts) answers by starting them again: the program resumes as it would after a
# failure. Only the first attempt stops (TORCHELASTIC_RESTART_COUNT 0 or unset).
STOP_AFTER_EPOCHS = "DISTLAB_STOP_AFTER_EPOCHS"
STOPPED_DIR = "stopped"
STOP_EXIT_CODE = 75  # EX_TEMPFAIL: "try again"
