"""Elastic recovery: torchrun --max-restarts brings a crashed DDP run back from its checkpoint."""

import pytest

from harness.runner import run_processes

pytestmark = pytest.mark.integration

# 256 images, batch 32 per rank, 2 ranks: 4 steps an epoch. The crash at step 6 is in epoch 2,
# after the checkpoint of epoch 1.
SMOKE = ["--smoke", "--epochs", "3"]


@pytest.mark.xfail(strict=False, reason="flaky, issue 8 left open: under load, after torchrun restarts the "
                   "ranks, Gloo's connectFullMesh dials an address of the failed attempt (Connection refused) "
                   "and the restart fails")
def test_a_killed_rank_is_restarted_and_the_run_resumes_from_its_checkpoint(distlab_run, tmp_path):
    clean = distlab_run("ddp", 2, lab_args=[*SMOKE, "--checkpoint", str(tmp_path / "clean.pt")])
    assert clean.returncode == 0, clean.output
    crashed = distlab_run("ddp", 2, lab_args=[*SMOKE, "--checkpoint", str(tmp_path / "elastic.pt"),
                                              "--fault", "crash:rank=1:step=6"], extra=["--max-restarts", "1"])
    assert crashed.returncode == 0, crashed.output
    assert "fault: crash on rank 1 at step 6" in crashed.output
    assert crashed.record["metrics"]["restarts"] == 1
    assert crashed.run["restarts"] == 1
    # Resumed from epoch 1's checkpoint, the run retraces the uninterrupted one.
    assert crashed.record["metrics"]["final_accuracy"] == pytest.approx(clean.record["metrics"]["final_accuracy"],
                                                                        abs=0.02)
    assert crashed.record["checks"]["params_identical"]["passed"]
    assert run_processes(crashed.run["run_id"]) == []


def test_without_restarts_the_same_crash_fails_the_run(distlab_run, tmp_path):
    crashed = distlab_run("ddp", 2, lab_args=[*SMOKE, "--checkpoint", str(tmp_path / "c.pt"),
                                              "--fault", "crash:rank=1:step=6"])
    assert crashed.returncode == 1
    assert crashed.run["failure"]["rank"] == 1 and crashed.run["failure"]["exit_code"] == 3
