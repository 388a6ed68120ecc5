"""Try every documented bad input and write docs/bad-inputs.md with the messages they get.

    .nox/env/bin/python docs/bad_inputs.py        # rewrites docs/bad-inputs.md

Each row is also covered by a test (named in the table); this script only shows people the
real messages. Runs in a temporary directory, so no result of yours is touched.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DISTLAB = str(Path(sys.executable).parent / "distlab")

# (what, command, the test that covers it)
CASES = [
    ("unknown lab", "distlab run nosuchlab -n 2", "tests/test_cli.py"),
    ("world size below 1", "distlab run check -n 0", "tests/test_cli.py"),
    ("unknown option", "distlab run check -n 2 --frobnicate", "tests/test_cli.py"),
    ("nccl without GPUs", "distlab run check -n 2 --backend nccl", "tests/test_cli.py"),
    ("plain python for several ranks", "distlab run check -n 2 --launcher python", "tests/test_cli.py"),
    ("baseline on two ranks", "distlab run baseline -n 2", "tests/test_cli.py"),
    ("program that does not exist", "distlab run ddp -n 2 --program no_such.py", "tests/test_cli.py"),
    ("elastic restarts without torchrun", "distlab run ddp -n 2 --launcher mpirun --max-restarts 1",
     "tests/test_cli.py"),
    ("unknown fault", "python labs/ddp/train.py --smoke --fault explode:rank=1:step=2", "tests/test_data.py"),
    ("node rank outside the node count",
     "distlab run check -n 2 --nnodes 2 --node-rank 2 --rdzv-endpoint 127.0.0.1:29400", "tests/test_multinode.py"),
    ("rendezvous endpoint that does not resolve",
     "distlab run check -n 2 --nnodes 2 --node-rank 1 --rdzv-endpoint no-such-host.invalid:29400",
     "tests/test_multinode.py"),
    ("rendezvous endpoint nobody serves",
     "distlab run check -n 2 --nnodes 2 --node-rank 1 --rdzv-endpoint 127.0.0.1:9 --rdzv-timeout 2",
     "tests/test_multinode.py"),
    ("host listed twice", "distlab run check -n 2 --backend mpi --hosts localhost:1,localhost:1",
     "tests/test_multinode.py"),
    ("unknown profile", "distlab grade --profile nosuch", "tests/test_grade.py"),
    ("invalid profile file", "distlab grade --profile {bad_profile}", "tests/test_grade.py"),
    ("world sizes out of order", "distlab grade --world-sizes 2,1", "tests/test_grade_e2e.py"),
    ("calibrating over an existing profile", "distlab calibrate --profile cpu-smoke", "tests/test_grade_e2e.py"),
    ("scaling with repeated world sizes", "distlab scale --lab ddp --world-sizes 1,1", "tests/test_scaling.py"),
    ("strong scaling, indivisible batch", "distlab scale --lab ddp --world-sizes 1,2,3 --mode strong --global-batch 64",
     "tests/test_scaling.py"),
    ("unknown collective", "python labs/collectives/collectives.py --primitives allgatherv",
     "tests/test_collectives.py"),
    ("empty size range", "python labs/allreduce_bench/allreduce_bench.py -b 1M -e 1K", "tests/test_allreduce_bench.py"),
    ("zero iterations", "python labs/allreduce_bench/allreduce_bench.py -n 0", "tests/test_allreduce_bench.py"),
    ("SyncBatchNorm on CPU", "python labs/ddp/train.py --smoke --sync-bn", "tests/test_training_labs.py"),
    ("CIFAR-10 missing offline", "python labs/baseline/train.py --dataset cifar10 --data-dir {empty_dir}",
     "tests/test_training_labs.py"),
    ("batch not divisible by accumulation", "python labs/baseline/train.py --smoke --batch-size 30 --accumulate 4",
     "tests/test_training_labs.py"),
    ("corrupt checkpoint", "python labs/baseline/train.py --smoke --resume --checkpoint {corrupt_ckpt}",
     "tests/test_training_labs.py"),
    ("GPUS larger than the GPUs visible", "make -s lab-ddp GPUS=4", "tests/test_containers.py"),
]


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "bad.toml").write_text('name = "bad"\n[measured]\nwhere = "x"\nhow = "x"\ndate = "x"\n'
                                           '[match]\ngpus = 0\n[labs.ddp]\nworld_sizes = []\n')
        (tmp_path / "empty").mkdir()
        (tmp_path / "corrupt.pt").write_bytes(b"not a checkpoint")
        values = {"bad_profile": tmp_path / "bad.toml", "empty_dir": tmp_path / "empty",
                  "corrupt_ckpt": tmp_path / "corrupt.pt"}
        for what, command, test in CASES:
            argv = shlex.split(command.format(**values))
            if argv[0] == "distlab":
                argv[0] = DISTLAB
            elif argv[0] == "python":
                argv[0] = sys.executable
                argv[1] = str(REPO / argv[1])
            elif argv[0] == "make":
                argv[1:1] = ["-C", str(REPO)]
            done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                                  env=dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}"))
            message = (done.stderr.strip() or done.stdout.strip()).splitlines()
            # make adds its own "*** Error" line after the script's message: show the message.
            shown = next((line for line in message if "error" in line.lower() and "***" not in line),
                         message[-1] if message else "")
            rows.append(f"| {what} | `{command.format(**{k: Path(v).name for k, v in values.items()})}` | "
                        f"{done.returncode} | {shown.replace('|', '/')} | {test} |")
    text = ["# Bad input, tried", "",
            "Every row was run by `docs/bad_inputs.py` (which wrote this page) and is covered by the test named.",
            "Nothing is started and no earlier result is touched by any of them.", "",
            "| input | command | exit | message | test |", "|---|---|---|---|---|", *rows, ""]
    (REPO / "docs" / "bad-inputs.md").write_text("\n".join(text))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
