"""Modules that moved in the package's reshaping keep their old, documented names for one release."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

MOVED = {
    "langchain_starcoder.progress": "langchain_starcoder._progress",
    "langchain_starcoder.tokens": "langchain_starcoder._tokens",
    "langchain_starcoder.fim_request": "langchain_starcoder.fim.request",
    "langchain_starcoder.overlap": "langchain_starcoder.fim.overlap",
    "langchain_starcoder.gguf_testing": "langchain_starcoder.testing.gguf",
    "langchain_starcoder.blas": "langchain_starcoder._blas",
}


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_module_name_warns_and_is_the_new_module(old: str, new: str) -> None:
    # A fresh interpreter: the warning is given once, on the first import.
    code = (
        "import warnings, importlib\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({new!r})\n"
        "assert old is new, (old, new)\n"
        "messages = [str(w.message) for w in caught if w.category is DeprecationWarning]\n"
        f"assert any({old!r} in m for m in messages), messages\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_documented_imports_still_work() -> None:
    """What README, docs, examples and notebooks import, from where they import it."""
    from langchain_starcoder import FIMRequest, show_progress
    from langchain_starcoder.fim import ContextFile, build_fim_prompt
    from langchain_starcoder.progress import show_progress as old_show_progress

    assert old_show_progress is show_progress
    assert FIMRequest.__module__ == "langchain_starcoder.fim.request"
    assert ContextFile(path="a.py", text="x").path == "a.py"
    assert callable(build_fim_prompt)
    assert importlib.import_module("langchain_starcoder.tokens").max_text_chars
