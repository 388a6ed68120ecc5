"""Horovod's PyTorch MNIST example, adapted to the lab contract as a student adapts it, with two mistakes.

horovod/horovod, examples/pytorch/pytorch_mnist.py, rewritten here from scratch with its shape: a
train_epoch with set_epoch, a test() over a DistributedSampler's shard of the test set whose
accuracy is each rank's correct / len(test_sampler), averaged over the ranks (metric_average), the
optimizer state broadcast before the DistributedOptimizer wraps it. On the lab's model and data,
with the contract's flags and record. The mistakes: no hvd.broadcast_parameters, and a seed per rank
(torch.manual_seed(seed + rank)), so every rank starts from, and keeps, a model of its own; the
gradients are averaged, the parameters never become equal. Its record's final_accuracy is honest
all the same: the mean of what each rank's own model scored on its own shard.

broadcast_optimizer_state on a fresh optimizer first takes one step with zero gradients to create
the optimizer's state (before any batch): the observer counts it, and the grader says where it
came from.

    horovodrun --gloo -np 2 -H localhost:2 python tests/programs/horovod_mnist.py --smoke
"""

import argparse

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from labs.common import data, flags, models
from labs.common.contract import add_contract_args, lab_run
from labs.common.topology import detect_topology

CPU = torch.device("cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description="Horovod's MNIST example on the lab's model and data")
    add_contract_args(parser, ["horovod"], default_backend="horovod")
    flags.add_training_args(parser)
    args = parser.parse_args()
    flags.resolve_training_args(parser, args)

    with lab_run("horovod", args, detect_topology()) as record:
        hvd.init()
        torch.manual_seed(args.seed + hvd.rank())  # the mistake: each rank draws its own initial model
        train_dataset, test_dataset = data.load_datasets(args)
        train_sampler = DistributedSampler(train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
        train_loader = DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler,
                                  collate_fn=data.keep_batch)
        test_sampler = DistributedSampler(test_dataset, num_replicas=hvd.size(), rank=hvd.rank())
        test_loader = DataLoader(test_dataset, batch_size=4 * args.batch_size, sampler=test_sampler,
                                 collate_fn=data.keep_batch)

        model = models.build_model(args.stem)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
        # The example broadcasts the parameters here too; this program forgot to.
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

        def train_epoch(epoch):
            model.train()
            train_sampler.set_epoch(epoch)
            for images, labels, _ in train_loader:
                images, labels = models.to_device(images, labels, CPU, channels_last=False)
                optimizer.zero_grad()
                F.cross_entropy(model(images), labels).backward()
                optimizer.step()

        def metric_average(value, name):
            return hvd.allreduce(torch.tensor(value), name=name).item()

        def test():
            model.eval()
            correct = 0.0
            with torch.no_grad():
                for images, labels, _ in test_loader:
                    images, labels = models.to_device(images, labels, CPU, channels_last=False)
                    correct += float((model(images).argmax(dim=1) == labels).sum())
            return metric_average(correct / len(test_sampler), "avg_accuracy")

        for epoch in range(args.epochs):
            train_epoch(epoch)
            accuracy = test()
        record.metrics["final_accuracy"] = accuracy
        hvd.shutdown()


if __name__ == "__main__":
    main()
