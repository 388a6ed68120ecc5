"""TensorBoard event files from a run's per-epoch metrics (harness/run/tensorboard.py, distlab[tensorboard]).

The event files are read back with TensorBoard's own EventAccumulator: every metric of every epoch
is there with its value, nothing else is, and without the extra nothing is written and nothing fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.run import runner, tensorboard
from harness.run.epochs import write_epochs_csv
from harness.run.request import RunRequest

NEEDS_EXTRA = pytest.mark.skipif(not tensorboard.available(),
                                 reason="tensorboard is not installed: pip install 'distlab[tensorboard]'")
COLUMNS = ["train_loss", "test_accuracy", "epoch_seconds"]
ROWS = [[1, 2.3, 0.2, 5.0], [2, 1.1, 0.9, 4.5], [3, 0.7, 0.93, 4.25]]


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(s.step, s.value) for s in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def expected(columns: list[str], rows: list[list]) -> dict[str, list[tuple[int, float]]]:
    return {name: [(row[0], pytest.approx(row[1 + i], rel=1e-6)) for row in rows if row[1 + i] is not None]
            for i, name in enumerate(columns)}


@NEEDS_EXTRA
def test_every_metric_of_every_epoch_is_a_scalar_read_back_with_its_value(tmp_path):
    log_dir = tmp_path / "tensorboard"
    assert tensorboard.write_epochs(log_dir, COLUMNS, ROWS) == log_dir
    assert read_scalars(log_dir) == expected(COLUMNS, ROWS)
    assert [p.name for p in tmp_path.iterdir()] == ["tensorboard"]  # the staging folder is gone


@NEEDS_EXTRA
def test_the_harness_writes_them_without_importing_torch(tmp_path):
    # After every run: importing torch for it cost the harness 1.4 s of CPU per run.
    probe = ("import sys; from pathlib import Path; from harness.run import tensorboard; "
             f"tensorboard.write_epochs(Path(sys.argv[1]), {COLUMNS!r}, {ROWS!r}); print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "tensorboard")], capture_output=True,
                          text=True, timeout=120, check=True)
    assert done.stdout.split() == ["False"]
    assert read_scalars(tmp_path / "tensorboard") == expected(COLUMNS, ROWS)


@NEEDS_EXTRA
def test_a_value_that_is_not_a_finite_number_is_left_out(tmp_path):
    rows = [[1, 2.3, None, 5], [2, float("nan"), "n/a", 4], [3, True, 0.5, 3]]
    tensorboard.write_epochs(tmp_path / "tb", COLUMNS, rows)
    assert read_scalars(tmp_path / "tb") == {"train_loss": [(1, pytest.approx(2.3))],
                                             "test_accuracy": [(3, 0.5)],
                                             "epoch_seconds": [(1, 5.0), (2, 4.0), (3, 3.0)]}


@NEEDS_EXTRA
def test_the_runner_writes_them_with_epochs_csv_from_the_same_rows(tmp_path):
    record = {"metrics": {"train_loss": [2.3, 1.1, 0.7], "test_accuracy": [0.2, 0.9, 0.93],
                          "epoch_seconds": [5.0, 4.5, 4.25], "final_accuracy": 0.93}}
    write_epochs_csv(tmp_path / "epochs.csv", record)
    assert (tmp_path / "epochs.csv").read_text().splitlines()[1:] == ["1,2.3,0.2,5.0", "2,1.1,0.9,4.5",
                                                                     "3,0.7,0.93,4.25"]
    assert read_scalars(tmp_path / "tensorboard") == expected(COLUMNS, ROWS)
    write_epochs_csv(tmp_path / "none.csv", {"metrics": {"final_accuracy": 0.9}})  # no per-epoch metrics
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epochs.csv", "tensorboard"]


@NEEDS_EXTRA
def test_what_a_program_planted_at_the_folder_is_set_aside_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "tensorboard").symlink_to(victim)
    tensorboard.write_epochs(tmp_path / "tensorboard", COLUMNS, ROWS)
    assert list(victim.iterdir()) == []
    assert (tmp_path / "tensorboard").is_dir() and not (tmp_path / "tensorboard").is_symlink()
    assert (tmp_path / "tensorboard.corrupt").is_symlink()
    assert read_scalars(tmp_path / "tensorboard") == expected(COLUMNS, ROWS)


def test_without_the_extra_nothing_is_written_and_nothing_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorboard, "available", lambda: False)
    assert tensorboard.write_epochs(tmp_path / "tensorboard", COLUMNS, ROWS) is None
    write_epochs_csv(tmp_path / "epochs.csv", {"metrics": {"train_loss": [2.3], "test_accuracy": [0.2]}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epochs.csv"]


RAW_RECORD = Path(__file__).parent / "programs" / "raw_record.py"  # writes --raw as its record


@NEEDS_EXTRA
@pytest.mark.integration
def test_a_run_with_per_epoch_metrics_gets_event_files_in_its_run_directory(tmp_path):
    from test_schemas import minimal_record

    program, raw = RAW_RECORD, tmp_path / "raw.json"
    metrics = dict(zip(COLUMNS, ([row[1 + i] for row in ROWS] for i in range(len(COLUMNS))), strict=True))
    raw.write_text(json.dumps({**minimal_record(), "lab": "baseline", "metrics": metrics}))
    request = RunRequest(lab="baseline", program=program, world_size=1, launcher="python", backend="gloo",
                         lab_args=["--raw", str(raw)], results_root=tmp_path / "results", timeout_s=120,
                         python=sys.executable)
    result = runner.run_lab(request, echo=False)
    assert result.status == "ok", result.reason
    assert read_scalars(result.run_dir / "tensorboard") == expected(COLUMNS, ROWS)
    assert json.loads((result.run_dir / "run.json").read_text())["harness_errors"] == []
