"""The package's shape, checked: one-way layers (pyproject's import-linter contract)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "langchain_starcoder"
ENGINE = PACKAGE / "engine"


def test_imports_flow_one_way() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def _imports(file: Path) -> set[str]:
    """Every module ``file`` imports, anywhere (TYPE_CHECKING blocks and functions too), relative
    imports resolved, and ``from M import name`` counted as M and as M.name (which may be a module)."""
    package = ".".join(file.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = node.module if not node.level else ".".join(filter(None, [base, node.module]))
            if node.module:  # `from . import jobs` imports jobs, not what the package's __init__ does
                found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def test_the_engine_helpers_never_import_the_front() -> None:
    """The engine package's dependency runs one way: front imports its helpers (prepare, jobs,
    checks, fim_prompts, building), which never import front, the engine package (whose __init__
    imports front) or the class. And a request is a line: each method of the class makes at most
    one call that prepares it (prepare, checks, fim_prompts) and one that submits it (jobs)."""
    front = "langchain_starcoder.engine.front"
    back = {}
    for file in sorted(ENGINE.glob("*.py")):
        if file.name in ("front.py", "__init__.py"):
            continue
        wrong = {
            m
            for m in _imports(file)
            if m in (front, "langchain_starcoder.engine", "langchain_starcoder.engine.StarCoderEngine")
            or m.startswith(front + ".")
            or m.endswith(".StarCoderEngine")
        }
        if wrong:
            back[file.name] = sorted(wrong)
    assert back == {}
    assert {"langchain_starcoder.engine.jobs", "langchain_starcoder.engine.prepare"} <= _imports(
        ENGINE / "front.py"
    )
    steps = {"prepare": "prepare", "checks": "prepare", "fim_prompts": "prepare", "jobs": "submit"}
    tree = ast.parse((ENGINE / "front.py").read_text())
    prepared = {  # the names front takes from .prepare
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == "prepare"
        for alias in node.names
    }
    engine = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "StarCoderEngine")
    tangled = {}
    for method in engine.body:
        if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        uses = []  # each use of a helper in the body (called, or handed to a thread or a partial)
        for node in (n for statement in method.body for n in ast.walk(statement)):
            module = node.value if isinstance(node, ast.Attribute) else None  # helper.function
            if isinstance(module, ast.Name) and module.id in steps:
                uses.append(f"{steps[module.id]}: {module.id}.{node.attr}")
            elif isinstance(node, ast.Name) and node.id in prepared:
                uses.append(f"prepare: {node.id}")
        if sum(u.startswith("prepare") for u in uses) > 1 or sum(u.startswith("submit") for u in uses) > 1:
            tangled[method.name] = uses
    assert tangled == {}


def test_no_function_is_over_100_lines() -> None:
    """Every function and method in the package stays within 100 lines, its docstring included: a
    longer one is split into named steps."""
    long = []
    for file in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > 100:
                    long.append(f"{file.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle in ``graph`` (module -> the modules it imports), as a path; [] if none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str]:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return []
        path.append(module)
        for imported in sorted(graph[module]):
            if found := visit(imported):
                return found
        path.pop()
        done.add(module)
        return []

    for module in sorted(graph):
        if found := visit(module):
            return found
    return []


def test_the_benchmarks_have_no_import_cycle() -> None:
    """benchmarks/ imports one way: the entry (__main__) and the cases on top, the benchmark
    modules below them, shared helpers (harness, common) at the bottom. Every import counts (in
    functions and TYPE_CHECKING blocks too); importing ``package.module`` from outside the package
    runs the package's __init__ first, so it counts as importing the package as well."""
    bench = ROOT / "benchmarks"
    modules = {
        ".".join(file.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): file
        for file in bench.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, file in modules.items():
        inside = name if file.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for imported in _imports(file) & modules.keys():
            edges.add(imported)
            parts = imported.split(".")
            edges.update(
                package
                for package in (".".join(parts[:i]) for i in range(1, len(parts)))
                if not (inside + ".").startswith(package + ".")
            )
        graph[name] = edges - {name}
    assert "benchmarks.cases" in graph["benchmarks.__main__"]  # the graph sees lazy imports
    cycle = _cycle(graph)
    assert cycle == [], " -> ".join(cycle)
