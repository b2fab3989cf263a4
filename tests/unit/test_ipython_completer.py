"""``%load_ext langchain_starcoder`` in a real IPython shell: the completer offers the model's greedy
middle, with the cells the kernel ran (and what they printed, returned and raised) as notebook context."""

from __future__ import annotations

from pathlib import Path

import pytest
from ipykernel.inprocess.manager import InProcessKernelManager
from IPython.core.completer import provisionalcompleter
from IPython.core.interactiveshell import InteractiveShell

from langchain_starcoder import NotebookContext, StarCoderEngine
from langchain_starcoder.jupyter import ipython as extension


@pytest.fixture
def shell(tiny_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A real kernel's shell (ipykernel's, in process): results and errors go to the frontend as
    messages, what cells print goes to stdout, as in any Jupyter frontend."""
    monkeypatch.setenv("LANGCHAIN_STARCODER_MODEL", str(tiny_path))
    manager = InProcessKernelManager()
    manager.start_kernel()
    shell = manager.kernel.shell
    shell.run_cell("%load_ext langchain_starcoder")
    yield shell
    shell.run_cell("%unload_ext langchain_starcoder")
    manager.shutdown_kernel()
    type(shell).clear_instance()  # else get_ipython() says later tests run in a kernel


def test_load_ext_completes_with_the_kernel_history(
    shell: InteractiveShell, tiny_engine: StarCoderEngine
) -> None:
    shell.run_cell("prices = [1.5, 2.0, 3.25]\nprint('loaded', len(prices))")
    shell.run_cell("sum(prices)")
    shell.run_cell("prices.mean()")  # raises AttributeError
    completer = extension._active
    assert completer is not None and completer.engine.context_window == tiny_engine.context_window
    assert [c.source for c in completer.cells] == [
        "prices = [1.5, 2.0, 3.25]\nprint('loaded', len(prices))",
        "sum(prices)",
        "prices.mean()",
    ]
    ctx = completer.context("total = ", "")
    assert isinstance(ctx, NotebookContext) and ctx.cell == 3
    assert [c.output for c in ctx.cells[:3]] == [
        "loaded 3",
        "6.75",
        "AttributeError: 'list' object has no attribute 'mean'",
    ]

    text = "total = pri"
    expected = tiny_engine.infill(text, "", notebook=ctx, max_tokens=extension.MAX_TOKENS, temperature=0.0)
    # What ipykernel's do_complete asks (the experimental API Jupyter frontends use).
    with provisionalcompleter():
        completions = list(shell.Completer.completions(text, len(text)))
    offered = [text[: c.start] + c.text for c in completions if c.type == "starcoder"]
    if expected.text.strip():
        assert offered == [text + expected.text.rstrip()]
    else:
        assert offered == []


def test_a_hole_inside_a_line_completes_only_that_line(shell: InteractiveShell) -> None:
    completer = extension._active
    assert completer is not None
    middle = completer.middle("x = f(", ")\ny = 2\n")
    assert "\n" not in middle


def test_unload_removes_the_matcher(shell: InteractiveShell) -> None:
    matcher = extension._active.matcher
    assert matcher in shell.Completer.custom_matchers
    shell.run_cell("%unload_ext langchain_starcoder")
    assert matcher not in shell.Completer.custom_matchers and extension._active is None
    shell.run_cell("%load_ext langchain_starcoder")
