"""The package's shape, checked: one-way layers (pyproject's import-linter contract), small files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "langchain_starcoder"


def test_imports_flow_one_way() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_no_module_is_too_long_without_saying_why() -> None:
    """A file over ~450 lines says in its first lines why it is one file."""
    long = []
    for file in PACKAGE.rglob("*.py"):
        lines = file.read_text().splitlines()
        if len(lines) > 460 and not any("one file" in line.lower() for line in lines[:6]):
            long.append(f"{file.relative_to(ROOT)}: {len(lines)} lines")
    assert long == []
