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
