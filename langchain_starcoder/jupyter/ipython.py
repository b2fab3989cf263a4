"""``%load_ext langchain_starcoder``: the model's completion of the cursor's line or block in IPython's
completer, for every frontend that asks the kernel (classic Notebook, VS Code notebooks, IPython in a
terminal), with the cells the kernel ran and their outputs as notebook context.

The kernel knows what ran, not the notebook file: each executed cell, its result (``Out``), what it
printed and the error it raised are recorded after it runs, and become the cells before the hole.
"""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass, field
from typing import Any

from ..notebook import NotebookContext

#: The most cells of history kept (the prompt's budget keeps the nearest ones anyway).
MAX_HISTORY = 200
#: Tokens of one completion (a line or a short block).
MAX_TOKENS = 48


@dataclass
class _Cell:
    source: str
    outputs: list[dict[str, Any]] = field(default_factory=list)


class _Tee(io.TextIOBase):
    """Writes through to the stream it wraps and keeps a copy (what a cell printed)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.parts = stream, []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


class StarCoderCompleter:
    """Records the kernel's cells and answers IPython's completer (matcher API v2) with a middle.

    Setup:
        .. code-block:: python

            %load_ext langchain_starcoder

    The model is ``$LANGCHAIN_STARCODER_MODEL``, else the package's default (a small offline
    stand-in when the hub cannot be reached); ``configure(model=..., max_tokens=...)`` changes it.
    """

    def __init__(self, shell: Any, engine: Any, max_tokens: int = MAX_TOKENS) -> None:
        from IPython.core.completer import context_matcher

        self.shell, self.engine, self.max_tokens = shell, engine, max_tokens
        self.cells: list[_Cell] = []
        self._out = self._err = None
        self.matcher = context_matcher()(
            lambda context: self.complete(context)
        )  # a function: it gets attributes

    # --- recording what ran ------------------------------------------------------------------------

    def pre_run_cell(self, info: Any) -> None:
        self._out, self._err = _Tee(sys.stdout), _Tee(sys.stderr)
        self._redirect = contextlib.ExitStack()
        self._redirect.enter_context(contextlib.redirect_stdout(self._out))
        self._redirect.enter_context(contextlib.redirect_stderr(self._err))

    def post_run_cell(self, result: Any) -> None:
        printed = ""
        if self._out is not None:
            self._redirect.close()
            printed = "".join(self._out.parts + self._err.parts)
            self._out = self._err = None
        source = result.info.raw_cell if result.info is not None else ""
        if all(line.lstrip().startswith(("%", "!")) for line in source.splitlines() if line.strip()):
            return  # empty, or only magics and shell escapes (%load_ext itself): not code
        outputs: list[dict[str, Any]] = []
        if printed:
            outputs.append({"output_type": "stream", "name": "stdout", "text": printed})
        if result.result is not None:
            outputs.append({"output_type": "execute_result", "data": {"text/plain": repr(result.result)}})
        error = result.error_in_exec or result.error_before_exec
        if error is not None:
            outputs.append({"output_type": "error", "ename": type(error).__name__, "evalue": str(error)})
        self.cells.append(_Cell(source, outputs))
        del self.cells[:-MAX_HISTORY]

    # --- completing ---------------------------------------------------------------------------------

    def context(self, prefix: str, suffix: str) -> NotebookContext:
        """The kernel's history as a notebook whose last cell holds the hole."""
        cells = [_code_cell(c.source, c.outputs) for c in self.cells]
        notebook = {
            "nbformat": 4,
            "nbformat_minor": 5,
            "metadata": {},
            "cells": [*cells, _code_cell(prefix + suffix)],
        }
        return NotebookContext.from_notebook(notebook, len(cells))

    def middle(self, prefix: str, suffix: str) -> str:
        """The model's greedy middle, ended where the code says it is complete (``end="auto"``): the
        cursor's block, or only the rest of its line when code follows the cursor there (a menu item
        that spans lines would replace the code after the cursor)."""
        inside_a_line = suffix.split("\n", 1)[0].strip()
        completion = self.engine.infill(
            prefix,
            suffix,
            notebook=self.context(prefix, suffix),
            max_tokens=self.max_tokens,
            temperature=0.0,
            stop=["\n"] if inside_a_line else (),
        )
        return completion.text.rstrip()

    def complete(self, context: Any) -> dict[str, Any]:
        from IPython.core.completer import SimpleCompletion

        lines = context.full_text.split("\n")
        before = "\n".join([*lines[: context.cursor_line], context.text_until_cursor])
        after = context.full_text[len(before) :]
        middle = self.middle(before, after)
        if not middle.strip():
            return {"completions": [], "suppress": False}
        # IPython replaces the token before the cursor with the completion's text.
        return {
            "completions": [SimpleCompletion(context.token + middle, type="starcoder")],
            "suppress": False,
        }


def _code_cell(source: str, outputs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "cell_type": "code",
        "source": source,
        "metadata": {},
        "outputs": outputs or [],
        "execution_count": None,
    }


_active: StarCoderCompleter | None = None


def load_ipython_extension(shell: Any) -> None:
    """``%load_ext langchain_starcoder``: load the model (once) and add the completer."""
    configure(shell=shell)


def unload_ipython_extension(shell: Any) -> None:
    global _active
    if _active is None:
        return
    shell.events.unregister("pre_run_cell", _active.pre_run_cell)
    shell.events.unregister("post_run_cell", _active.post_run_cell)
    shell.Completer.custom_matchers.remove(_active.matcher)
    _active = None


def configure(
    model: str | None = None, *, max_tokens: int = MAX_TOKENS, shell: Any = None, **load: Any
) -> None:
    """Use ``model`` (a folder, a hub id; default ``$LANGCHAIN_STARCODER_MODEL`` or the package's
    default) with ``load`` settings (``backend="llama.cpp"``, ``base_url=...``) for completions."""
    global _active
    from ..registry import get_engine
    from ..testing import model_or_offline

    shell = shell or _shell()
    if _active is not None:
        unload_ipython_extension(shell)
    engine = get_engine(model_or_offline(model), **load)
    _active = StarCoderCompleter(shell, engine, max_tokens)
    shell.events.register("pre_run_cell", _active.pre_run_cell)
    shell.events.register("post_run_cell", _active.post_run_cell)
    shell.Completer.custom_matchers.append(_active.matcher)


def _shell() -> Any:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        msg = "configure() runs inside IPython or Jupyter (after %load_ext langchain_starcoder)."
        raise RuntimeError(msg)
    return shell
