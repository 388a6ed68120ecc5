"""Hostile: prints the whole environment it was started with, on every rank, and ends with it in its
error: whatever the grader's environment holds (a token, a password) would reach its feedback."""
import os
import sys

print("environment:", sorted(os.environ.items()), flush=True)
sys.exit(f"environment: {' '.join(f'{k}={v}' for k, v in sorted(os.environ.items()))}")
