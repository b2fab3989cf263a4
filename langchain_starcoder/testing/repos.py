"""Repositories for tests, written from text by path; the default a tiny Python one to cut evaluation
holes from: three files, one using another's names (so the cross-file holes have a definition to find)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

UTIL = "def scale(value, factor=2):\n    return value * factor\n\n\nLIMIT = 10\n"
APP = (
    "from pkg.util import scale, LIMIT\n\n\ndef run(values):\n    total = 0\n    for v in values:\n"
    "        total += scale(v)\n    return min(total, LIMIT)\n"
)
SHAPES = (
    "class Box:\n    def __init__(self, width, height):\n        self.width = width\n"
    "        self.height = height\n\n    def area(self):\n        return self.width * self.height\n"
)
#: The files by their path in the repository.
FILES = {"pkg/util.py": UTIL, "pkg/app.py": APP, "pkg/shapes.py": SHAPES}


def write_files(root: Path, files: Mapping[str, str] = FILES) -> Path:
    """``files`` (text by path; by default the small repository's) written under ``root``."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
