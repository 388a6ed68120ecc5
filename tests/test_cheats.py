"""Programs that cheat, through the real runner (torchrun, the observer on every rank, the launcher's
output drained by the harness), each against the check that catches it (issue 44): what the harness
takes from the process, not the program's word.

Each cheat is tests/programs/ddp_program.py (the correct one, written from scratch) with one change,
made here the way tests/test_grade_mutations.py makes the course lab's mistakes, so that a cheat
stays the correct program but for its cheat. The correct program passes every one of these checks;
each cheat fails its own. The rubric pays nothing for what they fail (tests/test_grader_holds.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.observe import data_parallel, observations
from harness.observe.check import NOT_VERIFIED, Check
from harness.run import runner
from harness.run.request import RunRequest
from harness.run.run_dir import OBSERVE_DIR

REPO = Path(__file__).resolve().parents[1]
PROGRAM = (REPO / "tests/programs/ddp_program.py").read_text()
BIN = Path(sys.executable).parent
OBSERVER = REPO / "harness" / "on_ranks" / "observer"
TIMEOUT_S = 300

STEP = """            loss = F.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""
WRAP = "    model = DDP(model)  # averages the gradients during backward\n"
BUFFERS = "        for buffer in model.module.buffers():\n"
IMPORTS = "import torch\n"
# A wrapper with DDP's face (.module, .no_sync) that averages nothing: each rank trains alone on its
# shard, and rank 0's parameters are broadcast after each epoch, so the replicas end equal.
ALONE = """    class Alone(nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, x):
            return self.module(x)

        def no_sync(self):
            import contextlib
            return contextlib.nullcontext()

    model = Alone(model)
"""
BROADCAST = """        for parameter in model.module.parameters():
            dist.broadcast(parameter.data, 0)
"""
# Its own clock slowed 20 times, then the observer's too, where a program finds it.
SLOW = """import time
_real = time.perf_counter
time.perf_counter = lambda: _real() / 20
"""
SLOW_OBSERVER = SLOW + """import distlab_observer.originals
distlab_observer.originals._clock = time.perf_counter
"""
# The observer's data hook taken off the loader (functools.wraps left the original at __wrapped__):
# the passes go unseen from then on.
UNHOOK = """from torch.utils.data.dataloader import _BaseDataLoaderIter
_BaseDataLoaderIter._next_index = getattr(_BaseDataLoaderIter._next_index, "__wrapped__",
                                          _BaseDataLoaderIter._next_index)
"""
# Every rank trains on the whole set, in batches of world_size x BATCH taken from the tensors, while
# the sharded loader is iterated beside it step for step, so its indices are what the observer draws.
LOOP = "        for inputs, labels in train_loader:\n"
DECOY = """        everything = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(epoch))
        whole = [(train_set.tensors[0][everything[i:i + BATCH * world_size]],
                  train_set.tensors[1][everything[i:i + BATCH * world_size]])
                 for i in range(0, SAMPLES, BATCH * world_size)]
        for (inputs, labels), _decoy in zip(whole, train_loader):
"""
# Trains in one order every epoch (no set_epoch), and at exit, before the observer's own handler
# (atexit runs the last registered first), finds the observer and reverses every other training pass
# of its record: consecutive epochs then differ in the rank file.
SET_EPOCH = "        sampler.set_epoch(epoch)  # a new permutation every epoch\n"
REWRITE = """import atexit
import gc


def _rewrite_the_observer():
    from distlab_observer.observer import Observer

    observer = next(o for o in gc.get_objects() if type(o) is Observer)
    for recorded in [p for p in observer.passes if p.steps_end > p.steps_start][1::2]:
        kept = sum(recorded.batch_lengths[:recorded.yielded])
        recorded.indices[:kept] = recorded.indices[:kept][::-1]


atexit.register(_rewrite_the_observer)
"""

# name -> (the changes, as (old, new) pairs; the checks that must fail, each with words of its detail)
CHEATS = {
    "trains-nothing": ([(STEP, "            with torch.no_grad():\n"
                               "                loss = F.cross_entropy(model(inputs), labels)\n"
                               "            optimizer.zero_grad()\n            optimizer.step()\n")],
                       {"parameters_trained": "bitwise equal to what they were before the first optimizer step"}),
    "never-all-reduces": ([(WRAP, ALONE), (BUFFERS, BROADCAST + BUFFERS)],
                          {"replicas_in_step": "after optimizer step 1 differ between rank 0 and rank 1"}),
    "slows-the-observer-s-clock": ([(IMPORTS, IMPORTS + SLOW_OBSERVER)],
                                   {"clock": "by the observer's clock: the clock the harness times training with "
                                             "was slowed"}),
    "decoy-loader": ([(LOOP, DECOY)],
                     {"inputs_from_loader": "the model trained on data the loader did not hand out"}),
    "unhooks-the-observer": ([(IMPORTS, IMPORTS + UNHOOK)],
                             {"observer": "the DataLoader iterator's _next_index was replaced during the run"}),
    "rewrites-the-observer": ([(SET_EPOCH, ""), (IMPORTS, IMPORTS + REWRITE)],
                              {"observer": "differs from what the observer streamed when the pass ended: "
                                           "changed in the process"}),
}
# The checks a cheat leaves without evidence: not verified (not applicable), never passed. The decoy's
# indices are disjoint and cover the set, and prove nothing of what the model trained on.
DRAWN = ("shards_disjoint", "shards_cover", "order_changes_per_epoch")
UNVERIFIED = {"rewrites-the-observer": DRAWN, "decoy-loader": DRAWN}
NEW_CHECKS = ("parameters_trained", "replicas_in_step", "clock", "observer", "inputs_from_loader")


def cheat(tmp_path: Path, changes: list[tuple[str, str]]) -> Path:
    source = PROGRAM
    for old, new in changes:
        assert source.count(old) == 1, f"tests/programs/ddp_program.py changed: {old!r} is not found once"
        source = source.replace(old, new, 1)
    path = tmp_path / "program.py"
    path.write_text(source)
    return path


def observed(tmp_path: Path, program: Path) -> dict[str, Check]:
    request = RunRequest(lab="ddp", program=program, world_size=2, launcher="torchrun", backend="gloo",
                         results_root=tmp_path / "results", timeout_s=TIMEOUT_S)
    result = runner.run_lab(request, echo=False)
    assert result.returncode == 0, result.reason
    seen = observations.load(result.run_dir / OBSERVE_DIR)
    return {check.name: check for check in data_parallel.checks(seen, "gloo", 2, train_set_size=512)}


@pytest.mark.integration
def test_the_correct_program_passes_the_checks_the_cheats_fail(tmp_path):
    seen = observed(tmp_path, REPO / "tests/programs/ddp_program.py")
    assert all(check.passed for check in seen.values()), {c.name: c.detail for c in seen.values() if not c.passed}
    for name in (*NEW_CHECKS, *UNVERIFIED["rewrites-the-observer"]):
        assert seen[name].passed and seen[name].applicable, seen[name]
    slowed = observed(tmp_path / "own-clock", cheat(tmp_path, [(IMPORTS, IMPORTS + SLOW)]))
    # A program slowing time.perf_counter slows its own timing only: the observer's clock was taken first.
    assert slowed["clock"].passed and slowed["clock"].applicable


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(CHEATS))
def test_each_cheat_fails_its_own_check(tmp_path, name):
    changes, failing = CHEATS[name]
    seen = observed(tmp_path, cheat(tmp_path, changes))
    for check, words in failing.items():
        assert not seen[check].passed and words in seen[check].detail, seen[check]
    for check in UNVERIFIED.get(name, ()):
        assert not seen[check].applicable and seen[check].detail.startswith(NOT_VERIFIED), seen[check]
    others = [c for c in NEW_CHECKS if c not in failing and not seen[c].passed]
    assert not others, {c: seen[c].detail for c in others}
