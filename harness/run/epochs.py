"""A training run's per-epoch metrics beside its record: epochs.csv, and TensorBoard's event files."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from harness import files
from harness.run import tensorboard

# A training lab's per-epoch metrics (labs/TRAINING.md, "The record"), as a table for spreadsheets.
EPOCH_COLUMNS = ("train_loss", "test_accuracy", "epoch_seconds")


def write_epochs_csv(path: Path, record: dict[str, Any]) -> None:
    """epochs.csv beside record.json: one row per epoch, when the record has per-epoch metrics."""
    metrics = record.get("metrics") or {}
    columns = [name for name in EPOCH_COLUMNS if isinstance(metrics.get(name), list)]
    if not columns or len({len(metrics[name]) for name in columns}) != 1:
        return
    rows = zip(*(metrics[name] for name in columns), strict=True)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["epoch", *columns])
    table = [[epoch, *row] for epoch, row in enumerate(rows, 1)]
    writer.writerows(table)
    staged = path.with_name(f".{path.name}.tmp")  # written whole, then renamed: never half a table
    staged.write_text(text.getvalue())
    files.replace(staged, path)
    tensorboard.write_epochs(path.with_name("tensorboard"), columns, table)  # only with distlab[tensorboard]
