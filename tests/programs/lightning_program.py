"""A Lightning Trainer with strategy="ddp", on the lab's model and data, as a student writes it.

Its shape: a LightningModule around the lab's model, `Trainer(accelerator="cpu", strategy="ddp")`
started by torchrun (Lightning reads the launcher's environment and makes the process group
itself), Lightning's own DistributedSampler (set_epoch included) and ModelCheckpoint, which writes
`<dir>/*.ckpt` on global rank 0 through fabric's _atomic_save (torch.save into memory, then the
file). What the student added for the contract: the lab's model and data, the contract's flags and
record, and rank 0's evaluation of the test set for the record.

    torchrun --standalone --nproc-per-node 2 tests/programs/lightning_program.py --smoke --checkpoint DIR/ck.pt
"""

import argparse
import os

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from labs.common import data, flags, models
from labs.common.contract import add_contract_args, lab_run
from labs.common.topology import detect_topology


class Classifier(L.LightningModule):
    def __init__(self, stem: str, lr: float) -> None:
        super().__init__()
        self.model = models.build_model(stem)
        self.lr = lr

    def training_step(self, batch, batch_idx):
        images, labels, _ = batch
        images, labels = models.to_device(images, labels, self.device, channels_last=False)
        return F.cross_entropy(self.model(images), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def main() -> None:
    parser = argparse.ArgumentParser(description="a Lightning Trainer (strategy ddp) on the lab's model and data")
    add_contract_args(parser, ["gloo"], default_backend="gloo")
    flags.add_training_args(parser)
    args = parser.parse_args()
    flags.resolve_training_args(parser, args)

    topology = detect_topology()
    with lab_run("ddp", args, topology) as record:
        torch.manual_seed(args.seed)
        train_set, test_set = data.load_datasets(args)
        module = Classifier(args.stem, args.lr * topology.world_size)
        train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, collate_fn=data.keep_batch,
                                  drop_last=True)
        folder = os.path.dirname(args.checkpoint) if args.checkpoint else None
        trainer = L.Trainer(accelerator="cpu", devices=topology.local_world_size, strategy="ddp",
                            max_epochs=args.epochs, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=bool(folder),
                            callbacks=[ModelCheckpoint(dirpath=folder)] if folder else None,
                            default_root_dir=folder or ".")
        trainer.fit(module, train_loader)
        if trainer.global_rank == 0:  # the record's accuracy: rank 0's model on the whole test set
            precision = models.make_precision(args, torch.device("cpu"))
            loader = data.test_loader(test_set, 4 * args.batch_size, args)
            correct, total = models.count_correct(module.model, loader, precision, args,
                                                  torch.device("cpu")).tolist()
            record.metrics["final_accuracy"] = correct / total


if __name__ == "__main__":
    main()
