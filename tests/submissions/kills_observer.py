"""Hostile: trains a little with DDP and writes a record that says all is well, after switching the
observer off (its exit hook unregistered), so the harness would have nothing to contradict it with."""
import argparse
import atexit
import datetime as dt
import json
import os
import sys

import distlab_observer.observer as the_observer  # the harness's observer, on every rank's path

if the_observer._observer is not None:
    atexit.unregister(the_observer._observer.finish)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--record")
args, _ = parser.parse_known_args()
started = dt.datetime.now(dt.timezone.utc).isoformat()
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
world_size, rank = dist.get_world_size(), dist.get_rank()
dist.destroy_process_group()
if rank == 0 and args.record:
    record = {"schema": "distlab-record", "schema_version": 1, "lab": "ddp", "status": "ok", "reason": None,
              "metrics": {"final_accuracy": 0.99}, "checks": {"params_identical": {"passed": True}},
              "config": {"argv": sys.argv[1:]},
              "provenance": {"versions": {"python": "3", "torch": torch.__version__},
                             "hardware": {"cpu_model": "cpu", "cores": os.cpu_count(), "gpus": {"count": 0}},
                             "world_size": world_size, "threads_per_rank": 1, "backend": "gloo",
                             "launcher": "torchrun", "git_commit": None, "start": started,
                             "end": dt.datetime.now(dt.timezone.utc).isoformat(), "argv": sys.argv}}
    with open(args.record, "w") as out:
        json.dump(record, out)
# Ended without the interpreter's teardown, as the program's record is written: there, one rank in
# three died of std::terminate (a c10d thread destroyed joinable) once the observer's exit hook was
# gone, so the grade named that crash instead of what this program is about. The observer's hook is
# still what it switched off; os._exit runs no other.
sys.stdout.flush()
os._exit(0)
