"""How far an honest program's own numbers may be from the harness's measurement of the same run."""

from __future__ import annotations


def accuracy_claim_tolerance(test_images: int | None) -> float:
    """How far a program's own final accuracy may honestly be from the harness's measurement of rank
    0's weights: one test image. Once the replicas are one model (parameters and buffers bitwise
    equal, observed), the program and the harness apply the same function to the same images; they
    batch them differently (each rank its own shard, the harness the whole set), and the rounding of
    another batch shape can flip an argmax only where two logits tie to within it, which one image
    in the test sets graded here allows for. Where only the ranks' buffers differ, each rank evaluated
    a model of its own and the two numbers are not compared (observe/data_parallel.compare_claims).
    The 1e-9 absorbs the claim's float repr."""
    return (1 + 1e-9) / test_images if test_images else 0.0
