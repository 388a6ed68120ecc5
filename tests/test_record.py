"""The result record: what the lab contract writes is what the harness accepts, and
anything else is refused with the file and the field named."""

import json

import pytest

from harness.run import record
from labs.common.contract import Record, write_json_atomic
from labs.common.topology import Topology, detect_topology


def valid() -> dict:
    rec = Record(lab="check", config={"backend": "gloo"}, topology=Topology(world_size=2, launcher="torchrun"),
                 backend="gloo")
    rec.metrics["img_per_sec"] = 10.0
    rec.check("allreduce_value", True, wrong_elements=0)
    return rec.to_dict()


def test_a_record_written_by_the_contract_is_valid():
    data = record.validate(valid())
    assert data["provenance"]["world_size"] == 2
    assert data["provenance"]["launcher"] == "torchrun"
    assert data["provenance"]["versions"]["torch"]


def test_a_failed_check_fails_the_record():
    rec = Record(lab="check", config={}, topology=Topology(), backend="gloo")
    rec.check("allreduce_value", False, wrong_elements=3)
    data = rec.to_dict()
    assert data["status"] == "failed"
    assert "allreduce_value" in data["reason"]


# A missing field, each one the reader requires: tests/test_schemas.py (the reader and the schema alike).


def test_wrong_types_and_values_are_refused():
    data = valid()
    data["provenance"]["world_size"] = "2"
    with pytest.raises(record.RecordError, match="'provenance.world_size' is str, expected int"):
        record.validate(data)
    data = valid()
    data["status"] = "great"
    with pytest.raises(record.RecordError, match="status"):
        record.validate(data)
    data = valid()
    data["checks"]["allreduce_value"] = {"passed": "yes"}
    with pytest.raises(record.RecordError, match="boolean field 'passed'"):
        record.validate(data)
    data = valid()
    data["schema_version"] = 99
    with pytest.raises(record.RecordError, match="schema_version 99"):
        record.validate(data)


def test_corrupt_and_missing_files_are_reported_not_half_read(tmp_path):
    path = tmp_path / "record.json"
    with pytest.raises(record.RecordError, match="no record was written"):
        record.load(path)
    path.write_text(json.dumps(valid())[:200])
    with pytest.raises(record.RecordError, match="not valid JSON"):
        record.load(path)


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "record.json"
    write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"b": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


@pytest.mark.parametrize(("env", "expected"), [
    ({}, (0, 0, 1, "none")),
    ({"TORCHELASTIC_RUN_ID": "x", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"},
     (3, 1, 4, "torchrun")),
    ({"HOROVOD_RANK": "1", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_SIZE": "2"},
     (1, 1, 2, "horovodrun")),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_SIZE": "3"},
     (2, 0, 3, "mpirun")),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, (1, 0, 2, "mpirun")),
    ({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4(x2)"},
     (5, 1, 8, "srun")),
    # horovodrun over MPI sets both families: Horovod's own names win.
    ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
     (1, 0, 2, "horovodrun")),
])
def test_topology_from_each_launcher(env, expected):
    topo = detect_topology(env)
    assert (topo.rank, topo.local_rank, topo.world_size, topo.launcher) == expected


def test_per_epoch_metrics_become_a_csv_beside_the_record(tmp_path):
    from harness.run.epochs import write_epochs_csv

    record = {"metrics": {"train_loss": [2.3, 1.1], "test_accuracy": [0.2, 0.9], "epoch_seconds": [5.0, 4.5],
                          "final_accuracy": 0.9}}
    write_epochs_csv(tmp_path / "epochs.csv", record)
    assert (tmp_path / "epochs.csv").read_text().splitlines() == [
        "epoch,train_loss,test_accuracy,epoch_seconds", "1,2.3,0.2,5.0", "2,1.1,0.9,4.5"]
    uneven = {"metrics": {"train_loss": [2.3], "test_accuracy": [0.2, 0.9]}}  # not one row per epoch: no table
    write_epochs_csv(tmp_path / "uneven.csv", uneven)
    assert not (tmp_path / "uneven.csv").exists()
