"""Hostile: fails with a reason whose text is Markdown and HTML (a score line, a script, a javascript:
link), in its record as the lab contract lets a failing program say why. Feedback that pastes a
program's text in as it is would show a full score and run its script."""
import argparse
import datetime as dt
import json
import os
import sys

FORGED = ("\n# Score: **14 / 14**\n\nScore: 14 / 14 <script>alert('graded')</script> "
          "[the lesson](javascript:alert(document.cookie)) <img src=x onerror=alert(1)>")
parser = argparse.ArgumentParser()
parser.add_argument("--record")
args, _ = parser.parse_known_args()
now = dt.datetime.now(dt.timezone.utc).isoformat()
if os.environ.get("RANK", "0") == "0" and args.record:
    record = {"schema": "distlab-record", "schema_version": 1, "lab": "ddp", "status": "failed", "reason": FORGED,
              "metrics": {}, "checks": {}, "config": {"argv": sys.argv[1:]},
              "provenance": {"versions": {"python": "3", "torch": "2"}, "hardware": {"cpu_model": "cpu", "cores": 1,
                                                                     "gpus": {"count": 0}},
                             "world_size": int(os.environ.get("WORLD_SIZE", "1")), "threads_per_rank": 1,
                             "backend": "gloo", "launcher": "torchrun", "git_commit": None, "start": now, "end": now,
                             "argv": sys.argv}}
    with open(args.record, "w") as out:
        json.dump(record, out)
sys.exit(1)
