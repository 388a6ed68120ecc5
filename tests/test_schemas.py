"""The published JSON Schemas (harness/schemas/) agree with what the code writes and accepts.

Every shipped profile and plan fits the profile schema; a record written by a real lab run, the
harness's own record and a from-scratch program's minimal record fit the record schema; each field
harness/run/record.py requires is required by the schema too; a broken record or profile is refused
with the field named, by the schema check alone, by load_profile and by the runner.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import schema_check
from harness.run import accounting, record, runner
from harness.run.request import RunRequest
from harness.verdict import profiles
from harness.verdict.profiles import tomllib
from harness.verdict.references import REFERENCES

REPO = Path(__file__).resolve().parent.parent
SHIPPED = sorted((REPO / "harness/profiles").rglob("*.toml"))
LIMIT = 120  # seconds: against hangs only


@pytest.fixture(scope="module")
def lab_record(tmp_path_factory) -> dict:
    """The record of a real run of the check lab at world size 1 (no launcher: ~3 s)."""
    path = tmp_path_factory.mktemp("check") / "record.json"
    done = subprocess.run([sys.executable, str(REPO / "labs/check/check.py"), "--backend", "gloo", "--elements",
                           "16", "--record", str(path)], cwd=REPO, capture_output=True, text=True, timeout=LIMIT)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(path.read_text())


def minimal_record() -> dict:
    """What a program written from scratch writes when it keeps only the documented contract."""
    return {"schema": "distlab-record", "schema_version": 1, "lab": "ddp", "status": "ok", "reason": None,
            "metrics": {"img_per_sec": 12.5}, "checks": {"params_identical": {"passed": True}}, "config": {},
            "provenance": {"versions": {"python": "3.12.3", "torch": None},
                           "hardware": {"cpu_model": "x86_64", "cores": 2, "gpus": {}},
                           "world_size": 2, "threads_per_rank": None, "backend": "gloo", "launcher": "torchrun",
                           "git_commit": None, "start": "2026-12-01T10:00:00+00:00",
                           "end": "2026-12-01T10:01:00+00:00"}}


def test_the_schemas_are_valid_draft_2020_12_and_shipped_in_the_wheel():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["distlab.harness"]
    for name in (schema_check.RECORD_SCHEMA, schema_check.PROFILE_SCHEMA, schema_check.OBSERVATIONS_SCHEMA):
        schema = json.loads((schema_check.SCHEMA_DIR / name).read_text())
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        schema_check.validator(name)  # check_schema: raises on an invalid schema
        assert any(fnmatch.fnmatch(f"schemas/{name}", pattern) for pattern in shipped), name
    assert "jsonschema" in " ".join(pyproject["project"]["dependencies"])


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO / "harness/profiles")))
def test_every_shipped_profile_and_plan_fits_the_schema(path):
    assert schema_check.problem(tomllib.loads(path.read_text()), schema_check.PROFILE_SCHEMA) is None
    profiles.load_profile(path)  # and loads, schema check included


def test_the_profile_schema_names_the_reference_loops_of_the_code():
    schema = json.loads((schema_check.SCHEMA_DIR / schema_check.PROFILE_SCHEMA).read_text())
    assert set(schema["$defs"]["lab"]["properties"]["reference"]["enum"]) == set(REFERENCES)


def test_a_real_lab_record_the_harness_record_and_a_minimal_record_fit(lab_record):
    assert lab_record["lab"] == "check" and lab_record["status"] == "ok"
    assert schema_check.problem(lab_record, schema_check.RECORD_SCHEMA) is None
    request = RunRequest(lab="check", program=Path("x.py"), world_size=2, launcher="python", backend="gloo")
    harness_record = accounting.harness_record(request, "rank 1 exited with code 3")
    assert schema_check.problem(harness_record, schema_check.RECORD_SCHEMA) is None
    assert schema_check.problem(minimal_record(), schema_check.RECORD_SCHEMA) is None
    record.validate(minimal_record())  # the harness's own reader agrees


@pytest.mark.parametrize("dotted", list(record.REQUIRED))
def test_every_required_field_when_missing_is_named_by_the_reader_and_the_schema(dotted):
    data = minimal_record()
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        node = node[part]
    del node[last]
    assert schema_check.problem(data, schema_check.RECORD_SCHEMA) == f"missing field '{dotted}'"
    with pytest.raises(record.RecordError, match=f"student.json: missing field '{dotted}'"):
        record.validate(data, "student.json")


def _set(data: dict, dotted: str, value) -> dict:
    data = copy.deepcopy(data)
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        node = node[part]
    node[last] = value
    return data


@pytest.mark.parametrize(("dotted", "value", "message"), [
    ("status", "done", "field 'status': 'done' is not one of ['ok', 'failed']"),
    ("schema_version", 2, "field 'schema_version': 1 was expected"),
    ("schema", "my-record", "field 'schema': 'distlab-record' was expected"),
    ("reason", 3, "field 'reason': 3 is not of type 'string', 'null'"),
    ("checks.params_identical.passed", "yes", "field 'checks.params_identical.passed': 'yes' is not of type"),
    ("checks.params_identical", {"ok": True}, "missing field 'checks.params_identical.passed'"),
    ("ranks", "all", "field 'ranks': 'all' is not of type 'array'"),
    ("provenance.world_size", 0, "field 'provenance.world_size': 0 is less than the minimum of 1"),
    ("provenance.hardware.cores", "2", "field 'provenance.hardware.cores': '2' is not of type 'integer'"),
    ("provenance.threads_per_rank", True, "field 'provenance.threads_per_rank': True is not of type"),
    ("metrics", [1, 2], "field 'metrics': [1, 2] is not of type 'object'"),
])
def test_a_broken_record_is_refused_with_the_field_named(dotted, value, message):
    found = schema_check.problem(_set(minimal_record(), dotted, value), schema_check.RECORD_SCHEMA)
    assert found is not None and found.startswith(message), found
    with pytest.raises(record.RecordError, match=r"^where: .*record\.schema\.json"):
        record.check_record(_set(minimal_record(), dotted, value), "where")


def test_fields_the_contract_leaves_open_stay_open():
    data = _set(minimal_record(), "metrics.sample_order", [[{"count": 3, "sha256": "ab"}]])
    data = _set(data, "provenance.omp_num_threads", 4)  # documented, but no type promised
    data["ranks"] = [{"rank": 0, "host": "a"}]
    data["my_own_field"] = {"anything": [1, "two", None]}
    assert schema_check.problem(data, schema_check.RECORD_SCHEMA) is None


def _profile(tmp_path: Path, change) -> Path:
    data = tomllib.loads((REPO / "harness/profiles/cpu-smoke.toml").read_text())
    change(data)
    import tomli_w

    path = tmp_path / "broken.toml"
    path.write_text(tomli_w.dumps(data))
    return path


@pytest.mark.parametrize(("change", "message"), [
    # What only the schema checks: the key named, in load_profile's own words.
    (lambda d: d["match"].update(gpu_model=5), "key 'match.gpu_model': 5 is not of type 'string'"),
    (lambda d: d["match"].update(min_cores="8"), "key 'match.min_cores': '8' is not of type 'integer'"),
    (lambda d: d["labs"]["check"].update(required_checks=[1]),
     "key 'labs.check.required_checks[0]': 1 is not of type 'string'"),
    (lambda d: d["labs"]["check"].update(metrics={"busbw": {"min": 1, "tolerance": -1}}),
     "key 'labs.check.metrics.busbw.tolerance': -1 is less than the minimum of 0"),
    # What the precise checks catch first keeps their message.
    (lambda d: d.update(threads_per_rank=0), "key 'threads_per_rank': expected a whole number of threads from 1"),
    (lambda d: d["measured"].pop("where"), "key 'measured.where': expected a string saying"),
    (lambda d: d["labs"]["check"].update(world_sizes=[1, 1]), "each world size once"),
    (lambda d: d["labs"]["check"].update(metrics={"busbw": {}}), "key 'labs.check.metrics.busbw.min': expected"),
], ids=["gpu-model", "min-cores", "check-names", "tolerance", "threads", "measured", "repeat", "empty-band"])
def test_a_broken_profile_is_refused_with_the_key_named(tmp_path, change, message):
    path = _profile(tmp_path, change)
    with pytest.raises(profiles.ProfileError) as error:
        profiles.load_profile(path)
    assert str(error.value).startswith(f"profile {path}: "), error.value
    assert message in str(error.value), error.value


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["labs"]["ddp"]["metrics"].update(img_per_sec={}),
     "field 'labs.ddp.metrics.img_per_sec' needs one of: at_least_ratio; expected and at_least_fraction; "
     "value and tolerance; min; max"),
    (lambda d: d["labs"]["ddp"].pop("reference"), "missing field 'labs.ddp.reference'"),
    (lambda d: d["labs"]["ddp"].update(epochs=3), "field 'labs.ddp.epochs' is not one the schema knows"),
    (lambda d: d.update(name="a/b"), "field 'name': 'a/b' does not match"),
    (lambda d: d["labs"]["ddp"]["efficiency_min"].update({"0": 0.5}), "field 'labs.ddp.efficiency_min': '0' does not"),
])
def test_the_profile_schema_names_the_field_alone(change, message):
    data = tomllib.loads((REPO / "harness/profiles/cpu-smoke.toml").read_text())
    change(data)
    found = schema_check.problem(data, schema_check.PROFILE_SCHEMA)
    assert found is not None and found.startswith(message), found


RAW_RECORD = Path(__file__).parent / "programs" / "raw_record.py"  # writes --raw as its record


@pytest.mark.integration
def test_the_runner_fails_a_run_whose_record_breaks_the_schema_and_names_the_field(tmp_path):
    program, raw = RAW_RECORD, tmp_path / "raw.json"
    raw.write_text(json.dumps({**minimal_record(), "lab": "check", "ranks": "all"}))
    request = RunRequest(lab="check", program=program, world_size=1, launcher="python", backend="gloo",
                         lab_args=["--raw", str(raw)], results_root=tmp_path / "results", timeout_s=LIMIT,
                         python=sys.executable)
    result = runner.run_lab(request, echo=False)
    assert result.status == "failed" and result.returncode == 0
    assert "field 'ranks': 'all' is not of type 'array'" in result.reason
    run = json.loads((result.run_dir / "run.json").read_text())
    assert run["status"] == "failed" and "field 'ranks'" in run["record_error"]
    written = json.loads((result.run_dir / "record.json").read_text())  # the harness's own, saying why
    assert written["provenance"]["written_by"] == "harness" and "field 'ranks'" in written["reason"]
    assert json.loads((result.run_dir / "record.corrupt.json").read_text())["ranks"] == "all"  # kept aside
