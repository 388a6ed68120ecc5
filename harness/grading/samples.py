"""A finished run as the grader judges it (a Sample): the harness's account, the record (the
program's claims), and what the harness observed and measured of the run itself."""

from __future__ import annotations

from harness.catalog import LABS
from harness.observe import accuracy, data_parallel, observations
from harness.run.request import RunRequest
from harness.run.run_dir import OBSERVE_DIR, RUN_DIR_PLACEHOLDER
from harness.run.state import RunResult
from harness.verdict.profiles import LabExpectation
from harness.verdict.tolerances import accuracy_claim_tolerance
from harness.verdict.verdicts import Sample


def sample_of(result: RunResult) -> Sample:
    return Sample(str(result.run_dir), result.status, result.reason, result.wall_seconds, result.record)


def timed(result: RunResult, metric_name: str) -> Sample:
    """A run with its training throughput timed by the harness, where its observer saw training
    (img_per_sec of a data-parallel training lab, or of the course lab timing a student's program)."""
    sample = sample_of(result)
    observe_dir = result.run_dir / OBSERVE_DIR
    if metric_name == "img_per_sec" and observe_dir.is_dir():
        sample.measured[metric_name] = rate = observations.throughput(observations.load(observe_dir))
        if rate is None:
            sample.measure_errors[metric_name] = (
                f"no rank was seen training past its first {observations.WARMUP_STEPS} optimizer steps (the warm-up, "
                "left out)")
    return sample


def observed_sample(result: RunResult, exp: LabExpectation, request: RunRequest,
                    evaluator: accuracy.Evaluator) -> Sample:
    """A run as the grader judges it. For a data-parallel training lab, what the harness saw itself:
    the checks computed from every rank's observations, its training throughput, the accuracy of
    rank 0's final weights measured on the test set, and every claim of the record that these
    contradict."""
    trains_data_parallel = LABS[exp.catalog_lab].data_parallel
    sample = timed(result, exp.throughput_metric) if trains_data_parallel else sample_of(result)
    observe_dir = result.run_dir / OBSERVE_DIR
    # A run that failed is observed too: its own failed check is a claim, what the harness saw the fact.
    if not trains_data_parallel or not observe_dir.is_dir():
        return sample
    lab_args = [arg.replace(RUN_DIR_PLACEHOLDER, str(result.run_dir)) for arg in request.lab_args]
    # Measured always, graded where the profile has an accuracy band: a claim is compared either way.
    measurement = evaluator.measure(observe_dir, lab_args)
    sample.measured[exp.accuracy_metric] = measurement.get("accuracy")
    if measurement.get("error"):
        sample.measure_errors[exp.accuracy_metric] = measurement["error"]
    checks = data_parallel.checks(observations.load(observe_dir), request.backend, request.world_size,
                                  train_set_size=measurement.get("train_size"))
    checks += data_parallel.compare_claims(result.record, checks, measurement.get("accuracy"),
                                           accuracy_claim_tolerance(measurement.get("total")),
                                           measured_img_per_sec=sample.measured.get("img_per_sec"))
    sample.observed = [check.to_dict() for check in checks]
    return sample
