"""The repository-context measure (benchmarks/repo_measure.py) follows the issue's definition, and its
baselines (benchmarks/repo_baselines.py) keep the budget."""

from __future__ import annotations

from pathlib import Path

from benchmarks.repo_baselines import BM25Windows, ImportsWhole
from benchmarks.repo_measure import make_holes, python_hole_lines, recall
from langchain_starcoder import ContextFile
from langchain_starcoder.repo import FRAME_TOKENS

SOURCE = '''"""Module docstring
spanning lines."""
# a comment
import helpers


def run(items):
    """Docstring."""

    total = helpers.accumulate_values(items)
    return total
'''


def test_hole_lines_skip_blank_comment_and_string_lines() -> None:
    lines = SOURCE.splitlines()
    kept = [lines[i].strip() for i in python_hole_lines(SOURCE)]
    assert kept == [
        "import helpers",
        "def run(items):",
        "total = helpers.accumulate_values(items)",
        "return total",
    ]


def test_holes_keep_only_names_defined_elsewhere_and_absent_around(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(SOURCE)
    (tmp_path / "helpers.py").write_text("def accumulate_values(xs):\n    return sum(xs)\n\nLIMIT = 3\n")
    (tmp_path / "test_main.py").write_text("from helpers import LIMIT\nx = LIMIT\n")  # tests give no holes
    holes = make_holes(tmp_path, ["helpers.py", "main.py", "test_main.py"], "python")
    assert [(h.path, sorted(h.targets)) for h in holes] == [("main.py", ["accumulate_values"])]
    (hole,) = holes
    assert hole.prefix.endswith("\n    ") and hole.suffix.startswith("\n    return total")
    assert recall(hole, [ContextFile("helpers.py", "def accumulate_values(xs):")]) == 1.0
    assert recall(hole, [ContextFile("helpers.py", "def accumulate_values_x(xs):")]) == 0.0


def test_bm25_baseline_skips_the_hole_file_and_keeps_the_budget(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(SOURCE)
    (tmp_path / "helpers.py").write_text("def accumulate_values(items):\n    return sum(items)\n" * 30)
    (hole,) = make_holes(tmp_path, ["helpers.py", "main.py"], "python")
    bm25 = BM25Windows(tmp_path, ["helpers.py", "main.py"])

    def count(text: str) -> int:
        return len(text.split())

    for budget in (10, 40, 200):
        files = bm25.context(hole, budget, count)
        assert all(f.path == "helpers.py" for f in files)
        assert sum(count(f.path) + count(f.text) + FRAME_TOKENS for f in files) <= budget
    assert recall(hole, bm25.context(hole, 200, count)) == 1.0


def test_imports_baseline_reads_the_hole_files_imports_and_keeps_the_budget(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "main.py").write_text(SOURCE.replace("import helpers", "from . import helpers"))
    (tmp_path / "pkg" / "helpers.py").write_text("def accumulate_values(xs):\n    return sum(xs)\n")
    (tmp_path / "pkg" / "other.py").write_text("def accumulate_values_too(xs):\n    return xs\n")
    files = ["pkg/helpers.py", "pkg/main.py", "pkg/other.py"]
    (hole,) = make_holes(tmp_path, files, "python")
    imports = ImportsWhole(tmp_path, files)
    assert imports.imported(hole) == ["pkg/helpers.py"]

    def count(text: str) -> int:
        return len(text.split())

    (whole,) = imports.context(hole, 200, count)
    assert whole == ContextFile("pkg/helpers.py", (tmp_path / "pkg" / "helpers.py").read_text())
    assert imports.context(hole, 5, count) == []  # it does not fit whole: nothing
