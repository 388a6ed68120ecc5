"""What the observer leaves in a run's observe directory, named once. The observer writes these
(observer.py); the harness reads them (harness/observe/observations.py, accuracy.py) and checks each
rank's file against harness/schemas/observations.schema.json, the format's one definition.

Standard library only, nothing at import: the grader imports this module by itself.
"""

SCHEMA = "distlab-observations"  # each rank file's "schema"
SCHEMA_VERSION = 1
RANK_FILE = "rank.{rank}.json"  # one per rank that observed anything, written at its exit
RANK_FILES = "rank.*.json"
ERRORS_FILE = "observer-errors.{pid}.txt"  # the observer's own failures, per process
ERRORS_FILES = "observer-errors.*.txt"
WEIGHTS_FILE = "final_weights.pt"  # rank 0's final model state, for the harness to evaluate
