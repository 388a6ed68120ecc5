"""The comparison's baseline with DeepSpeed: its engine and a JSON config, ZeRO stage --stage.

    torchrun --standalone --nproc-per-node 2 labs/deepspeed/compare/deepspeed_zero.py --smoke --stage 3
"""

import datetime as dt
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported: it picks its accelerator then

import deepspeed  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from labs.common.contract import lab_run  # noqa: E402
from labs.common.process_group import loopback_store  # noqa: E402
from labs.common.topology import detect_topology  # noqa: E402
from labs.deepspeed.compare.common import LR, Meter, batch, build_model, device_for, parse_args  # noqa: E402


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], ["gloo", "nccl"], "gloo", argv)
    topology = detect_topology()
    rank, world_size = topology.rank, topology.world_size
    with lab_run("compare", args, topology) as record:
        device = device_for(args, topology.local_rank)
        timeout = dt.timedelta(seconds=args.timeout)
        dist.init_process_group(args.backend, store=loopback_store(topology, timeout), rank=rank,
                                world_size=world_size, timeout=timeout)
        deepspeed.init_distributed(dist_backend=args.backend, timeout=timeout)
        meter = Meter(args.steps, device)
        bucket = 2**18  # elements; DeepSpeed's default 5e8 is a 2 GB buffer per rank at stage 3 (labs/deepspeed)
        config = {
            "train_batch_size": args.global_batch, "train_micro_batch_size_per_gpu": args.global_batch // world_size,
            "optimizer": {"type": "Adam", "params": {"lr": LR, "torch_adam": True, "adam_w_mode": False}},
            "zero_optimization": {"stage": args.stage, "reduce_bucket_size": bucket, "allgather_bucket_size": bucket,
                                  "stage3_prefetch_bucket_size": bucket, "stage3_max_live_parameters": bucket,
                                  "stage3_param_persistence_threshold": 0},
            "gradient_clipping": 0.0, "steps_per_print": 2**31 - 1,
        }
        model = build_model(args)
        model, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        losses = []
        for step in range(args.steps):
            meter.start(step)
            inputs, labels = batch(step, args, device, rank, world_size)
            loss = F.cross_entropy(model(inputs), labels)
            model.backward(loss)
            meter.sample()
            model.step()
            meter.sample()
            losses.append(loss.item())
            meter.stop()
        peaks = [None] * world_size
        dist.all_gather_object(peaks, meter.peak)
        record.metrics.update(tool=f"deepspeed-zero{args.stage}", world_size=world_size,
                              **meter.metrics(args, peaks, losses))
        model.destroy()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
