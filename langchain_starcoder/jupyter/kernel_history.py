"""What an IPython kernel ran, as notebook cells: each cell's source and its outputs as text, read after
it ran from IPython's own records, bounded in characters.

Nothing here replaces ``sys.stdout`` or calls a result's ``repr``: since IPython 9 the shell records a
cell's outputs itself (``history_manager.outputs``, under the cell's execution count: what it printed,
the displayhook's formatted result, display data). With IPython 8 only results are recorded there
(``output_hist_reps``): what a cell printed is not in the history. A cell that an earlier cell runs
(``get_ipython().run_cell(...)``) is part of that cell, not a cell of its own.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..notebook.cells import CUT_MARKER, MAX_OUTPUT_CHARS, cut_output

#: The most cells kept (the prompt's budget keeps the nearest ones anyway).
MAX_HISTORY = 200
#: The most characters of all cells kept (sources and outputs): the oldest cells go first.
MAX_HISTORY_CHARS = 200_000
#: A cell's source longer than this keeps its start and end around the cut marker.
MAX_SOURCE_CHARS = 20_000
#: Cells running at once (a cell that runs a cell...) past which the oldest are forgotten.
MAX_OPEN = 64

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RanCell:
    """One cell the kernel ran."""

    source: str
    output: str = ""
    """Its outputs as one text (stream text, results, display data, the error), at most
    :data:`~langchain_starcoder.notebook.cells.MAX_OUTPUT_CHARS` characters."""

    @property
    def size(self) -> int:
        return len(self.source) + len(self.output)


class Clip:
    """The start and end of a text that arrives in pieces, in memory bounded by ``limit``: its
    :meth:`text` is what :func:`~langchain_starcoder.notebook.cells.cut_output` makes of the whole."""

    def __init__(self, limit: int = MAX_OUTPUT_CHARS) -> None:
        self.limit, self.size = limit, 0
        self._head = self._tail = ""

    def add(self, piece: str) -> None:
        if not piece:
            return
        if self.size + len(piece) <= self.limit:
            self._head += piece
        else:
            self._head += piece[: self.limit - len(self._head)]
            self._tail = (self._tail + piece[-self.limit :])[-self.limit :]
        self.size += len(piece)

    def ends_with_newline(self) -> bool:
        return (self._tail or self._head).endswith("\n")

    def text(self) -> str:
        if self.size <= self.limit:
            return self._head
        # Whole head and tail: cut_output keeps fewer than `limit` characters of each.
        return cut_output(self._head + self._tail, self.limit)


class KernelHistory:
    """Records the cells ``shell`` runs (its ``pre_run_cell`` and ``post_run_cell`` events). Nothing it
    does reaches a cell: an error of its own is logged at DEBUG and the cell is not recorded."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.cells: deque[RanCell] = deque()
        self.chars = 0
        #: Changes whenever a cell is recorded (completions of an older history are stale).
        self.version = 0
        #: The cells running now, outermost first: their info and where their outputs begin.
        self._open: list[tuple[Any, tuple[int, int, int]]] = []

    def pre_run_cell(self, info: Any) -> None:
        try:
            self._open.append((info, self._mark(info)))
            del self._open[:-MAX_OPEN]
        except Exception:
            log.debug("langchain-starcoder: pre_run_cell not recorded", exc_info=True)

    def post_run_cell(self, result: Any) -> None:
        try:
            self._record(result)
        except Exception:
            log.debug("langchain-starcoder: a cell was not recorded", exc_info=True)

    # --- recording --------------------------------------------------------------------------------

    def _mark(self, info: Any) -> tuple[int, int, int]:
        """The execution count the cell's outputs are recorded under (the shell counted it already
        when it stores history), how many outputs were there before it, and how many pieces the last
        of them had (IPython appends a cell's first print to the stream output before it)."""
        count = self.shell.execution_count - (1 if getattr(info, "store_history", False) else 0)
        before = self._records().get(count) or []
        last = before[-1] if before else None
        pieces = len(last.bundle.get("stream", [])) if last is not None and _is_stream(last) else 0
        return count, len(before), pieces

    def _record(self, result: Any) -> None:
        info = getattr(result, "info", None)
        index = next((i for i in reversed(range(len(self._open))) if self._open[i][0] is info), None)
        if index is None:
            if result is None and self._open:
                self._open.pop()  # the shell failed to run it: no result to match
            return  # an empty cell (IPython starts none)
        _, mark = self._open[index]
        del self._open[index:]
        if index > 0 or info is None:
            return  # run by the cell around it: its outputs are that cell's
        source = info.raw_cell or ""
        if all(line.lstrip().startswith(("%", "!")) for line in source.splitlines() if line.strip()):
            return  # empty, or only magics and shell escapes (%load_ext itself): not code
        self._keep(RanCell(cut_output(source, MAX_SOURCE_CHARS), self._output(result, mark)))

    def _keep(self, cell: RanCell) -> None:
        self.cells.append(cell)
        self.chars += cell.size
        while len(self.cells) > MAX_HISTORY or (self.chars > MAX_HISTORY_CHARS and len(self.cells) > 1):
            self.chars -= self.cells.popleft().size
        self.version += 1

    def _output(self, result: Any, mark: tuple[int, int, int]) -> str:
        clip = Clip()
        count, before, pieces = mark
        if hasattr(self.shell.history_manager, "outputs"):  # IPython 9: all it recorded
            if count == result.execution_count:
                for text in _texts(self._records().get(count) or [], before, pieces):
                    _add_output(clip, text)
        elif result.result is not None:  # IPython 8: only the displayhook's text
            reprs = getattr(self.shell.history_manager, "output_hist_reps", {})
            _add_output(clip, [reprs.get(result.execution_count, "")])
        error = result.error_in_exec or result.error_before_exec
        if error is not None:
            _add_output(clip, [f"{type(error).__name__}: {_safe_str(error)}".rstrip(": ")])
        return clip.text()

    def _records(self) -> dict[int, list[Any]]:
        return getattr(self.shell.history_manager, "outputs", None) or {}


def _texts(records: list[Any], before: int, pieces: int) -> Iterable[Iterable[str]]:
    """The text of each output the cell recorded: from the last one there before it (the pieces
    appended after ``pieces``) on."""
    start = max(before - 1, 0)
    for i, output in enumerate(records[start:], start):
        if i < before:  # the output before the cell: only what the cell appended to it
            if _is_stream(output):
                yield output.bundle["stream"][pieces:]
            continue
        if _is_stream(output):
            yield output.bundle.get("stream", [])
        elif isinstance(output.bundle, dict) and output.bundle:
            plain = output.bundle.get("text/plain")
            if isinstance(plain, str | list):
                yield [plain] if isinstance(plain, str) else plain
            else:
                yield [f"[{next(iter(output.bundle))} output]"]


def _add_output(clip: Clip, pieces: Iterable[Any]) -> None:
    """One output's pieces, on a line of its own."""
    first = True
    for piece in pieces:
        if not isinstance(piece, str) or not piece:
            continue
        if first and clip.size and not clip.ends_with_newline():
            clip.add("\n")
        first = False
        clip.add(piece)


def _is_stream(output: Any) -> bool:
    return getattr(output, "output_type", None) in ("out_stream", "err_stream") and isinstance(
        getattr(output, "bundle", None), dict
    )


def _safe_str(error: BaseException) -> str:
    try:
        return cut_output(str(error), MAX_OUTPUT_CHARS)
    except Exception:  # an exception whose __str__ raises
        return CUT_MARKER
