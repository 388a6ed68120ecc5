"""BatchNorm over the global batch on CPUs (labs/common/batchnorm.py), against one process's BatchNorm.

Two gloo ranks each hold half of one batch; their GlobalBatchNorm2d must give what nn.BatchNorm2d
gives on the whole batch in one process: outputs, input gradients, weight and bias gradients
(summed over ranks, as DDP's average times the world size), and running statistics.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

PROGRAM = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from labs.common.batchnorm import convert_to_global_batchnorm

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    batch = torch.randn(8, 3, 5, 5) * 3 + 1
    weigh = torch.randn(8, 3, 5, 5)  # a loss that is not symmetric in the samples
    reference = nn.BatchNorm2d(3)
    with torch.no_grad():
        reference.weight.uniform_(0.5, 1.5)
        reference.bias.uniform_(-0.5, 0.5)
    local = convert_to_global_batchnorm(nn.Sequential(nn.BatchNorm2d(3)))[0]
    local.load_state_dict(reference.state_dict())

    whole = batch.clone().requires_grad_()
    expected = reference(whole)  # once: every forward in training mode moves the running statistics
    (expected * weigh).sum().backward()
    part = batch.chunk(size)[rank].clone().requires_grad_()
    out = local(part)
    (out * weigh.chunk(size)[rank]).sum().backward()
    grads = torch.cat([local.weight.grad, local.bias.grad])
    dist.all_reduce(grads)
    worst = {
        "output": (out - expected.chunk(size)[rank]).abs().max().item(),
        "input_grad": (part.grad - whole.grad.chunk(size)[rank]).abs().max().item(),
        "param_grad": (grads - torch.cat([reference.weight.grad, reference.bias.grad])).abs().max().item(),
        "running_mean": (local.running_mean - reference.running_mean).abs().max().item(),
        "running_var": (local.running_var - reference.running_var).abs().max().item(),
    }
    if rank == 0:
        print(json.dumps(worst))
    dist.destroy_process_group()
""")


@pytest.mark.integration
def test_global_batchnorm_on_two_ranks_equals_batchnorm_on_the_whole_batch(tmp_path):
    program = tmp_path / "global_bn.py"
    program.write_text(PROGRAM)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", str(program)], capture_output=True,
                          text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    worst = json.loads(done.stdout.strip().splitlines()[-1])
    assert max(worst.values()) < 1e-5, worst  # float32 sums in another order, nothing more


def test_average_buffers_makes_the_running_statistics_their_mean_over_ranks_in_one_all_reduce():
    import torch
    from torch import nn

    from labs.common.replicas import average_buffers, buffers_digest

    def trained(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.BatchNorm1d(4))
        model(torch.randn(8, 3) * (seed + 1))  # a training forward moves each rank's statistics its own way
        return model

    mine, theirs = trained(0), trained(1)
    assert buffers_digest(mine) != buffers_digest(theirs)
    expected = {name: (a + b) / 2 for (name, a), (_, b) in zip(mine.named_buffers(), theirs.named_buffers(),
                                                               strict=True) if a.is_floating_point()}
    calls = []

    def sum_with_the_other_rank(flat: torch.Tensor) -> None:  # what all_reduce(SUM) does at world size 2
        calls.append(flat.numel())
        flat += torch.cat([b.reshape(-1) for b in theirs.buffers() if b.is_floating_point()])

    average_buffers(mine, sum_with_the_other_rank, world_size=2)
    assert calls == [4 * 4]  # one all-reduce: two layers' mean and variance, 4 channels each
    for name, buffer in mine.named_buffers():
        if name in expected:
            assert torch.equal(buffer, expected[name]), name
    assert mine[1].num_batches_tracked.item() == 1  # a step count, equal on every rank: untouched
