"""The harness's folders as docs/architecture.md draws them: no import circle, each stage importing
only what it may (a run never imports grading or reporting; the programs on the ranks import nothing
of the harness; nothing below the commands imports one; no command imports another), and the seam
with labs/ (the lab contract anywhere, the training kit only on the ranks and in the evaluator, a lab
never).

Imports are read from the source with ast, every one of them: at the top of a module, inside a
function, under TYPE_CHECKING. A circle hidden in a function body is still a circle a reader trips on.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "harness"
# What each stage may import of the harness, besides itself and the base modules at harness/'s top;
# the table of docs/architecture.md, one row per folder. The order is the house's: down to the left.
BASE = {"harness", "harness.catalog", "harness.console", "harness.files", "harness.usage", "harness.schema_check"}
MAY_IMPORT = {
    "harness.on_ranks": set(),
    "harness.run": {"harness.on_ranks"},
    "harness.observe": {"harness.on_ranks", "harness.run"},
    "harness.verdict": {"harness.on_ranks", "harness.run", "harness.observe"},
    "harness.report": {"harness.verdict"},
    "harness.planning": set(),
    "harness.grading": {"harness.on_ranks", "harness.run", "harness.observe", "harness.verdict"},
    "harness.classgrade": {"harness.on_ranks", "harness.run", "harness.observe", "harness.verdict", "harness.report",
                           "harness.grading"},
    "harness.benchmarks": {"harness.on_ranks", "harness.run", "harness.observe", "harness.verdict", "harness.report",
                           "harness.grading", "harness.classgrade"},
    # The GPU acceptance's machinery: it starts distlab's commands as processes, never imports one.
    "harness.acceptance": {"harness.verdict", "harness.grading"},
    "harness.commands": {"harness.on_ranks", "harness.run", "harness.observe", "harness.verdict", "harness.report",
                         "harness.planning", "harness.grading", "harness.classgrade", "harness.benchmarks",
                         "harness.acceptance"},
}
# The seam with labs/: the lab contract (standard library only at import) may be imported anywhere;
# the torch training kit only by what runs on the ranks and by the evaluator; a lab's program never.
LAB_CONTRACT = {"labs.common.contract", "labs.common.topology", "labs.common.host", "labs.common.backends",
                "labs.common.sizes", "labs.common.provenance"}
TRAINING_KIT_USERS = {"harness.observe.accuracy",  # the evaluator: the lab's model and test set, rebuilt
                      "harness.commands.data"}  # `distlab data`: the labs' own CIFAR-10 download


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def harness_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(HARNESS.rglob("*.py"))}


def lab_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted((REPO / "labs").rglob("*.py"))}


def imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that `path` imports (a `from package import name` counts the submodule)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], *filter(None, [base])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {module for module in found if module in modules and module != name}


def import_graph() -> dict[str, set[str]]:
    modules = harness_modules()
    return {name: imports(path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_circle_finder_finds_a_circle_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_among_the_harness_modules():
    graph = import_graph()
    assert len(graph) > 60  # every module was read, the folders' too
    assert circles(graph) == []


def stage_of(module: str) -> str | None:
    return next((stage for stage in MAY_IMPORT if module == stage or module.startswith(stage + ".")), None)


def test_each_stage_imports_only_the_stages_before_it():
    wrong = []
    for module, imported in import_graph().items():
        stage = stage_of(module)
        if stage is None:
            continue
        allowed = BASE | {stage} | MAY_IMPORT[stage]
        wrong += [f"{module} imports {other}" for other in sorted(imported)
                  if other not in BASE and stage_of(other) not in allowed]
    assert wrong == []


# The sandbox is entered by a program run as a path (sandbox/enter.py, `python -I`), before anything of
# the submission starts: its modules import one another and the base modules only (the run folder's
# placeholder from harness.run.run_dir), never the rest of classgrade/ or a later stage.
SANDBOX = "harness.classgrade.sandbox"
SANDBOX_MAY_IMPORT = BASE | {"harness.run.run_dir"}


def test_the_sandbox_modules_import_each_other_and_the_base_modules_only():
    graph = import_graph()
    modules = [m for m in graph if m == SANDBOX or m.startswith(SANDBOX + ".")]
    assert {f"{SANDBOX}.{name}" for name in ("enter", "bubblewrap", "uid", "cgroups", "seccomp", "limits", "spec",
                                               "monitor")} <= set(modules)
    wrong = [f"{m} imports {o}" for m in modules for o in sorted(graph[m])
             if o not in SANDBOX_MAY_IMPORT and not o.startswith(SANDBOX + ".")]
    assert wrong == []


def test_the_base_modules_import_no_stage():
    graph = import_graph()
    assert {module: sorted(graph[module] - BASE) for module in BASE if graph[module] - BASE} == {}


def test_the_table_has_a_row_for_every_folder_of_the_harness():
    folders = {f"harness.{path.parent.relative_to(HARNESS).parts[0]}" for path in HARNESS.rglob("*.py")
               if path.parent != HARNESS}
    assert folders == set(MAY_IMPORT)


def test_nothing_below_the_commands_imports_one_and_no_command_imports_another():
    """The arrow back up the house: a stage importing a command, or a command another command (only
    the parser, cli.py, is reached from a command: completion and acceptance drive the whole CLI)."""
    from harness.commands.cli import COMMANDS

    commands = {module for module, _ in COMMANDS.values()}
    wrong = []
    for module, imported in import_graph().items():
        up = {other for other in imported if stage_of(other) == "harness.commands"}
        if stage_of(module) != "harness.commands":
            wrong += [f"{module} imports {other}" for other in sorted(up)]
        elif module in commands:
            wrong += [f"{module} imports {other}" for other in sorted(up & commands)]
    assert wrong == []


def test_the_finders_see_an_arrow_back_up_and_a_lab_imported(tmp_path, monkeypatch):
    """The checks above can fail: a stage importing a command is caught, and so is a lab's program."""
    fake = tmp_path / "harness" / "verdict" / "x.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from harness.commands import grade\nimport labs.ddp.train\n")
    modules = {"harness.commands.grade": Path("x"), "harness.verdict.x": fake, "labs.ddp.train": Path("y")}
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert imports(fake, modules) == {"harness.commands.grade", "labs.ddp.train"}
    assert stage_of("harness.commands.grade") == "harness.commands"
    assert not allowed_lab_import("harness.verdict.x", "labs.ddp.train")
    assert not allowed_lab_import("harness.verdict.x", "labs.common.models")
    assert allowed_lab_import("harness.on_ranks.train_loop", "labs.common.models")
    assert allowed_lab_import("harness.verdict.x", "labs.common.contract")


def allowed_lab_import(module: str, lab_module: str) -> bool:
    if lab_module in LAB_CONTRACT:
        return True
    if lab_module.startswith("labs.common."):  # the training kit
        return stage_of(module) == "harness.on_ranks" or module in TRAINING_KIT_USERS
    return False  # a lab's own program, or labs.common itself as a package


def test_the_harness_meets_labs_only_through_the_contract_and_the_training_kit_where_it_may():
    labs = lab_modules()
    wrong = [f"{module} imports {lab}" for module, path in harness_modules().items()
             for lab in sorted(imports(path, labs)) if not allowed_lab_import(module, lab)]
    assert wrong == []


def test_the_lab_contract_needs_only_the_standard_library_at_import():
    """What the harness imports of labs/ anywhere: importing it loads no torch (nor numpy)."""
    code = (f"import sys; import {', '.join(sorted(LAB_CONTRACT))}; "
            "print(' '.join(m for m in ('torch', 'numpy', 'torchvision') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert loaded.stdout.split() == []


def test_the_harness_writes_json_through_its_one_writer():
    """harness/files.write_json (by rename, one format): no module writes JSON files of its own."""
    wrong = []
    for module, path in harness_modules().items():
        text = path.read_text()
        if stage_of(module) == "harness.on_ranks" or module == "harness.files":
            continue  # the ranks write with the standard library only; files.py is the writer
        for needle in ("write_json_atomic", "json.dump(", ".write_text(json.dumps"):
            if needle in text:
                wrong.append(f"{module}: {needle}")
    assert wrong == []


SLURM_COMMANDS = {"sbatch", "scancel", "sacct"}


def test_exactly_one_module_runs_slurm_commands():
    """harness/run/slurm_array.py submits, cancels and accounts every array: two copies of it once
    behaved differently (one cancelled its array when stopped, the other left it queued)."""
    runners = {module for module, path in harness_modules().items()
               for node in ast.walk(ast.parse(path.read_text(), str(path)))
               if isinstance(node, ast.Constant) and node.value in SLURM_COMMANDS}
    assert runners == {"harness.run.slurm_array"}


# What is read of cgroups (the sandbox's cgroups.py writes memory.max, pids.max and cgroup.procs).
CGROUP_READS = {"/proc/self/cgroup", "memory.peak", "memory.events", "pids.events", "memory.max_usage_in_bytes",
                "memory.oom_control", "cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us"}


def test_exactly_one_module_reads_cgroup_files():
    """labs/common/host.py reads every cgroup file: this process's own groups (the CPU quota, a
    container's memory) and the counters of a job's group, which the sandbox's cgroups.py makes,
    limits and removes. Three readers once parsed them, each its own way."""
    readers = {module for module, path in {**harness_modules(), **lab_modules()}.items()
               for node in ast.walk(ast.parse(path.read_text(), str(path)))
               if isinstance(node, ast.Constant) and node.value in CGROUP_READS}
    assert readers == {"labs.common.host"}


@pytest.mark.parametrize("entry", ["harness.run.runner", "harness.run.request"])
def test_running_a_lab_imports_no_grading_and_no_reporting(entry):
    """What `distlab run` loads: never observe, verdict, report, grading, or another command. Checked
    in a fresh interpreter, so that nothing a test imported counts."""
    code = f"import sys, {entry}; print(' '.join(sorted(m for m in sys.modules if m.startswith('harness'))))"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    modules = loaded.stdout.split()
    assert entry in modules and "harness.run.request" in modules
    assert [m for m in modules if stage_of(m) not in (None, "harness.run", "harness.on_ranks")] == []


def test_the_run_command_loads_its_own_module_and_the_parser_only():
    """`distlab run ...` builds the parser for `run` alone: the other commands are not imported."""
    code = ("import sys\nfrom harness.commands import cli\n"
            "cli.build_parser('run').parse_args(['run', 'check', '-n', '1'])\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('harness'))))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    modules = loaded.stdout.split()
    assert "harness.commands.run" in modules and "harness.run.runner" in modules
    assert [m for m in modules if m.startswith("harness.commands.")] == ["harness.commands.cli", "harness.commands.run"]
    assert [m for m in modules if stage_of(m) not in (None, "harness.run", "harness.on_ranks", "harness.commands")] \
        == []


def test_the_programs_on_the_ranks_import_nothing_of_the_harness_but_their_own_folder():
    """They are launched by path and run beside the student's code: harness.on_ranks only."""
    graph = import_graph()
    on_ranks = [m for m in graph if stage_of(m) == "harness.on_ranks"]
    assert {"harness.on_ranks.train_loop", "harness.on_ranks.plain_allreduce",
            "harness.on_ranks.observer.distlab_observer.observer"} <= set(on_ranks)
    assert {m: sorted(graph[m]) for m in on_ranks if any(stage_of(o) != "harness.on_ranks" for o in graph[m])} == {}


def test_the_observer_puts_one_name_first_on_the_ranks_path():
    """Its folder goes first on every rank's PYTHONPATH: each module there shadows a student's module of
    the same name, so it holds sitecustomize (on purpose) and the distlab_observer package, nothing else."""
    from harness.on_ranks import OBSERVER

    names = sorted(p.name for p in OBSERVER.iterdir() if p.name != "__pycache__")
    assert names == ["__init__.py", "distlab_observer", "sitecustomize.py"]
