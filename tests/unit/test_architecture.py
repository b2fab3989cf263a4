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
    """The engine package's dependency runs one way: front imports its helpers (jobs, fim_prompts,
    building), which never import front, the engine package (whose __init__ imports front) or the
    class."""
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
    assert {"langchain_starcoder.engine.jobs", "langchain_starcoder.engine.fim_prompts"} <= _imports(
        ENGINE / "front.py"
    )


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
