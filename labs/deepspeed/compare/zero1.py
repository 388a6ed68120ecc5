"""The comparison's baseline with torch's ZeRO-1: DDP, and Adam's state sharded (ZeroRedundancyOptimizer).

    torchrun --standalone --nproc-per-node 2 labs/deepspeed/compare/zero1.py --smoke
"""

import datetime as dt

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from labs.common.contract import lab_run
from labs.common.process_group import loopback_store
from labs.common.topology import detect_topology
from labs.deepspeed.compare.common import LR, Meter, batch, build_model, device_for, parse_args


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], ["gloo", "nccl"], "gloo", argv)
    topology = detect_topology()
    rank, world_size = topology.rank, topology.world_size
    with lab_run("compare", args, topology) as record:
        device = device_for(args, topology.local_rank)
        timeout = dt.timedelta(seconds=args.timeout)
        dist.init_process_group(args.backend, store=loopback_store(topology, timeout), rank=rank,
                                world_size=world_size, timeout=timeout)
        meter = Meter(args.steps, device)
        model = DDP(build_model(args).to(device))
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=LR)
        losses = []
        for step in range(args.steps):
            meter.start(step)
            inputs, labels = batch(step, args, device, rank, world_size)
            loss = F.cross_entropy(model(inputs), labels)
            loss.backward()
            meter.sample()
            optimizer.step()
            meter.sample()
            optimizer.zero_grad()
            losses.append(loss.item())
            meter.stop()
        peaks = [None] * world_size
        dist.all_gather_object(peaks, meter.peak)
        record.metrics.update(tool="zero1", world_size=world_size, **meter.metrics(args, peaks, losses))
        del model, optimizer
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
