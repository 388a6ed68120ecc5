"""The run stage: a request checked, launched through a real launcher, and accounted for in its run
directory (run.json, record.json, the rank logs). Imports only the harness's base modules
(catalog, files, usage, console, schema_check) and harness.on_ranks' paths: never observe, verdict,
report or commands (tests/test_architecture.py)."""
