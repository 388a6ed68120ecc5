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
    ("no command at all", "distlab", "tests/test_cli.py"),
    ("unknown lab", "distlab run nosuchlab -n 2", "tests/test_cli.py"),
    ("misspelt lab", "distlab run ddpp -n 2", "tests/test_cli.py"),
    ("misspelt command", "distlab grde", "tests/test_cli.py"),
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
     "distlab run check -n 2 --nnodes 2 --rdzv-endpoint no-such-host.invalid:29400",
     "tests/test_multinode.py"),
    ("rendezvous endpoint nobody serves",
     "distlab run check -n 2 --nnodes 2 --node-rank 1 --rdzv-endpoint 127.0.0.1:9 --rdzv-timeout 2",
     "tests/test_multinode.py"),
    ("host listed twice", "distlab run check -n 2 --backend mpi --hosts localhost:1,localhost:1",
     "tests/test_multinode.py"),
    ("unknown profile", "distlab grade --profile nosuch", "tests/test_grade.py"),
    ("misspelt profile", "distlab grade --profile cpu-smok", "tests/test_grade_e2e.py"),
    ("profile file that does not exist", "distlab grade --profile ./nothere.toml", "tests/test_grade_e2e.py"),
    ("misspelt lab to grade", "distlab grade --labs ddpp", "tests/test_grade_e2e.py"),
    ("misspelt lab for a class", "distlab grade-class {subs} --lab ddpp --no-sandbox", "tests/test_grade_class.py"),
    ("a class's results folder that cannot be made",
     "distlab grade-class {subs} --no-sandbox --lessons local --results {a_file}/results", "tests/test_grade_class.py"),
    ("a class whose feedback would link this machine's files (no --lessons, no https origin)",
     "distlab grade-class {subs} --no-sandbox", "tests/test_grade_class.py"),
    ("a lesson address that is none", "distlab grade-class {subs} --no-sandbox --lessons labs/",
     "tests/test_grade_class.py"),
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
    ("unknown sharding strategy", "python labs/fsdp/train.py --smoke --strategy zero3", "tests/test_parallelism.py"),
    ("tensor parallel: hidden size not divisible by the ranks",
     "distlab run tensor_parallel -n 2 -- --smoke --hidden 255", "tests/test_parallelism.py"),
    ("pipeline: layers not divisible by the stages", "distlab run pipeline -n 2 -- --smoke --layers 3",
     "tests/test_parallelism.py"),
    ("pipeline: fewer micro-batches than stages", "distlab run pipeline -n 2 -- --smoke --micro-batches 1",
     "tests/test_parallelism.py"),
    ("plan with a negative model size", "distlab plan --params=-7e9 --gpus 8 --gpu-memory 80GB", "tests/test_plan.py"),
    ("plan with an unknown optimizer", "distlab plan --params 7e9 --gpus 8 --gpu-memory 80GB --optimizer lion",
     "tests/test_plan.py"),
    ("CIFAR-10 missing offline", "python labs/baseline/train.py --dataset cifar10 --data-dir {empty_dir}",
     "tests/test_training_labs.py"),
    ("batch not divisible by accumulation", "python labs/baseline/train.py --smoke --batch-size 30 --accumulate 4",
     "tests/test_training_labs.py"),
    ("corrupt checkpoint", "python labs/baseline/train.py --smoke --resume --checkpoint {corrupt_ckpt}",
     "tests/test_training_labs.py"),
    ("GPUS larger than the GPUs visible", "make -s lab-ddp GPUS=4", "tests/test_containers.py"),
    ("a lab argument that would move the record", "distlab run check -n 1 -- --record /etc/elsewhere.json",
     "tests/test_adversarial.py"),
    ("the same, abbreviated", "distlab run check -n 1 -- --rec=/etc/elsewhere.json", "tests/test_adversarial.py"),
    ("a lab argument that would change the backend", "distlab run check -n 2 -- --backend nccl",
     "tests/test_adversarial.py"),
    ("a timeout that is not a number", "distlab run check -n 1 --timeout nan", "tests/test_adversarial.py"),
    ("a results folder that cannot be made", "distlab run check -n 1 --results {a_file}/results",
     "tests/test_adversarial.py"),
    ("a profile whose name is a path", "distlab grade --profile {path_profile}", "tests/test_adversarial.py"),
    ("a profile that is not UTF-8", "distlab grade --profile {latin1_profile}", "tests/test_adversarial.py"),
    ("a profile that is a directory", "distlab grade --profile {dir_profile}", "tests/test_adversarial.py"),
    ("a profile that lists a world size twice", "distlab grade --profile {repeat_profile}",
     "tests/test_adversarial.py"),
    ("a profile whose time budget is nan", "distlab grade --profile {nan_profile}", "tests/test_adversarial.py"),
    ("a hostfile that is not UTF-8", "distlab run check -n 2 --backend mpi --hostfile {latin1_hosts}",
     "tests/test_adversarial.py"),
    ("a host that is an option", "distlab run check -n 2 --backend mpi --hosts=-oProxyCommand=x:2",
     "tests/test_adversarial.py"),
    ("a job template option with shell in it", "distlab template slurm-torchrun --ifname eth0;reboot",
     "tests/test_adversarial.py"),
    ("a benchmark box smaller than any grade", "distlab bench submission --memory 12",
     "tests/test_bench_submission.py"),
    ("a benchmark kept where earlier grades are", "distlab bench submission --keep {subs}",
     "tests/test_bench_submission.py"),
]

# Not inputs but things done to a run, or by the program it runs: each is a case of
# tests/test_adversarial.py (this script does not run them). However a run ends, no process of it
# is left, run.json says why, and no earlier run is touched.
RUN_CASES = [
    ("SIGTERM or SIGHUP to `distlab run` (timeout, Slurm, Kubernetes, CI)",
     "passed on to the launcher and its ranks; SIGKILL after 5 s", "128 + signal (143, 129)",
     "stopped by SIGTERM"),
    ("Ctrl-C (SIGINT)", "the same", "130", "interrupted (Ctrl-C)"),
    ("a rank that ignores SIGTERM", "SIGKILL after the grace period", "as its signal", "stopped by SIGTERM"),
    ("a rank that daemonizes a child with an empty environment and a session of its own",
     "the child is found (orphans come back to the harness) and stopped, also after a success", "as the run",
     "as the run"),
    ("output that is not UTF-8, terminal escape sequences, a line without end, a flood",
     "logs keep the bytes as received; the terminal shows them decoded, escapes as text", "as the run", "-"),
    ("record.json that is a FIFO, a directory, a symbolic link, over 8 MiB, not UTF-8",
     "never read (regular files only, opened without blocking); set aside as record.corrupt.json", "1",
     "... is a FIFO, not a regular file"),
    ("record.json nested over 64 levels, with NaN, Infinity or a number beyond 2**63",
     "refused; set aside as record.corrupt.json", "1", "... is out of range"),
    ("a FIFO, link or directory planted as launcher.log, rank.N.log, a rank's log or run.json",
     "not read, not followed (written by rename), a directory set aside as *.corrupt.*", "as the run", "-"),
    ("output that fills the results folder", "the pipe is still drained; space kept at the start takes "
     "record.json and run.json", "1", "the results folder could not keep the run's output: ... No space left"),
    ("a results folder already full", "nothing starts", "2", "results folder ... is full"),
    ("an error of the harness itself", "the run is stopped; the traceback goes to harness-error.txt", "1",
     "harness error: ..."),
    ("two runs at once in one results folder", "each claims its own directory; one's cleanup never touches the "
     "other's processes", "as each run", "-"),
]


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "bad.toml").write_text('name = "bad"\n[measured]\nwhere = "x"\nhow = "x"\ndate = "x"\n'
                                           '[match]\ngpus = 0\n[labs.ddp]\nworld_sizes = []\n')
        (tmp_path / "empty").mkdir()
        (tmp_path / "corrupt.pt").write_bytes(b"not a checkpoint")
        profile = ('name = "{name}"\n[measured]\nwhere = "x"\nhow = "x"\ndate = "x"\n[match]\ngpus = 0\n'
                   '[labs.check]\nworld_sizes = {sizes}\ntime_budget_s = {budget}\n')
        (tmp_path / "path.toml").write_text(profile.format(name="../../../tmp/x", sizes="[1, 2]", budget="60"))
        (tmp_path / "latin1.toml").write_bytes(profile.format(name="m\xfcller", sizes="[1]", budget="60")
                                               .encode("latin-1"))
        (tmp_path / "dir.toml").mkdir()
        (tmp_path / "repeat.toml").write_text(profile.format(name="repeat", sizes="[1, 2, 2]", budget="60"))
        (tmp_path / "nan.toml").write_text(profile.format(name="nan", sizes="[1, 2]", budget="nan"))
        (tmp_path / "hosts").write_bytes("n\xf6de0 slots=2\n".encode("latin-1"))
        (tmp_path / "a_file").write_text("not a folder\n")
        (tmp_path / "subs").mkdir()
        (tmp_path / "subs" / "alice.py").write_text("")
        values = {"bad_profile": tmp_path / "bad.toml", "empty_dir": tmp_path / "empty",
                  "corrupt_ckpt": tmp_path / "corrupt.pt", "path_profile": tmp_path / "path.toml",
                  "latin1_profile": tmp_path / "latin1.toml", "dir_profile": tmp_path / "dir.toml",
                  "repeat_profile": tmp_path / "repeat.toml", "nan_profile": tmp_path / "nan.toml",
                  "latin1_hosts": tmp_path / "hosts", "a_file": tmp_path / "a_file", "subs": tmp_path / "subs"}
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
            # A usage block (no command at all) is shown by its first line.
            shown = next((line for line in message if "error" in line.lower() and "***" not in line),
                         message[0] if message and message[0].startswith("usage:") else
                         message[-1] if message else "")
            # Paths as the command shows them, never this machine's: the temporary folder's files by
            # name, the checkout's relative to it (the page is read on other machines).
            for folder in sorted({str(tmp_path), os.path.realpath(tmp_path)}, key=len, reverse=True):
                shown = shown.replace(folder + "/", "").replace(folder, ".")
            shown = shown.replace(str(REPO) + "/", "")
            rows.append(f"| {what} | `{command.format(**{k: Path(v).name for k, v in values.items()})}` | "
                        f"{done.returncode} | {shown.replace('|', '/')} | {test} |")
    text = ["# Bad input, tried", "",
            "Every row was run by `docs/bad_inputs.py` (which wrote this page) and is covered by the test named.",
            "Nothing is started and no earlier result is touched by any of them.", "",
            "| input | command | exit | message | test |", "|---|---|---|---|---|", *rows, "",
            "## Done to a run, or by the program it runs", "",
            "Each is a case of `tests/test_adversarial.py` (not run by this script). However a run ends, no "
            "process of it is left (found by the launcher's session and process tree, orphans re-parented to the "
            "harness, and DISTLAB_RUN_ID), run.json says why, and no earlier run is touched.", "",
            "| what | what the harness does | exit | reason in run.json |", "|---|---|---|---|",
            *(f"| {what} | {does} | {code} | {reason} |" for what, does, code, reason in RUN_CASES), ""]
    (REPO / "docs" / "bad-inputs.md").write_text("\n".join(text))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
