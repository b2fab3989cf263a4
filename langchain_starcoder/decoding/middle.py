"""A FIM middle as it streams: ended where the code ends (the rules of :mod:`langchain_starcoder.ends`),
and shown only as far as it is sure to be kept. A :class:`~.filter.Filter`."""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from ..ends.rules import MiddleEnd

_NOT_INDENT = re.compile(r"[^ \t]")

#: Why a gate ended its middle (``Completion.middle_end``).
SYNTAX, INDENT = "syntax", "indent"


class MiddleGate:
    """Ends a fill-in-the-middle answer while it is generated, and holds back what may be cut.

    ``feed(piece)`` takes the next text of the middle and returns the part that is safe to show;
    once :attr:`ended` is set, the generation can stop. The rules are checked at each newline (and
    by :meth:`finish` at the end): the syntax-aware end of :class:`MiddleEnd`, and with
    ``min_indent`` a line after the first indented by fewer spaces or tabs (llama.cpp's
    ``n_indent``). Text past the end is never released: the cursor's first line as it comes (it is
    always kept), a later line as it comes once :meth:`MiddleEnd.settled` says it stays, else at its end.

    A piece costs its own length, however long the middle or its line: the middle is never copied
    whole (the rules get the lines from the one not read yet on, joined once a newline comes).
    """

    __slots__ = (
        "_base",
        "_end",
        "_last_char",
        "_line",
        "_line_eol",
        "_min_indent",
        "_out",
        "_out_at",
        "_safe",
        "_shown",
        "_size",
        "_tail",
        "_window",
        "cut",
        "ended",
    )

    def __init__(self, end: MiddleEnd | None, min_indent: int = 0):
        self._end = None if end is None or end.mode == "none" else end  # "none" never ends nor holds
        self._min_indent = min_indent
        self._size = 0  # the length of the middle so far
        self._shown = self._safe = 0  # released so far; what the rules say may be
        self._out: deque[str] = deque()  # the pieces not released yet (the first from ``_out_at`` on)
        self._out_at = 0
        self._window = ""  # the middle from ``_base`` on, as the rules read it
        self._base = 0
        self._tail: list[str] = []  # the pieces after the window, joined to it at a newline
        self._line = -1  # the start of a line whose indentation is not known yet (-1: none)
        self._line_eol = -1  # where the line before it ends
        self._last_char = ""
        self.cut: int | None = None
        self.ended: str | None = None
        """Why the middle ended: :data:`SYNTAX` or :data:`INDENT`; None while it goes on."""

    def feed(self, piece: str) -> str:
        if self.ended is not None or not piece:
            return ""
        at = self._size
        self._size += len(piece)
        self._out.append(piece)
        if self._min_indent:
            self._check_indent(piece, at)
        end = self._end
        if end is not None and self.ended is None:
            self._tail.append(piece)
            if "\n" in piece:  # the rules read whole lines: join the new ones to the window
                window = self._window = self._window + "".join(self._tail)
                self._tail = []
                found = end._extend(window)
                if found is not None:
                    self._end_at(self._base + found, SYNTAX)
                else:
                    self._safe = self._base + end.settled(window)
                    dropped = end._forget()  # the lines read are never read again
                    self._window, self._base = window[dropped:], self._base + dropped
            else:
                self._safe = self._base + end._settled("", piece, self._size - self._base)
        return self._release(final=False)

    def finish(self, *, cut: bool = True) -> str:
        """The rest of the middle that is kept, once nothing more is generated. ``cut``: the generation
        was stopped before the model ended it (max_tokens, a time limit, a cancel), so its last line may
        be unfinished and only an end the rules find before that line counts: an answer cut there is a
        cut middle, not a whole one. False when the model ended it (an end-of-text token, a stop
        string): its last line is whole, and an end at its end or decided by it counts too."""
        end = self._end
        if end is not None and self.ended is None:
            window = self._window + "".join(self._tail) + ("" if cut else "\n")
            found = end._extend(window)
            if found is not None:
                self._end_at(self._base + found, SYNTAX)
        return self._release(final=True)

    def settle(self, reason: str, last: dict[str, Any]) -> str:
        """A middle that ended (also found only by :meth:`finish`, at ``max_tokens``) is whole: "stop"."""
        last["middle_end"] = self.ended
        return "stop" if self.ended else reason

    def _end_at(self, end: int, why: str) -> None:
        if self.cut is None or end < self.cut:
            self.cut, self.ended = min(end, self._size), why

    def _check_indent(self, piece: str, at: int) -> None:
        """End before the first line after the first whose indentation is below ``min_indent``
        (``piece`` starts at ``at`` in the middle; a line's indentation may span pieces)."""
        pos = 0
        while True:
            if self._line < 0:  # inside a line already passed: find where the next one starts
                newline = piece.find("\n", pos)
                if newline < 0:
                    break
                before = piece[newline - 1] if newline else self._last_char
                self._line, self._line_eol = at + newline + 1, at + newline - (before == "\r")
                pos = newline + 1
            found = _NOT_INDENT.search(piece, pos)
            if found is None:
                break  # its indentation is not known yet
            if found.group() not in "\r\n" and at + found.start() - self._line < self._min_indent:
                self._end_at(self._line_eol, INDENT)
                return
            self._line, pos = -1, found.start()
        self._last_char = piece[-1]

    def _release(self, *, final: bool) -> str:
        if self.cut is not None:
            safe = self.cut
        elif final or self._end is None:
            safe = self._size
        else:
            safe = self._safe
        if not final and self.cut is None and self._line >= 0:
            safe = min(safe, self._line_eol)  # a line whose indentation is not known yet may end it
        if safe <= self._shown:
            return ""
        return self._take(safe - self._shown)

    def _take(self, n: int) -> str:
        """The next ``n`` characters not released yet, released."""
        self._shown += n
        parts = []
        while n:
            piece, at = self._out[0], self._out_at
            if len(piece) - at <= n:
                parts.append(piece[at:] if at else piece)
                n -= len(piece) - at
                self._out.popleft()
                self._out_at = 0
            else:
                parts.append(piece[at : at + n])
                self._out_at, n = at + n, 0
        return "".join(parts)
