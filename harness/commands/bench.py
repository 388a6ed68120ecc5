"""`distlab bench NAME`: benchmarks that print ratios measured side by side in one run (harness/benchmarks/)."""

from __future__ import annotations

import argparse
import importlib

from harness.usage import UsageError

DESCRIPTION = "Each benchmark measures against a reference in the same run; figures are ratios, never absolute speed."
EXAMPLES = """examples:
  distlab bench train --repeats 3
  distlab bench allreduce --world-size 2
  distlab bench verdict --grades 5 --loads 0,2,4,8,16
  distlab bench robustness --profile cpu-smoke --conditions 1,5,9
  distlab bench class --keep /tmp/class
  distlab bench submission --against v0.1.0 --repeats 3
  distlab bench submission --profile cpu-smoke --world-sizes 2 --cpus 0.5 --memory 768M"""

BENCHES = {  # name: (module, what it measures in one line)
    "train": ("harness.benchmarks.train",
              "training-path cost: baseline vs the in-memory loop, DDP/Horovod vs baseline"),
    "allreduce": ("harness.benchmarks.allreduce", "allreduce_bench against the tightest plain loop of each library"),
    "verdict": ("harness.benchmarks.verdict",
                "speed verdicts under load: the DDP lab, a twice-slower one, the all-reduce bench"),
    "robustness": ("harness.benchmarks.robustness", "a profile graded under nine conditions: the smallest margins"),
    "class": ("harness.benchmarks.grade_class", "a class of known submissions graded side by side: time, sandbox cost"),
    "submission": ("harness.benchmarks.submission",
                   "one submission's grade in a box of given CPUs and memory, beside an earlier commit's: "
                   "seconds, peak memory"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    benches = parser.add_subparsers(dest="bench", required=True, parser_class=type(parser))
    for name, (module_name, line) in BENCHES.items():
        module = importlib.import_module(module_name)
        bench = benches.add_parser(name, help=line, description=(module.__doc__ or line).splitlines()[0],
                                   formatter_class=parser.formatter_class)
        module.add_arguments(bench)
        bench.set_defaults(bench_run=module.run)


def run(args: argparse.Namespace, lab_args: list[str]) -> int:
    if lab_args:
        raise UsageError(f"distlab bench {args.bench} takes its options directly, not after -- "
                         f"(distlab bench {args.bench} {' '.join(lab_args)})")
    return args.bench_run(args)
