"""How far two honest evaluations of the same weights differ: what the accuracy-claim tolerance must allow.

    python docker/gpu-claim-spread.py RUN/observe --config bf16:512 --config bf16:100 --config fp32:512 \\
        [--save this.json] [--against other.json] -- LAB_ARGS

A training lab claims its own count of correct test images; the harness counts again from rank 0's
final weights (harness/observe/accuracy.py). Both apply one model to the same images, but in other
batches and other processes: cuDNN picks its convolution algorithms per process and per shape
(benchmark mode), the CPU's kernels differ by ATEN_CPU_CAPABILITY, and a different order of
accumulation, rounded to bf16's 8 bits at every layer, flips an argmax where two logits nearly tie.
This evaluates the observed weights in each configuration (precision:batch) and prints, for each pair,
how many predictions changed and how far the counts of correct images are apart; with --against, also
against the configurations another process saved (--save), say under another ATEN_CPU_CAPABILITY or,
on a GPU, with its own autotuning. And the top-2 margins of the fp32 logits, relative to their scale:
the images a perturbation of that size can flip.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout: harness and labs beside

import torch  # noqa: E402

from harness.observe.accuracy import BACKENDS, WEIGHTS_FILE  # noqa: E402
from labs.common import data, flags, models  # noqa: E402
from labs.common.contract import add_contract_args  # noqa: E402


def logits(model: torch.nn.Module, test_set, args: argparse.Namespace, precision: str, batch: int,
           device: torch.device) -> torch.Tensor:
    args.precision = precision
    loader = data.test_loader(test_set, batch, args)
    out = []
    with torch.no_grad():
        for images, labels, _ in loader:
            x, _ = models.to_device(images, labels, device, args.channels_last)
            with models.make_precision(args, device).autocast():
                out.append(model(x).float().cpu())
    return torch.cat(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("observe_dir", type=Path)
    parser.add_argument("--config", action="append", required=True, help="precision:batch, e.g. bf16:512")
    parser.add_argument("--save", type=Path, help="write this process's predictions here")
    parser.add_argument("--against", type=Path, help="compare with another process's --save")
    parser.add_argument("--processes", type=int, default=1,
                        help="2: the same configurations first in a process of their own, compared (--against)")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    options, lab_args = parser.parse_args(argv[:split]), argv[split + 1:]  # the lab's arguments after --
    if options.processes > 1 and not options.against:  # another process: its own cuDNN autotuning, its own choices
        first = Path(tempfile.mkdtemp(prefix="claim-spread-")) / "first.json"
        own = [a for a in argv[:split] if a != "--processes" and a != str(options.processes)]
        subprocess.run([sys.executable, __file__, *own, "--save", str(first), "--", *lab_args], check=True)
        options.against = first
    lab = argparse.ArgumentParser(add_help=False)
    add_contract_args(lab, BACKENDS, default_backend="none")
    flags.add_training_args(lab)
    args, _ = lab.parse_known_args(lab_args)
    flags.resolve_training_args(lab, args)
    device = models.pick_device(args)
    model = models.build_model(args.stem)
    model.load_state_dict(torch.load(options.observe_dir / WEIGHTS_FILE, map_location="cpu", weights_only=True))
    model = model.to(device).eval()
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    _, test_set = data.load_datasets(args)
    labels = test_set.labels.long()
    where = f"{device}, torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()} " \
            f"(ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', '-')})"
    print(f"{len(labels)} test images, {where}")
    predictions, scores = {}, {}
    for config in options.config:
        precision, batch = config.split(":")
        started = time.monotonic()
        scores[config] = logits(model, test_set, args, precision, int(batch), device)
        predictions[config] = scores[config].argmax(1)
        correct = int((predictions[config] == labels).sum())
        print(f"{config}: {correct} correct ({correct / len(labels):.4f}) in {time.monotonic() - started:.1f} s")
    reference = scores.get(next((c for c in options.config if c.startswith("fp32")), options.config[0]))
    top2 = reference.topk(2, dim=1).values
    relative = (top2[:, 0] - top2[:, 1]) / reference.abs().amax(1).clamp_min(1e-12)
    for share in (0.001, 0.003, 0.01, 0.03):
        print(f"top-2 margin below {share:.1%} of the largest logit: {int((relative < share).sum())} images")
    others = {}
    if options.against:
        saved = json.loads(options.against.read_text())
        others = {f"{saved['where']} {c}": torch.tensor(p) for c, p in saved["predictions"].items()}
    pairs = list(itertools.combinations(predictions.items(), 2)) + [
        (mine, theirs) for mine in predictions.items() for theirs in others.items()]
    for (a, pa), (b, pb) in pairs:
        changed = int((pa != pb).sum())
        apart = abs(int((pa == labels).sum()) - int((pb == labels).sum()))
        print(f"{a} vs {b}: {changed} predictions changed, correct counts {apart} apart")
    if options.save:
        options.save.write_text(json.dumps({"where": where, "predictions": {c: p.tolist()
                                                                             for c, p in predictions.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
