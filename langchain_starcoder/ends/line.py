"""What the end-of-middle rules know of one line of the middle, read once as it arrives.

A streaming caller asks about the unfinished last line at every piece of text; reading that line again
each time would cost its length per piece (a long line: quadratic). :class:`LineFacts` reads each piece
once, and keeps what the rules ask: where its code starts and how it begins, its first word, its
indentation, where its text ends, and how much of it repeats the suffix's first line.
"""

from __future__ import annotations

import re

_NOT_BLANK = re.compile(r"[^ \t\r\f]")
_NOT_SPACE = re.compile(r"\S")
_WORD_START = re.compile(r"[A-Za-z_]")
_WORD_REST = re.compile(r"\w*")
#: How much of a line's start is kept: more than a comment marker, ``default`` or a keyword.
_HEAD = 16
_TAB = 4


class LineFacts:
    """Facts about a line (without its newline) as it grows by :meth:`take`; offsets count from its start.

    ``start``: where the line starts in the text (moved by the caller when it drops text before it);
    ``read``: how many characters were taken; ``first``: the offset of the first character other than
    `` \\t\\r\\f`` (-1: none yet), ``head`` up to 16 characters from it; ``word_end``: where the word
    ``[A-Za-z_]\\w*`` at ``first`` ends (-1: none), ``after_word`` the character there; ``indent``: the
    width of the leading spaces and tabs; ``nonspace``: the first non-whitespace character (-1: none),
    ``space_head`` up to 16 characters from it; ``last``: just past the last non-whitespace character
    (what ``rstrip`` keeps); ``same``: how many first characters equal the suffix's line's.
    """

    __slots__ = (
        "after_word",
        "first",
        "head",
        "indent",
        "indenting",
        "last",
        "nonspace",
        "read",
        "same",
        "space_head",
        "start",
        "target",
        "word_end",
    )

    def __init__(self, start: int, target: str | None):
        self.start = start
        self.read = self.last = self.indent = self.same = 0
        self.first = self.nonspace = self.word_end = -1
        self.head = self.space_head = self.after_word = ""
        self.indenting = True  # still in the leading spaces and tabs
        self.target = target

    def take(self, chunk: str) -> LineFacts:
        """Read the line's next characters (``chunk`` holds no newline)."""
        if not chunk:
            return self
        at = self.read
        self.read = end = at + len(chunk)
        if self.indenting:
            self.indent, self.indenting = _widen(self.indent, chunk)
        if self.first < 0:
            found = _NOT_BLANK.search(chunk)
            if found is not None:
                k = found.start()
                self.first, self.head = at + k, chunk[k : k + _HEAD]
                if _WORD_START.match(chunk, k):
                    self.word_end = at + _WORD_REST.match(chunk, k + 1).end()
        else:
            if len(self.head) < _HEAD:
                self.head += chunk[: _HEAD - len(self.head)]
            if self.word_end == at:  # the word reached the end of what was read: it may go on
                self.word_end = at + _WORD_REST.match(chunk).end()
        if at <= self.word_end < end:
            self.after_word = chunk[self.word_end - at]
        if self.nonspace < 0:
            found = _NOT_SPACE.search(chunk)
            if found is not None:
                self.nonspace, self.space_head = (
                    at + found.start(),
                    chunk[found.start() : found.start() + _HEAD],
                )
        elif len(self.space_head) < _HEAD:
            self.space_head += chunk[: _HEAD - len(self.space_head)]
        kept = len(chunk.rstrip())
        if kept:
            self.last = at + kept
        if self.target is not None and self.same == at:  # it repeats the suffix's line so far
            self._repeat(chunk)
        return self

    def word(self) -> str:
        """The first word, or its first 16 characters (enough to tell a keyword); "" if none."""
        return "" if self.word_end < 0 else self.head[: self.word_end - self.first]

    def _repeat(self, chunk: str) -> None:
        target, j = self.target or "", self.same
        for char in chunk:
            if j == len(target) or char != target[j]:
                break
            j += 1
        self.same = j


def width(line: str) -> int:
    """The width of a line's indentation, tabs counted as four columns."""
    return _widen(0, line)[0]


def _widen(n: int, chars: str) -> tuple[int, bool]:
    """An indentation ``n`` columns wide, followed by ``chars``: how wide it is with the spaces and tabs
    that ``chars`` starts with, and whether ``chars`` holds nothing else (the indentation may go on)."""
    for char in chars:
        if char == " ":
            n += 1
        elif char == "\t":
            n += _TAB - n % _TAB
        else:
            return n, False
    return n, True
