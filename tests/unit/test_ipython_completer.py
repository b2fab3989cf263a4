"""``%load_ext langchain_starcoder`` in a real IPython shell: the completer offers the model's greedy
middle, with the cells the kernel ran (and what they printed, returned and raised) as notebook context."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ipykernel.inprocess.manager import InProcessKernelManager
from IPython.core.completer import provisionalcompleter
from IPython.core.interactiveshell import InteractiveShell

from langchain_starcoder import NotebookContext, StarCoderEngine
from langchain_starcoder.jupyter import ipython as extension
from langchain_starcoder.jupyter.kernel_history import MAX_HISTORY_CHARS, MAX_SOURCE_CHARS
from langchain_starcoder.notebook.cells import CUT_MARKER, MAX_OUTPUT_CHARS


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
    shell.run_cell("prices = [1.5, 2.0, 3.25]\nprint('loaded', len(prices))", store_history=True)
    shell.run_cell("sum(prices)", store_history=True)
    shell.run_cell("prices.mean()", store_history=True)  # raises AttributeError
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


# --- the extension changes nothing of a cell's behaviour -------------------------------------------


def test_cells_write_to_the_same_stdout_with_the_extension_loaded(shell: InteractiveShell) -> None:
    """What a cell finds as ``sys.stdout`` is the kernel's own stream (its encoding, buffer and file
    descriptor too), not a wrapper of ours."""
    before = sys.stdout
    result = shell.run_cell(
        "import subprocess, sys\n"
        "stream = sys.stdout\n"
        "sys.stdout.buffer.write(b'')\n"
        "encoding = sys.stdout.encoding.lower()\n"
        "subprocess.run(['true'], stdout=sys.stdout, check=True)\n",
        store_history=True,
    )
    assert result.error_in_exec is None, result.error_in_exec
    assert shell.user_ns["stream"] is before
    assert sys.stdout is before


def test_a_cell_that_runs_a_cell_leaves_stdout_as_it_was(shell: InteractiveShell) -> None:
    before = sys.stdout
    shell.run_cell("inner = get_ipython().run_cell('print(1)')", store_history=True)
    assert sys.stdout is before
    shell.run_cell("print('after')", store_history=True)
    assert sys.stdout is before
    # The inner cell is part of the outer one: its output is the outer's, and not the next cell's.
    assert [(c.source, c.output) for c in extension._active.cells] == [
        ("inner = get_ipython().run_cell('print(1)')", "1\n"),
        ("print('after')", "after\n"),
    ]


def test_a_result_is_formatted_once_by_ipython_and_a_failing_repr_stays_in_its_cell(
    shell: InteractiveShell,
) -> None:
    """The result's text is the displayhook's (no second ``repr`` of ours); a ``__repr__`` that raises
    is IPython's own error display, and ``run_cell`` returns as without the extension."""
    shell.run_cell(
        "calls = []\n\nclass Counted:\n    def __repr__(self):\n        calls.append(1)\n"
        "        return 'counted'\n\nCounted()",
        store_history=True,
    )
    assert shell.user_ns["calls"] == [1]
    assert extension._active.cells[-1].output == "counted"
    bad = "class Bad:\n    def __repr__(self):\n        raise ValueError('no repr')\n\nBad()"
    result = shell.run_cell(bad, store_history=True)
    assert result.error_in_exec is None
    assert extension._active.cells[-1].source == bad


def test_the_history_is_bounded_in_characters(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    completer, most = extension._active, MAX_OUTPUT_CHARS + len(CUT_MARKER)
    shell.run_cell("print('x' * 3_000_000)", store_history=True)
    shell.run_cell("list(range(2_000_000))", store_history=True)
    printed, listed = completer.cells[-2:]
    capsys.readouterr()  # (not in the test's report)
    assert len(printed.output) <= most and CUT_MARKER in printed.output
    assert printed.output.startswith("xxx") and printed.output.endswith("xxx\n")
    assert len(listed.output) <= most and listed.output.startswith("[0,\n 1,")
    for i in range(3 * MAX_HISTORY_CHARS // 5_000):
        shell.run_cell(f"n{i} = '{'y' * 5_000}'", store_history=True)
    assert completer.history.chars == sum(c.size for c in completer.cells) <= MAX_HISTORY_CHARS
    assert completer.cells[-1].source.startswith(f"n{i} = 'yyy")
    shell.run_cell("s = '" + "z" * 10 * MAX_SOURCE_CHARS + "'", store_history=True)
    assert len(completer.cells[-1].source) <= MAX_SOURCE_CHARS + len(CUT_MARKER)


# --- completions: bounded, reused, and never an error of ours ---------------------------------------


def model_calls(engine: StarCoderEngine, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The prefixes of the engine's FIM generations from now on (``infill`` streams too)."""
    calls: list[str] = []
    stream_infill = engine.stream_infill

    def counted(prefix, *args, **kwargs):
        calls.append(prefix)
        return stream_infill(prefix, *args, **kwargs)

    monkeypatch.setattr(engine, "stream_infill", counted)
    return calls


def tab(shell: InteractiveShell, text: str) -> list[str]:
    """What the frontend gets for a Tab at the end of ``text`` (ipykernel's do_complete)."""
    with provisionalcompleter():
        completions = list(shell.Completer.completions(text, len(text)))
    return [text[: c.start] + c.text for c in completions if c.type == "starcoder"]


def test_tabs_on_the_same_text_run_the_model_once(shell: InteractiveShell, monkeypatch) -> None:
    calls = model_calls(extension._active.engine, monkeypatch)
    offered = [tab(shell, "total = pri") for _ in range(5)]
    assert calls == ["total = pri"] and all(o == offered[0] for o in offered)
    tab(shell, "total = pric")  # another text: the model
    shell.run_cell("prices = [1]", store_history=True)
    tab(shell, "total = pric")  # the same text after a cell ran: another context, the model again
    assert calls == ["total = pri", "total = pric", "total = pric"]


def test_a_completion_stops_generating_after_its_seconds(shell: InteractiveShell) -> None:
    """``seconds=0``: the answer is what the first step generated, where the whole is longer."""
    extension.configure(seconds=600.0, shell=shell)  # the whole middle, however busy the machine
    completer = extension._active
    wholes = {p: completer.middle(p, "") for p in ("x = values", "def area(r", "for i in", "y = [")}
    prefix, whole = max(wholes.items(), key=lambda item: len(item[1]))
    extension.configure(seconds=0.0, shell=shell)
    cut = extension._active.middle(prefix, "")
    assert len(cut) < len(whole) and whole.startswith(cut)


def test_a_failing_model_offers_nothing_and_shows_nothing(
    shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def failing(*args, **kwargs):
        raise RuntimeError("the model failed")

    monkeypatch.setattr(extension._active.engine, "stream_infill", failing)
    capsys.readouterr()
    assert tab(shell, "total = pri") == []
    shown = capsys.readouterr()
    assert "the model failed" not in shown.out + shown.err
