"""A middle as it streams: ended where the code ends, and shown only as far as it is sure to be kept."""

from __future__ import annotations

from .rules import MiddleEnd, end_of_line

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
    """

    __slots__ = ("_end", "_line", "_min_indent", "_scan", "_shown", "_text", "cut", "ended")

    def __init__(self, end: MiddleEnd | None, min_indent: int = 0):
        self._end = end
        self._min_indent = min_indent
        self._text = ""
        self._shown = 0
        self._line = -1  # the start of a line whose indentation is not known yet (-1: none)
        self._scan = 0  # where to look for the next newline when ``_line`` is -1
        self.cut: int | None = None
        self.ended: str | None = None
        """Why the middle ended: :data:`SYNTAX` or :data:`INDENT`; None while it goes on."""

    def feed(self, piece: str) -> str:
        if self.ended is not None or not piece:
            return ""
        self._text += piece
        if self._min_indent:
            self._check_indent()
        if self._end is not None and self.ended is None and "\n" in piece:
            self._end_at(self._end.feed(self._text), SYNTAX)
        return self._release(final=False)

    def finish(self) -> str:
        """The rest of the middle that is kept, once nothing more is generated."""
        if self._end is not None and self.ended is None:  # the last line is whole now
            self._end_at(self._end.feed(self._text + "\n"), SYNTAX)
        return self._release(final=True)

    def _end_at(self, end: int | None, why: str) -> None:
        if end is not None and (self.cut is None or end < self.cut):
            self.cut, self.ended = min(end, len(self._text)), why

    def _check_indent(self) -> None:
        """End before the first line after the first whose indentation is below ``min_indent``."""
        text, line = self._text, self._line
        while True:
            if line < 0:  # inside a line already passed: find where the next one starts
                newline = text.find("\n", self._scan)
                if newline < 0:
                    self._scan = len(text)
                    return
                line = newline + 1
            first = line
            while first < len(text) and text[first] in " \t":
                first += 1
            if first == len(text):
                self._line = line  # its indentation is not known yet
                return
            if text[first] not in "\r\n" and first - line < self._min_indent:
                self._end_at(end_of_line(text, line - 1), INDENT)
                return
            self._scan, line, self._line = first, -1, -1

    def _release(self, *, final: bool) -> str:
        text = self._text
        if self.cut is not None:
            safe = self.cut
        elif final:
            safe = len(text)
        else:
            safe = self._end.settled(text) if self._end is not None else len(text)
            if self._line >= 0:  # a line whose indentation is not known yet may still end the middle
                safe = min(safe, end_of_line(text, self._line - 1))
        out = text[self._shown : safe] if safe > self._shown else ""
        self._shown = max(self._shown, safe)
        return out
