"""distlab: run the labs through the real launchers, check the host, grade the results.

This module is the command line only: each subcommand's arguments, and one line that hands
them to the module that does the work (request+runner, grade, calibrate, scale, templates,
doctor, benches). docs/architecture.md draws the whole path.
"""

from __future__ import annotations

import argparse
import signal
import sys
from importlib import metadata
from pathlib import Path

from harness.catalog import LABS
from harness.commands.verbs import (
    cmd_bench,
    cmd_calibrate,
    cmd_data,
    cmd_doctor,
    cmd_grade,
    cmd_grade_class,
    cmd_run,
    cmd_scale,
    cmd_template,
)
from harness.console import console
from harness.run.errors import HarnessError, RunStopped
from harness.run.launchers import LAUNCHERS
from harness.usage import Parser, UsageError, positive_float, positive_int, split_lab_args, world_size_list


def add_run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--launcher", choices=sorted(LAUNCHERS),
                        help="default: by backend (gloo/nccl torchrun, mpi mpirun, horovod horovodrun); python for 1")
    parser.add_argument("--backend", help="communication backend (default: the lab's)")
    parser.add_argument("--threads", type=positive_int, help="OMP threads per rank (default: cores / world size)")
    parser.add_argument("--timeout", type=positive_float, default=900.0, help="seconds before the run is ended")
    parser.add_argument("--results", type=Path, default=Path("results"), help="results root (default ./results)")
    parser.add_argument("--program", type=Path, help="run this program instead of the lab's own (same contract)")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="torchrun: restart all ranks this often after a failure (elastic)")
    nodes = parser.add_argument_group("several nodes (docs/multinode.md)")
    nodes.add_argument("--nnodes", type=positive_int, default=1, help="torchrun: number of nodes")
    nodes.add_argument("--node-rank", type=int, default=0, help="torchrun: this node's rank, 0..nnodes-1")
    nodes.add_argument("--rdzv-endpoint", help="torchrun: HOST:PORT of the c10d rendezvous (served by node 0)")
    nodes.add_argument("--rdzv-id", default="distlab", help="torchrun: job id shared by all nodes")
    nodes.add_argument("--rdzv-timeout", type=positive_float, default=60.0,
                       help="seconds to wait for the endpoint and the other nodes (default 60)")
    nodes.add_argument("--local-addr", help="torchrun: this node's address as the others reach it "
                       "(default: the source address of the route to the endpoint)")
    nodes.add_argument("--hosts", "-H", help="mpirun/horovodrun: host:slots,... (e.g. node0:2,node1:2)")
    nodes.add_argument("--hostfile", type=Path, help="mpirun/horovodrun: a hostfile (host slots=N per line)")
    nodes.add_argument("--gloo-ifname", help="network interface for Gloo (sets GLOO_SOCKET_IFNAME)")
    nodes.add_argument("--nccl-ifname", help="network interface for NCCL (sets NCCL_SOCKET_IFNAME)")


def add_grade_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--labs", help="comma-separated labs (default: all labs of the profile)")
    parser.add_argument("--world-sizes", type=world_size_list, help="e.g. 1,2,4 (default: the profile's)")
    parser.add_argument("--repeats", type=positive_int, default=1, help="runs per lab and world size")
    parser.add_argument("--program", action="append", metavar="LAB=PATH",
                        help="grade this program for LAB instead of the lab's own (repeatable)")
    parser.add_argument("--results", type=Path, default=Path("results"), help="results root (default ./results)")
    parser.add_argument("--timeout", type=positive_float, help="seconds per run (default: 2 x the time budget)")


def add_scale_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lab", choices=["ddp", "horovod"], default="ddp",
                        help="ddp (torch.distributed, torchrun) or horovod (horovodrun); default ddp")
    parser.add_argument("--world-sizes", type=world_size_list, required=True,
                        help="increasing, comma-separated, e.g. 1,2,4; the smallest is the baseline")
    parser.add_argument("--mode", choices=["weak", "strong"], default="weak",
                        help="weak: fixed per-rank batch (default); strong: fixed global batch split across ranks")
    parser.add_argument("--repeats", type=positive_int, default=3, help="runs per world size (default 3)")
    parser.add_argument("--batch", type=positive_int, help="weak: images per rank per step (default: the lab's)")
    parser.add_argument("--global-batch", type=positive_int, help="strong: images per step over all ranks")
    parser.add_argument("--backend", choices=["gloo", "nccl"],
                        help="--lab ddp only (default: nccl when GPUs are visible, else gloo)")
    parser.add_argument("--launcher", help="default: torchrun for ddp, horovodrun for horovod")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="OMP threads per rank, the same at every world size (default 1)")
    parser.add_argument("--timeout", type=positive_float, default=900.0, help="seconds before one run is ended")
    parser.add_argument("--results", type=Path, default=Path("results"), help="results root (default ./results)")




def cmd_completion(args: argparse.Namespace, lab_args: list[str]) -> int:
    import shtab

    sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
    return 0


def cmd_acceptance(args: argparse.Namespace, lab_args: list[str]) -> int:
    from harness.commands import acceptance

    return acceptance.run(args, main)



class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option shows its default; descriptions and examples keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or "default" in (action.help or ""):
            return action.help  # no default to show, or the help already says it in words
        return super()._get_help_string(action)


EXAMPLES = {
    "run": """examples:
  distlab run check -n 2                           # 2 ranks, torchrun, gloo
  distlab run ddp -np 2 -- --smoke                 # after --: the lab's own arguments
  distlab run ddp -n 2 --backend nccl              # 2 GPUs
  distlab run check -n 2 --backend horovod -H localhost:2""",
    "grade": """examples:
  distlab grade                                    # the profile that fits this host
  distlab grade --profile cpu-smoke --world-sizes 1,2 --labs check,ddp
  distlab grade --program ddp=student_ddp.py --json > grade.json""",
    "grade-class": """examples:
  distlab grade-class submissions/ --lab ddp --profile cpu-smoke      # one folder or .py file per student
  distlab grade-class submissions/ --rubric week4.toml --jobs 2
  distlab grade-class submissions/ --rerun alice                      # grade one student again
  distlab grade-class submissions/ --regrade --rubric week4-v2.toml   # new rubric, no training
  distlab grade-class submissions/ --autograder gradescope.zip        # a Gradescope autograder bundle""",
    "calibrate": """examples:
  distlab calibrate --profile my-host --repeats 3  # writes ./profiles/my-host.toml
  distlab grade --profile profiles/my-host.toml""",
    "scale": """examples:
  distlab scale --lab ddp --world-sizes 1,2,4 --repeats 3
  distlab scale --lab ddp --world-sizes 1,2,4 --mode strong --global-batch 128""",
    "template": """examples:
  distlab template slurm-torchrun --nodes 2 --gpus-per-node 8 > job.sbatch
  distlab template slurm-torchrun --nodes 2 --gpus-per-node 0 --cpus-per-task 16   # CPU nodes, gloo
  distlab template k8s-mpijob --lab horovod --nodes 2""",
    "doctor": "examples:\n  distlab doctor\n  distlab doctor --json",
    "data": "examples:\n  distlab data --data-dir data",
    "bench": "examples:\n  distlab bench train -- --repeats 3\n  distlab bench allreduce -- --world-size 2\n"
             "  distlab bench verdict -- --grades 10 --load 2",
    "acceptance": "examples:\n  distlab acceptance                      # every GPU this host shows\n"
                  "  CUDA_VISIBLE_DEVICES=0,1 distlab acceptance",
    "plan": "examples:\n  distlab plan --params 7e9 --gpus 8 --gpu-memory 80GB --optimizer adam --precision bf16\n"
            "  distlab plan --params 70e9 --gpus 64 --gpu-memory 80GB --seq-len 4096 --batch 1 --json",
    "compare": "examples:\n  distlab compare               # DDP, Horovod, ZeRO, FSDP2, DeepSpeed at world sizes 1, 2\n"
               "  distlab compare --smoke --world-sizes 2 --tools ddp,fsdp2,deepspeed-zero3",
    "predict": "examples:\n  distlab predict --scale results/scale/STUDY --bench results/allreduce_bench/RUN --check\n"
               "  distlab predict --cluster          # DGX H100 and 1024 GPUs over InfiniBand, from published figures",
    "completion": "examples:\n  distlab completion bash > /etc/bash_completion.d/distlab",
}


def version() -> str:
    try:
        return metadata.version("distlab")
    except metadata.PackageNotFoundError:  # a checkout used without installing it
        return "unknown (not installed)"


def build_parser() -> Parser:
    parser = Parser(prog="distlab", description=__doc__.splitlines()[0], formatter_class=HelpFormatter,
                    epilog="distlab COMMAND --help shows each command's options and examples.")
    parser.add_argument("--version", action="version", version=f"distlab {version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    def command(name: str, **kwargs) -> Parser:
        return commands.add_parser(name, formatter_class=HelpFormatter, epilog=EXAMPLES[name], **kwargs)

    run = command("run", help="run one lab at one world size through a real launcher",
                  description="Run LAB with N ranks; arguments after -- go to the lab.")
    run.add_argument("lab", choices=list(LABS), help="the lab to run")
    # -np is mpirun's and horovodrun's spelling, --nproc-per-node torchrun's: people type them from habit.
    run.add_argument("--world-size", "-n", "-np", "--nproc-per-node", dest="world_size", type=positive_int,
                     required=True, help="number of ranks")
    add_run_args(run)
    run.add_argument("--json", action="store_true", help="print the run's summary as JSON on stdout")
    run.add_argument("--dry-run", action="store_true", help="print the launcher command and start nothing")
    run.set_defaults(func=cmd_run)

    doctor = command("doctor", help="what this host offers and which labs it can run")
    doctor.add_argument("--json", action="store_true", help="print the facts as JSON")
    doctor.set_defaults(func=cmd_doctor)

    data = command("data", help="download CIFAR-10 once (needs internet)")
    data.add_argument("--data-dir", type=Path, default=Path("data"), help="where to keep it (default ./data)")
    data.set_defaults(func=cmd_data)

    grade = command("grade", help="run labs at several world sizes and compare with expected results")
    add_grade_args(grade)
    grade.add_argument("--profile", help="profile name or path to a .toml (default: the one that fits this host)")
    grade.add_argument("--json", action="store_true", help="print the grade's summary as JSON on stdout")
    grade.add_argument("--dry-run", action="store_true",
                       help="print the plan (profile, cells, each launcher command) and start nothing")
    grade.add_argument("--slurm", action="store_true",
                       help="run the cells as a Slurm job array, one task per cell (with --dry-run: print it)")
    grade.add_argument("--sbatch-arg", action="append", metavar="ARG",
                       help="--slurm: an sbatch option for the array, e.g. --sbatch-arg=--partition=cpu (repeatable)")
    grade.set_defaults(func=cmd_grade)

    grade_class = command("grade-class", help="grade a class of submissions, each in a sandbox, into a gradebook",
                          description="Each submission graded as `grade --program` grades one, in bubblewrap, "
                                      "side by side; gradebook, class page, feedback (docs/grading-class.md).")
    from harness.classgrade import classroom

    classroom.add_arguments(grade_class)
    grade_class.set_defaults(func=cmd_grade_class)

    calibrate = command("calibrate", help="measure this host and write a profile of expected results")
    add_grade_args(calibrate)
    calibrate.add_argument("--profile", required=True, help="name of the new profile (written to OUTPUT/NAME.toml)")
    calibrate.add_argument("--template", default="cpu-grade",
                           help="profile whose labs, arguments and world sizes are measured")
    calibrate.add_argument("--output", type=Path, default=Path("profiles"),
                           help="folder the new profile goes to (yours: the package folder may belong to root)")
    calibrate.set_defaults(func=cmd_calibrate)

    from harness.run.job_templates import TEMPLATES
    from harness.usage import non_negative_int

    template = command("template", help="print a Slurm or Kubernetes job for a lab",
                                   description="; ".join(f"{k}: {v[1]}" for k, v in TEMPLATES.items())
                                   + ". Arguments after -- go to the lab.")
    template.add_argument("name", choices=sorted(TEMPLATES))
    template.add_argument("--lab", default="ddp", help="lab to run (default ddp)")
    template.add_argument("--nodes", type=positive_int, default=2, help="number of nodes (default 2)")
    template.add_argument("--gpus-per-node", type=non_negative_int, default=8,
                          help="GPUs per node (default 8; 0: a CPU cluster, Gloo, no GPU requested)")
    template.add_argument("--ranks-per-node", type=non_negative_int, default=0,
                          help="ranks per node (default: one per GPU; 1 on CPU nodes)")
    template.add_argument("--backend", help="default: horovod for MPI templates, else nccl on GPUs, gloo on CPUs")
    template.add_argument("--image", help="container image (Slurm: pyxis/enroot; default: none for Slurm)")
    template.add_argument("--port", type=positive_int, default=29400, help="rendezvous/master port")
    template.add_argument("--time", default="00:30:00", help="Slurm time limit")
    template.add_argument("--cpus-per-task", type=positive_int, default=8, help="CPU nodes: CPUs per task/pod")
    template.add_argument("--cpus-per-gpu", type=positive_int, default=8, help="GPU nodes: CPUs per GPU (its rank's)")
    template.add_argument("--results-claim", default="distlab-results",
                          help="Kubernetes: the PersistentVolumeClaim the results go to (default distlab-results)")
    template.add_argument("--ifname", help="network interface the nodes share (GLOO/NCCL_SOCKET_IFNAME)")
    template.add_argument("--out", type=Path, help="write here (never overwrites) instead of stdout")
    template.set_defaults(func=cmd_template)

    scale = command("scale", help="strong or weak scaling: the scaling lab at several world sizes",
                                description="Run labs/scaling at each world size; arguments after -- go to the lab. "
                                            "How to read the numbers: labs/SCALING.md.")
    add_scale_args(scale)
    scale.add_argument("--json", action="store_true", help="print the study's summary as JSON on stdout")
    scale.set_defaults(func=cmd_scale)

    plan = command("plan", help="memory per GPU of DDP, ZeRO, FSDP, tensor and pipeline parallel: which fits",
                   description="The picking-the-tool lecture as a command (labs/PARALLELISM.md).")
    from harness.commands import memory_plan as planner

    planner.add_arguments(plan)
    plan.set_defaults(func=planner.cmd_plan)

    compare = command("compare", help="DDP, Horovod, ZeRO, FSDP2 and DeepSpeed on one model: the lecture's table",
                      description="Each tool's program on the same model and batch through its launcher; memory, "
                                  "step time, throughput vs DDP, lines added (labs/PARALLELISM.md).")
    from harness.commands import compare as comparison

    comparison.add_arguments(compare)
    compare.set_defaults(func=comparison.cmd_compare)

    predict = command("predict", help="step time, throughput and efficiency at 1..1024 ranks (alpha-beta model)",
                      description="DDP and FSDP past this machine, from a measured step and interconnect "
                                  "(harness/commands/step_model.py: the formulas; labs/SCALING.md).")
    from harness.commands import predict as predictor

    predictor.add_arguments(predict)
    predict.set_defaults(func=predictor.cmd_predict)

    bench = command("bench", help="benchmarks that print ratios measured side by side",
                    description="Arguments after -- go to the benchmark.")
    bench.add_argument("what", choices=["train", "allreduce", "verdict"])
    bench.set_defaults(func=cmd_bench)

    acceptance = command("acceptance", help="a fresh GPU host, end to end: every lab on NCCL, calibrate, grade",
                         description="Doctor, every lab at world sizes 1..N on the visible GPUs, benchmarks, a "
                                     "profile calibrated for this GPU and a grade against it; one folder, one archive.")
    acceptance.add_argument("--results", type=Path, default=Path("results"), help="results root")
    acceptance.add_argument("--dry-run", action="store_true",
                            help="print every step with its expected seconds; start nothing")
    acceptance.add_argument("--gpus", type=positive_int,
                            help="--dry-run on a host without GPUs: plan for this many (default 1)")
    acceptance.add_argument("--gpu-model", help='--dry-run on a host without GPUs: their model (default "NVIDIA H200")')
    acceptance.set_defaults(func=cmd_acceptance)

    completion = command("completion", help="print a shell completion script (lab names, options)")
    completion.add_argument("shell", choices=["bash", "zsh", "tcsh"])
    completion.set_defaults(func=cmd_completion)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, lab_args = split_lab_args(argv)
    try:
        args = build_parser().parse_args(own)
        if getattr(args, "json", False):
            console.file = sys.stderr  # stdout carries the JSON summary alone
        return args.func(args, lab_args)
    except UsageError as error:
        print(f"distlab: error: {error}", file=sys.stderr)
        return 2
    except RunStopped as stop:  # Ctrl-C, SIGTERM, SIGHUP during a run (a KeyboardInterrupt too: caught first)
        what = "interrupted" if stop.signum == signal.SIGINT else str(stop)
        print(f"distlab: {what}; finished runs are kept, no process left running", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:
        print("distlab: interrupted; finished runs are kept, no process left running", file=sys.stderr)
        return 130
    except HarnessError as error:  # the run was stopped and accounted for; the traceback is in its folder
        print(f"distlab: error: {error}", file=sys.stderr)
        return error.exit_code
    except ModuleNotFoundError as error:  # torch, torchvision, mpi4py or Horovod missing from this Python
        print(f"distlab: error: {error.name} is not installed in {sys.executable}; run `make setup` "
              "(or `distlab doctor` to see what this host has)", file=sys.stderr)
        return 2
    finally:
        console.file = None  # back to following sys.stdout, whatever it is then


if __name__ == "__main__":
    sys.exit(main())
