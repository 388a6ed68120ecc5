"""How far an honest program's own numbers may be from the harness's measurement of the same run."""

from __future__ import annotations

import math
from typing import Any

# In bf16 (fp16) each layer's output is rounded to 8 (11) bits, and two honest evaluations in other
# processes or batches (cuDNN picks its algorithms per process and shape) round differently. Measured
# on a CPU (oneDNN, docs/gpu-acceptance.md): bf16 against fp32 changed 3 predictions of 256, and 8 of
# 256 had their two highest logits within 1% of the largest; two bf16 paths can be twice as far apart
# as one is from fp32. So 3% of the test images, provisional until the acceptance's claim spread on a GPU.
CLAIM_SHARE_BY_PRECISION = {"bf16": 0.03, "fp16": 0.03}


def accuracy_claim_tolerance(test_images: int | None, precision: str | None = None) -> float:
    """How far a program's own final accuracy may honestly be from the harness's measurement of rank
    0's weights: one test image. Once the replicas are one model (parameters and buffers bitwise
    equal, observed), the program and the harness apply the same function to the same images; they
    batch them differently (each rank its own shard, the harness the whole set), and the rounding of
    another batch shape can flip an argmax only where two logits tie to within it, which one image
    in the test sets graded here allows for. Where only the ranks' buffers differ, each rank evaluated
    a model of its own and the two numbers are not compared (observe/data_parallel.compare_claims).
    In bf16 or fp16, CLAIM_SHARE_BY_PRECISION of them. The 1e-9 absorbs the claim's float repr."""
    images = max(1, math.ceil(CLAIM_SHARE_BY_PRECISION.get(precision or "", 0.0) * (test_images or 0)))
    return (images + 1e-9) / test_images if test_images else 0.0


def mean_accuracy_claim_tolerance(test_images_per_rank: list[int]) -> float:
    """The same one test image, for a claim that averages each rank's own accuracy (Horovod's examples:
    metric_average of correct / len(test_sampler)): one image flipped on rank r moves the mean by
    1 / (R n_r), at most the largest of these over the R ranks. Where the ranks hold different models
    each rank's own model is evaluated on the images it evaluated (harness/observe/accuracy.py), so
    the two apply the same functions to the same images, batched differently."""
    counts = [n for n in test_images_per_rank if n]
    return (1 + 1e-9) / (len(counts) * min(counts)) if counts else 0.0


def own_model_claims(own_models: dict[str, Any] | None) -> list[tuple[str, float, float]] | str | None:
    """What a data-parallel program may report of its ranks' own evaluations, from the harness's
    measure of each rank's own model on the test images that rank evaluated (observe/accuracy.py,
    own_models): (what, accuracy, tolerance) each, the images pooled (the labs: every rank's count
    summed, then divided) and each rank's accuracy averaged (Horovod's examples: metric_average);
    ranks that evaluated nothing left out. A string: why they could not be measured. None: the
    ranks hold one model, nothing was asked."""
    if own_models is None:
        return None
    if own_models.get("error") or not own_models.get("ranks"):
        return own_models.get("error") or "no rank evaluated the test set after training"
    ranks = own_models["ranks"]
    counted = {int(r): (int(v["correct"]), int(v["total"])) for r, v in ranks.items() if v.get("total")}
    if not counted:
        return "no rank evaluated a test image after training"
    correct, total = (sum(c for c, _ in counted.values()), sum(n for _, n in counted.values()))
    if len(counted) == 1:
        rank = next(iter(counted))
        return [(f"rank {rank}'s own model on the {total} test images it evaluated", correct / total,
                 accuracy_claim_tolerance(total))]
    each = {r: c / n for r, (c, n) in sorted(counted.items())}
    shown = ", ".join(f"rank {r} {a:.4g}" for r, a in each.items())
    return [(f"each rank's own model on the test images it evaluated, pooled ({correct}/{total})", correct / total,
             accuracy_claim_tolerance(total)),
            (f"each rank's own model's accuracy on the test images it evaluated, averaged ({shown})",
             sum(each.values()) / len(each), mean_accuracy_claim_tolerance([n for _, n in counted.values()]))]
