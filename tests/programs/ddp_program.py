"""A small, correct DDP training program.

Written from scratch, on purpose sharing nothing with labs/: the harness's observer must judge any
program by what torch did, not by cooperation. It keeps only the documented lab contract
(labs/README.md): the flags --backend, --record, --timeout (and --smoke, --seed, ignored), and
one JSON record written by rank 0, so `distlab grade --program ddp=...` grades it. Run under
torchrun with the gloo backend:

    torchrun --standalone --nproc-per-node 2 tests/programs/ddp_program.py --checkpoint DIR/ck.pt

The classic mistakes are made in the course's lab instead (tests/test_grade_mutations.py), and
graded beside this program.
"""

import argparse
import datetime
import json
import os
import platform
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

SAMPLES, FEATURES, CLASSES = 512, 16, 4  # 512 divides by every world size the tests use: no padding
BATCH = 32  # per rank
EPOCHS = 3
SEED = 0


def teacher_data() -> tuple[TensorDataset, TensorDataset]:
    """Inputs with labels from a fixed random linear teacher: learnable, and the same on every rank."""
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(SAMPLES + 128, FEATURES, generator=generator)
    labels = (inputs @ torch.randn(FEATURES, CLASSES, generator=generator)).argmax(dim=1)
    return (TensorDataset(inputs[:SAMPLES], labels[:SAMPLES]),
            TensorDataset(inputs[SAMPLES:], labels[SAMPLES:]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", help="save model and optimizer here after every epoch")
    # The lab contract's flags.
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--record", help="rank 0 writes the result record here")
    parser.add_argument("--timeout", type=float, default=120.0, help="collective timeout, seconds")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat()

    # rank, world size and rendezvous from torchrun's environment
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)  # every rank builds the same initial model
    train_set, test_set = teacher_data()
    # BatchNorm: a buffer that each rank updates from its own batches, as in real models.
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, CLASSES))
    model = DDP(model)  # averages the gradients during backward
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * world_size, momentum=0.9)

    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=SEED,
                                 drop_last=True)
    train_loader = DataLoader(train_set, batch_size=BATCH, sampler=sampler, drop_last=True)
    test_loader = DataLoader(test_set, batch_size=64)  # every rank evaluates the whole (small) test set

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)  # a new permutation every epoch
        model.train()
        for inputs, labels in train_loader:
            loss = F.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        # BatchNorm's running statistics moved each rank's own way: average them, so every rank
        # evaluates and saves one model.
        for buffer in model.module.buffers():
            if buffer.is_floating_point():
                dist.all_reduce(buffer)
                buffer /= world_size
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in test_loader)
        if args.checkpoint:
            if rank == 0:  # the replicas are identical: one writer
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch + 1}, args.checkpoint)
            dist.barrier()  # nobody goes on before the checkpoint is complete
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f} test accuracy {correct / len(test_set):.3f}", flush=True)
    if rank == 0 and args.record:
        write_record(args, world_size, started, {"final_accuracy": correct / len(test_set)})
    dist.destroy_process_group()


def write_record(args: argparse.Namespace, world_size: int, started: str, metrics: dict) -> None:
    """The contract's one JSON record, by hand: no claims of checks, only what it measured."""
    record = {
        "schema": "distlab-record", "schema_version": 1, "lab": "ddp", "status": "ok", "reason": None,
        "metrics": metrics, "checks": {}, "config": {k: v for k, v in vars(args).items() if v is not None},
        "provenance": {
            "versions": {"python": platform.python_version(), "torch": torch.__version__},
            "hardware": {"cpu_model": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                         "gpus": {"count": 0}},
            "world_size": world_size, "threads_per_rank": torch.get_num_threads(), "backend": args.backend,
            "launcher": "torchrun", "git_commit": None, "start": started,
            "end": datetime.datetime.now(datetime.timezone.utc).isoformat(), "argv": sys.argv,
        },
    }
    with open(args.record, "w") as handle:
        json.dump(record, handle)


if __name__ == "__main__":
    main()
