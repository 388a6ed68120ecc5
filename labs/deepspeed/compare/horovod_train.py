"""The comparison's baseline with Horovod: gradients all-reduced by its DistributedOptimizer.

    horovodrun --gloo -np 2 -H localhost:2 python labs/deepspeed/compare/horovod_train.py --smoke
"""

import horovod.torch as hvd
import torch
import torch.nn.functional as F

from labs.common.contract import lab_run
from labs.common.process_group import horovod_stall_timeouts
from labs.common.topology import detect_topology
from labs.deepspeed.compare.common import LR, Meter, batch, build_model, device_for, parse_args


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], ["horovod"], "horovod", argv)
    topology = detect_topology()
    rank, world_size = topology.rank, topology.world_size
    with lab_run("compare", args, topology) as record:
        horovod_stall_timeouts(args.timeout)
        hvd.init()
        device = device_for(args, hvd.local_rank())
        meter = Meter(args.steps, device)
        model = build_model(args).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
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
        peaks = hvd.allgather_object(meter.peak)
        record.metrics.update(tool="horovod", world_size=world_size, **meter.metrics(args, peaks, losses))
        hvd.shutdown()


if __name__ == "__main__":
    main()
