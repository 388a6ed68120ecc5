"""Hugging Face Accelerate's cv_example, on the lab's model and data, as a student adapts it.

Its shape: one Accelerator (which makes the process group itself, `init_process_group()` without
a backend: torch picks gloo for the CPU), `accelerator.prepare` of the model, optimizer and training
loader (it wraps the model in DDP and shards the loader), `accelerator.backward`, and
`accelerator.save_state` (the model as safetensors, the optimizer with torch.save, on the main
process). What the student added for the contract: the lab's model and data, the contract's flags
and record, and the main process's evaluation of the test set for the record.

    torchrun --standalone --nproc-per-node 2 tests/programs/accelerate_program.py --smoke --checkpoint DIR/ck.pt
"""

import argparse
import os

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader

from labs.common import data, flags, models
from labs.common.contract import add_contract_args, lab_run
from labs.common.topology import detect_topology


def main() -> None:
    parser = argparse.ArgumentParser(description="Accelerate's cv_example on the lab's model and data")
    add_contract_args(parser, ["gloo"], default_backend="gloo")
    flags.add_training_args(parser)
    args = parser.parse_args()
    flags.resolve_training_args(parser, args)

    with lab_run("ddp", args, detect_topology()) as record:
        accelerator = Accelerator(cpu=True)
        torch.manual_seed(args.seed)
        train_set, test_set = data.load_datasets(args)
        model = models.build_model(args.stem)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * accelerator.num_processes, momentum=0.9)
        train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, collate_fn=data.keep_batch,
                                  drop_last=True)
        model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
        for _epoch in range(args.epochs):
            model.train()
            for images, labels, _ in train_loader:
                images, labels = models.to_device(images, labels, accelerator.device, channels_last=False)
                loss = F.cross_entropy(model(images), labels)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        if args.checkpoint:
            accelerator.save_state(os.path.join(os.path.dirname(args.checkpoint) or ".", "accelerate_state"))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:  # the record's accuracy: the main process's model on the whole test set
            precision = models.make_precision(args, torch.device("cpu"))
            loader = data.test_loader(test_set, 4 * args.batch_size, args)
            correct, total = models.count_correct(accelerator.unwrap_model(model), loader, precision, args,
                                                  torch.device("cpu")).tolist()
            record.metrics["final_accuracy"] = correct / total
        accelerator.end_training()


if __name__ == "__main__":
    main()
