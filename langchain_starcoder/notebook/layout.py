"""The notebook's part of a FIM prompt within a token budget: which cells, and how much of each output.

The hole's cell goes first (the FIM builder fits its prefix and suffix), then its saved output, then
the nearest earlier cells, then later ones. A cell goes in whole or not at all, and cells stay
contiguous around the hole; when the budget runs short, outputs are cut (to their start and end, or
to ``[...]``) before any cell's code is left out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .cells import CUT_MARKER, NotebookCell, NotebookContext, cut_output

#: The control tokens of StarCoder2's (and StarCoder's) structured notebooks.
NOTEBOOK_TOKENS = (
    "<jupyter_start>",
    "<jupyter_text>",
    "<jupyter_code>",
    "<jupyter_output>",
    "<empty_output>",
)

#: ("control", token) or ("data", (text, ids)): the FIM builder's parts.
Part = tuple[str, Any]

# A token stands for well under this many characters of code: a longer text surely overflows.
_CHARS_PER_TOKEN = 16


@dataclass
class NotebookParts:
    """What of the notebook goes around the hole's cell, and what it costs."""

    before: list[Part] = field(default_factory=list)
    """After ``<jupyter_start>``, before the hole cell's ``<jupyter_code>``: earlier cells."""
    after: list[Part] = field(default_factory=list)
    """After the hole's suffix: the cell's saved output, then later cells."""
    tokens: int = 0
    """How many tokens ``before`` and ``after`` hold."""
    cells_before: int = 0
    """How many earlier cells went in."""
    cells_after: int = 0
    """How many later cells went in."""


@dataclass
class _Cell:
    cell: NotebookCell
    source: list[int]
    output: list[Part] = field(default_factory=list)

    def parts(self) -> list[Part]:
        if self.cell.kind == "markdown":
            return [("control", "<jupyter_text>"), *_data(self.cell.source, self.source)]
        return [("control", "<jupyter_code>"), *_data(self.cell.source, self.source), *self.output]


def notebook_parts(
    ctx: NotebookContext, encode: Callable[[str], list[int]], budget: int | None
) -> NotebookParts:
    """The parts of ``ctx`` around its hole cell in at most ``budget`` tokens (None: all of it)."""
    fit = _Fitter(encode, budget)
    out = NotebookParts()
    hole_output = fit.output(ctx.hole_output)
    if hole_output is None:  # not even ``<jupyter_output><empty_output>`` fits
        return out
    earlier = fit.cells(ctx.cells[ctx.cell - 1 :: -1] if ctx.cell else ())
    later = fit.cells(ctx.cells[ctx.cell + 1 :])
    out.before = [part for cell in reversed(earlier) for part in cell.parts()]
    out.after = hole_output + [part for cell in later for part in cell.parts()]
    out.cells_before, out.cells_after = len(earlier), len(later)
    out.tokens = fit.used
    return out


class _Fitter:
    """Spends one budget: cells nearest first, each with a stub output, then the outputs."""

    def __init__(self, encode: Callable[[str], list[int]], budget: int | None) -> None:
        self.encode, self.budget, self.used = encode, budget, 0
        self._marker_ids = encode(CUT_MARKER)
        self._marker = len(self._marker_ids)

    @property
    def left(self) -> int | None:
        return None if self.budget is None else self.budget - self.used

    def take(self, tokens: int) -> bool:
        if self.left is not None and tokens > self.left:
            return False
        self.used += tokens
        return True

    def ids_within(self, text: str, limit: int | None) -> list[int] | None:
        """``text``'s ids if at most ``limit`` of them (a long text is not encoded whole to learn it)."""
        ids = self._encode_short(text, limit)
        return ids if ids is not None and (limit is None or len(ids) <= limit) else None

    def _encode_short(self, text: str, limit: int | None) -> list[int] | None:
        """``text``'s ids, or None when it is surely longer than ``limit`` tokens."""
        if limit is not None and len(text) > _CHARS_PER_TOKEN * (limit + 4):
            return None
        return self.encode(text) if text else []

    def output(self, text: str) -> list[Part] | None:
        """``<jupyter_output>`` and ``text`` (``<empty_output>`` when empty), cut to fit, its tokens
        taken; None if not even ``[...]`` fits."""
        if not text:
            return [("control", "<jupyter_output>"), ("control", "<empty_output>")] if self.take(2) else None
        left = self.left
        room = None if left is None else left - 1  # its <jupyter_output>
        shown = text
        for _ in range(4):  # a cut sized from the last try's tokens per character fits in one or two
            if room is not None and room <= self._marker:
                break
            ids = self._encode_short(shown, room)
            if ids is not None and (room is None or len(ids) <= room):
                self.take(1 + len(ids))
                return [("control", "<jupyter_output>"), ("data", (shown, ids))]
            assert room is not None
            chars = min(len(shown), _CHARS_PER_TOKEN * room)
            if ids:
                chars = min(chars, len(shown) * (room - self._marker) // len(ids) * 9 // 10)
            shown = cut_output(text, chars)
        if not self.take(1 + self._marker):
            return None
        return [("control", "<jupyter_output>"), ("data", (CUT_MARKER, self._marker_ids))]

    def cells(self, cells: Sequence[NotebookCell]) -> list[_Cell]:
        """The leading run of ``cells`` that fits, each code cell with its output cut to fit."""
        kept: list[_Cell] = []
        for cell in cells:  # first their text, each output a stub (outputs are cut before code)
            stub = 0 if cell.kind == "markdown" else 2 if not cell.output else 1 + self._marker
            left = self.left
            ids = self.ids_within(cell.source, None if left is None else left - 1 - stub)
            if ids is None or not self.take(1 + len(ids) + stub):
                break
            kept.append(_Cell(cell, ids))
        for item in kept:  # then the outputs, nearest first, each as whole as the budget allows
            if item.cell.kind != "code":
                continue
            stub = 2 if not item.cell.output else 1 + self._marker
            self.used -= stub
            output = self.output(item.cell.output)
            assert output is not None  # its stub was reserved
            item.output = output
        return kept


def _data(text: str, ids: list[int]) -> list[Part]:
    return [("data", (text, ids))] if ids else []
