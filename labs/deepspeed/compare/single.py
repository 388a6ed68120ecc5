"""The comparison's baseline: labs/fsdp's model trained in one process, every tool's starting point.

    python labs/deepspeed/compare/single.py --smoke
"""

import torch
import torch.nn.functional as F

from labs.common.contract import lab_run
from labs.common.topology import detect_topology
from labs.deepspeed.compare.common import LR, Meter, batch, build_model, device_for, parse_args


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], ["none"], "none", argv)
    topology = detect_topology()
    with lab_run("compare", args, topology) as record:
        device = device_for(args)
        meter = Meter(args.steps, device)
        model = build_model(args).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        losses = []
        for step in range(args.steps):
            meter.start(step)
            inputs, labels = batch(step, args, device)
            loss = F.cross_entropy(model(inputs), labels)
            loss.backward()
            meter.sample()
            optimizer.step()
            meter.sample()
            optimizer.zero_grad()
            losses.append(loss.item())
            meter.stop()
        peaks = [meter.peak]
        record.metrics.update(tool="single", world_size=1, **meter.metrics(args, peaks, losses))


if __name__ == "__main__":
    main()
