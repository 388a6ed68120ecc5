"""The harness's folders as docs/architecture.md draws them: no import circle, and each stage importing
only what it may (a run never imports grading or reporting; the programs on the ranks import nothing
of the harness).

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
# What each stage may import of the harness, besides itself and the base modules at harness/'s top.
BASE = {"harness", "harness.catalog", "harness.console", "harness.files", "harness.usage", "harness.schema_check"}
MAY_IMPORT = {
    "harness.on_ranks": set(),
    "harness.run": {"harness.on_ranks"},
    "harness.observe": {"harness.on_ranks", "harness.run"},
    "harness.verdict": {"harness.on_ranks", "harness.run", "harness.observe"},
    "harness.report": {"harness.verdict"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def harness_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(HARNESS.rglob("*.py"))}


def imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The harness modules `path` imports (a `from package import name` counts the submodule)."""
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


def test_the_base_modules_import_no_stage():
    graph = import_graph()
    assert {module: sorted(graph[module] - BASE) for module in BASE if graph[module] - BASE} == {}


@pytest.mark.parametrize("entry", ["harness.run.runner", "harness.run.request", "harness.commands.cli"])
def test_running_a_lab_imports_no_grading_and_no_reporting(entry):
    """What `distlab run` loads (the CLI, then the request and the runner): never observe, verdict,
    report, or another command. Checked in a fresh interpreter, so that nothing a test imported counts."""
    code = f"import sys, {entry}; print(' '.join(sorted(m for m in sys.modules if m.startswith('harness'))))"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    modules = loaded.stdout.split()
    assert entry in modules and "harness.run.request" in modules
    assert [m for m in modules if m.split(".")[1:2] in (["observe"], ["verdict"], ["report"], ["classgrade"])] == []
    front = {"harness.commands.cli", "harness.commands.verbs"}  # the parser; the verbs import their stage late
    assert [m for m in modules if m.startswith("harness.commands.") and m not in front] == []


def test_the_programs_on_the_ranks_import_nothing_of_the_harness_but_their_own_folder():
    """They are launched by path and run beside the student's code: harness.on_ranks only."""
    graph = import_graph()
    on_ranks = [m for m in graph if stage_of(m) == "harness.on_ranks"]
    assert {"harness.on_ranks.train_loop", "harness.on_ranks.plain_allreduce",
            "harness.on_ranks.observer.distlab_observer"} <= set(on_ranks)
    assert {m: sorted(graph[m]) for m in on_ranks if any(stage_of(o) != "harness.on_ranks" for o in graph[m])} == {}
