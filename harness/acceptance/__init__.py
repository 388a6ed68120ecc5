"""The GPU acceptance's machinery, under `distlab acceptance` (harness/commands/acceptance.py: its
arguments and what it prints).

Built for a machine lent for minutes (docs/gpu-acceptance.md):
- a hard deadline, overall (--deadline) and per step: each step gets its share of the time left,
  is stopped (SIGINT: it keeps and reports what finished) when that runs out, and every process it
  left is ended; a step that fails is recorded and the next one starts;
- every step is written AS IT GOES into the folder the caller names (--out): acceptance.json (the
  steps, their seconds, the preflight, the estimate), acceptance.log (every step's output),
  doctor.json, the profile, and acceptance.tar.gz (the whole results folder without weights), all
  rewritten after each step, so a run cut short still returns what ran.

One module per concern, in the order they are used: plan.py (the one-GPU plan, ROWS, as calibrate's
template), estimate.py (ESTIMATE: each phase's seconds), steps.py (the steps as distlab command
lines), preflight.py (what the real run needs, checked first), deadline.py (Clock, run_step: a step
under its limit), processes.py (what a step left running, ended), outbox.py (--out and the archive),
session.py (one acceptance: begun, its steps run in order).
"""
