"""The PyTorch DDP tutorial's torchrun program, adapted to the lab contract as a student adapts it.

pytorch/examples, distributed/ddp-tutorial-series (its torchrun version), rewritten here from
scratch with its shape and its behaviour: a Trainer that takes its device rank from LOCAL_RANK, a
snapshot loaded when its file exists, one epoch at a time with DistributedSampler (and set_epoch),
DDP with its defaults (broadcast_buffers: rank 0's BatchNorm statistics are sent at each forward,
so after the last step every rank's differ), and nothing evaluated or saved off rank 0; at the top of
each epoch it takes one batch from the training loader to print its size (`b_sz`), a loader pass with
no step that evaluates nothing. What the
student added for the contract: the lab's model and data (labs/common), the contract's flags and
record (`add_contract_args`, `lab_run`), and rank 0's evaluation of the test set for the record.

Two things the tutorial does are fixed here, since a cell of cpu-class catches each; the tests make
them back by mutation (tests/test_tutorial_programs.py): it saves where LOCAL_RANK == 0 (one writer
per node: `self.local_rank == 0`), and its snapshot records the epoch it finished as the one to
resume at (`"EPOCHS_RUN": epoch`), so a restart trains that epoch again.

    torchrun --standalone --nproc-per-node 2 tests/programs/ddp_tutorial.py --smoke --checkpoint DIR/snap.pt
"""

import argparse
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from labs.common import data, flags, models
from labs.common.contract import add_contract_args, lab_run
from labs.common.topology import detect_topology

SAVE_EVERY = 1  # epochs between snapshots


def ddp_setup(backend: str, timeout_s: float) -> None:
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.local_rank = int(os.environ["LOCAL_RANK"])  # torchrun's: the device of this process on its node
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.epochs_run = 0
        if snapshot_path and os.path.exists(snapshot_path):
            print(f"[rank {self.global_rank}] loading snapshot {snapshot_path}", flush=True)
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]

    def _run_batch(self, images, labels):
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(images), labels)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])  # the tutorial's peek: one batch drawn, to print its size
        if self.global_rank == 0:
            print(f"[rank {self.global_rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}",
                  flush=True)
        self.train_data.sampler.set_epoch(epoch)
        for images, labels, _ in self.train_data:
            images, labels = models.to_device(images, labels, torch.device("cpu"), channels_last=False)
            self._run_batch(images, labels)

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch + 1}
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.snapshot_path and self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def main() -> None:
    parser = argparse.ArgumentParser(description="the DDP tutorial on the lab's model and data")
    add_contract_args(parser, ["gloo"], default_backend="gloo")
    flags.add_training_args(parser)
    args = parser.parse_args()
    flags.resolve_training_args(parser, args)

    with lab_run("ddp", args, detect_topology()) as record:
        ddp_setup(args.backend, args.timeout)
        torch.manual_seed(args.seed)
        train_set, test_set = data.load_datasets(args)
        model = models.build_model(args.stem)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * dist.get_world_size(), momentum=0.9)
        train_data = DataLoader(train_set, batch_size=args.batch_size, shuffle=False, collate_fn=data.keep_batch,
                                sampler=DistributedSampler(train_set, drop_last=True), drop_last=True)
        trainer = Trainer(model, train_data, optimizer, SAVE_EVERY, args.checkpoint)
        trainer.train(args.epochs)
        if dist.get_rank() == 0:  # the record's accuracy: rank 0's model on the whole test set
            precision = models.make_precision(args, torch.device("cpu"))
            loader = data.test_loader(test_set, 4 * args.batch_size, args)
            correct, total = models.count_correct(trainer.model.module, loader, precision, args,
                                                  torch.device("cpu")).tolist()
            record.metrics["final_accuracy"] = correct / total
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
