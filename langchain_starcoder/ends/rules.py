"""Where a fill-in-the-middle answer is complete: the rules, applied line by line as text arrives.

The hole's context is read once (the lexical state where the cursor's line starts, the code around the
cursor on its line, the suffix's first line); each call then reads only the lines that arrived since
the last one, so a streaming caller pays per line, never per file.
"""

from __future__ import annotations

import copy
import re

from ..errors import InvalidParameterError
from .languages import Syntax, syntax_for
from .line import LineFacts, width
from .scan import CODE, STRING, State, scanner_for

# How a FIM middle may end (FIMRequest.end): by the code's own shape, at a line, at a block, or not at all.
MODES = ("auto", "line", "block", "none")

# How the middle is being read: the cursor's line (a hole inside a line), a statement that goes on past
# it, the lines of a block, the cursor's line whatever it holds (mode="line"), a string or comment.
_LINE, _STATEMENT, _BLOCK, _LINE_ONLY, _INSIDE = range(5)
#: A line whose last code character is one of these goes on on the next line.
_CONTINUES = frozenset("+-*/%=&|^!?.:,\\~<")
_PY_CONTINUES_WORDS = frozenset({"and", "or", "not", "in", "is", "if", "else", "lambda", "await", "yield"})
_WORD_START = re.compile(r"[A-Za-z_]")
#: Leading ``.`` continues a statement in these languages (method chains on the next line).
_CHAINS = frozenset({"javascript", "typescript", "kotlin", "swift", "scala"})
_SUFFIX_SCAN = 65536


class MiddleEnd:
    """The end of a fill-in-the-middle answer, decided incrementally while it is generated.

    ``MiddleEnd(prefix, suffix, file_path=...)`` reads the hole once; ``feed(text)`` takes the middle
    generated so far and returns how many of its characters to keep once the middle is complete within
    it, else ``None``. Each call takes the whole middle so far, which extends the text of the last call
    (a text that does not is refused: :meth:`fresh` reads another middle). Call it as often as you like
    (at each newline, say): it reads only what it has not read yet. The rules:

    - A hole inside a line (code before or after the cursor on its line) ends at the end of that line
      once its statement is complete there; a statement that goes on (``if x:``, an open bracket, a
      trailing operator) ends before the next line back at the cursor line's indentation, unless that
      line continues it (``else``, ``except``, ``catch``...).
    - A middle that starts on an empty line ends before the first line that leaves the block it starts
      in: one indented less, or one that starts by closing a bracket opened before the middle.
    - It ends before a line that repeats the suffix's first non-blank line.
    - It never ends inside a string, comment or bracket it opened, nor after a line that continues
      (a trailing ``\\`` or operator). A hole inside a string or comment ends where the middle closes it.
    """

    __slots__ = (
        "_block_indent",
        "_comment_markers",
        "_cursor_indent",
        "_end",
        "_first_kind",
        "_inside_closer",
        "_kept",
        "_kind",
        "_last",
        "_line",
        "_line_prefix",
        "_line_state",
        "_pos",
        "_pos_eol",
        "_prev_tail",
        "_scanner",
        "_st",
        "_suffix_line",
        "_suffix_rest",
        "mode",
        "syntax",
    )

    def __init__(
        self,
        prefix: str,
        suffix: str,
        file_path: str | None = None,
        mode: str = "auto",
        *,
        language: str | None = None,
    ):
        if mode not in MODES:
            msg = f"mode must be one of {', '.join(map(repr, MODES))}, not {mode!r}"
            raise InvalidParameterError(msg)
        if not isinstance(prefix, str) or not isinstance(suffix, str):
            msg = "prefix and suffix must be strings (the text before and after the hole)"
            raise InvalidParameterError(msg)
        self.mode = mode
        self.syntax: Syntax = syntax_for(file_path, prefix[-6000:] + "\n" + suffix[:2000], language)
        self._scanner = scanner_for(self.syntax)
        block = self.syntax.block_comment
        self._comment_markers = (*self.syntax.line_comments, *((block[0],) if block else ()))
        line_start = prefix.rfind("\n") + 1
        st = State()
        self._scanner.scan(prefix, 0, line_start, st, brackets=False)  # where the cursor's line starts
        self._line_state = st.rebased()
        self._line_prefix = line_prefix = prefix[line_start:]
        self._cursor_indent = width(line_prefix)
        at_cursor = self._line_state.copy()
        self._scanner.scan(line_prefix, 0, len(line_prefix), at_cursor)
        newline = suffix.find("\n")
        self._suffix_rest = (suffix if newline < 0 else suffix[:newline]).rstrip("\r")
        self._suffix_line = _first_full_line(suffix, newline)
        self._inside_closer = ""
        if at_cursor.mode != CODE and mode != "none" and self._suffix_closes(at_cursor, suffix):
            self._inside_closer = at_cursor.closer
        if mode == "none":
            kind = None
        elif self._inside_closer:
            kind = _INSIDE
        elif mode == "line":
            kind = _LINE_ONLY
        elif mode == "block" or not (line_prefix.strip() or self._suffix_rest.strip()):
            kind = _BLOCK
        else:
            kind = _LINE
        self._first_kind = kind
        self._start(at_cursor)

    def _suffix_closes(self, at_cursor: State, suffix: str) -> bool:
        """Does the suffix close the string or comment the cursor is in? (It does when it holds one
        closer more than it opens: an odd number of quotes, more ``*/`` than ``/*``; a plain quote
        only on the cursor's line, where such strings end.)"""
        closer = at_cursor.closer
        if at_cursor.mode == STRING:
            spans_lines = at_cursor.multiline and (len(closer) > 1 or closer == "`")
            region = suffix[:_SUFFIX_SCAN] if spans_lines else self._suffix_rest
            count = region.count(closer) - (region.count("\\" + closer) if at_cursor.escapes else 0)
            return count % 2 == 1
        region = suffix[:_SUFFIX_SCAN]
        block = self.syntax.block_comment
        return region.count(closer) > (region.count(block[0]) if block else 0)

    def _start(self, at_cursor: State | None = None) -> None:
        if at_cursor is None:
            at_cursor = self._line_state.copy()
            self._scanner.scan(self._line_prefix, 0, len(self._line_prefix), at_cursor)
        self._kind = self._first_kind
        self._st = at_cursor.rebased() if self._kind == _BLOCK else at_cursor
        self._pos = 0  # where the first line not read yet starts
        self._pos_eol = -1  # where the line before it ends (before its newline and a "\r")
        self._last = ""  # the text of the last call to feed
        self._line = LineFacts(0, self._suffix_line)  # what is known of the line at ``_pos``
        self._end: int | None = None
        self._kept = 0
        self._prev_tail = ""
        # mode "block" with code before the cursor: the cursor line's block; else the middle's first line's
        self._block_indent = (
            self._cursor_indent if self.mode == "block" and self._line_prefix.strip() else None
        )

    def feed(self, text: str) -> int | None:
        """How many characters of ``text`` (the whole middle so far) to keep, once it is complete; else
        None. ``text`` must extend the text of the last call (InvalidParameterError, a ValueError, if not)."""
        if not isinstance(text, str):
            msg = f"feed takes the middle generated so far as a string, not {type(text).__name__}"
            raise InvalidParameterError(msg)
        if not text.startswith(self._last):
            msg = (
                f"feed takes the whole middle generated so far, not only its new lines: this text does "
                f"not start with the {len(self._last)} characters of the last call's (fresh() reads "
                "another middle)"
            )
            raise InvalidParameterError(msg)
        self._last = text
        return self._extend(text)

    def _extend(self, text: str) -> int | None:
        """:meth:`feed` for a caller that knows ``text`` extends the last one it passed (a stream's
        :class:`~langchain_starcoder.ends.MiddleGate`): without the check, which compares the whole
        text, a call costs only what arrived since the last one."""
        if self._first_kind is None:
            return None
        if self._end is None:
            self._end = self._read(text)
        return self._end

    def settled(self, text: str) -> int:
        """How many characters of ``text`` are kept whatever is generated after it, given that
        :meth:`feed` has read ``text`` up to its last newline: what a streaming caller may show."""
        return self._settled(text, None, len(text))

    def _settled(self, text: str, piece: str | None, size: int) -> int:
        """:meth:`settled`; with ``piece``, only the text that arrived since the last call (no newline
        in it; ``text`` is not read), for a stream (``size``: the text's length)."""
        if self._end is not None:
            return self._end
        if self._first_kind is None:
            return size
        if self._kind == _INSIDE:  # the closer may come on this line: lines before it are kept
            return max(0, self._pos_eol)
        s = self._pos
        line = self._facts(text, s, size) if piece is None else self._line.take(piece)
        if s == 0:  # the first line is kept whole, once it holds code
            return line.last
        return s + line.last if line.last and self._stays(line) else self._kept

    def _stays(self, line: LineFacts) -> bool:
        """Is the unfinished line (not blank) sure to be kept, whatever ends it? Only when no rule can
        still turn on its rest: it does not end the middle now, and it cannot yet repeat the suffix's
        line, be a comment (kept or not by its indentation), or be a brace language's label."""
        if self._kind == _LINE_ONLY:
            return True
        if self._ends_before(line, partial=True) is not False:
            return False
        st = self._st
        if st.mode != CODE or st.depth > 0:
            return True  # inside a string or brackets: nothing ends it
        if self._suffix_line is not None and line.last <= line.same:  # the suffix's line so far
            return False
        if line.space_head.startswith(self._comment_markers):
            return False
        label_possible = not self.syntax.indent_blocks and self._block_indent is not None
        return not (self._kind == _BLOCK and label_possible and line.indent < self._block_indent)

    def _facts(self, text: str, s: int, e: int) -> LineFacts:
        """What is known of the line at ``s``, read up to ``e`` (only what was not read before)."""
        line = self._line
        if line.start != s or e - s < line.read:  # another line (or a shorter text): read it afresh
            line = self._line = LineFacts(s, self._suffix_line)
        return line.take(text[s + line.read : e])

    def _forget(self) -> int:
        """For a stream that passes only the text from the line not read yet on (less the two
        characters before it, which ``end_of_line`` reads): how many characters the caller may drop
        from the front of the text; the positions kept here move back as many."""
        by = self._pos - 2
        if by <= 0 or self._end is not None:
            return 0
        self._pos -= by
        self._pos_eol -= by
        self._kept -= by
        self._line.start -= by
        self._st.literal_end -= by  # (compared with places in the text only: all move together)
        return by

    def fresh(self) -> MiddleEnd:
        """A copy that has read nothing of the middle (the hole is not read again): one per generation."""
        other = copy.copy(self)
        other._start()
        return other

    # --- reading lines ---------------------------------------------------------------------------

    def _read(self, text: str) -> int | None:
        while True:
            s = self._pos
            newline = text.find("\n", s)
            partial = newline < 0
            e = len(text) if partial else newline
            if self._kind == _INSIDE:
                at = self._scanner.find_close(text, s, e if partial else e + 1, self._st)
                if at >= 0:
                    return self._inside_end(text, at)
                if partial:
                    return None
                self._pos, self._pos_eol = e + 1, end_of_line(text, e)
                continue
            if (
                s > 0
                and self._kind != _LINE_ONLY
                and self._ends_before(self._facts(text, s, e), partial=partial)
            ):
                return self._kept
            if partial:
                return None
            mode_before = self._st.mode
            sig = self._scanner.scan(text, s, e + 1, self._st)
            line_end = end_of_line(text, e)
            if self._kind in (_LINE, _LINE_ONLY):
                end = self._line_end(text, s, line_end)
                if end is not None:
                    return end
            self._keep(text, s, line_end, sig, mode_before)
            if sig > s:  # a literal (a string, a regular expression ending in ``/``) continues nothing
                self._prev_tail = "" if sig == self._st.literal_end else text[max(s, sig - 8) : sig]
            self._pos, self._pos_eol = e + 1, line_end

    def _line_end(self, text: str, s: int, line_end: int) -> int | None:
        """At the end of the cursor's line (mode "line": of any line): is the middle complete here?"""
        if self._kind == _LINE_ONLY:
            return line_end if self._st.mode == CODE and self._st.depth <= 0 else None
        middle = text[s:line_end]
        if middle.strip():
            if self._complete(self._line_prefix + middle + self._suffix_rest):
                return line_end
        elif self._complete(self._line_prefix + self._suffix_rest):
            self._kind = _BLOCK  # nothing written on the cursor's line: a block starts on the next
            self._st = self._st.rebased()
            return None
        self._kind = _STATEMENT
        return None

    def _keep(self, text: str, s: int, line_end: int, sig: int, mode_before: int) -> None:
        """Move the end kept so far past this line, unless it is blank or a comment that may belong to
        the code after the middle (a comment indented out of the block)."""
        line = text[s:line_end]
        if not line.strip():
            return
        if s == 0:
            self._kept = line_end
            if self._kind == _BLOCK and self._block_indent is None:
                self._block_indent = width(self._line_prefix + line)
            return
        if mode_before == CODE and sig < 0:  # a comment line
            limit = self._block_indent if self._kind == _BLOCK else self._cursor_indent + 1
            if limit is not None and width(line) < limit:
                return
        elif self._kind == _BLOCK and self._block_indent is None and mode_before == CODE:
            self._block_indent = width(line)
        self._kept = line_end

    def _ends_before(self, line: LineFacts, *, partial: bool) -> bool | None:
        """Does the middle end before this line? (None: not known from a partial line.)"""
        st = self._st
        if st.mode != CODE or st.depth > 0:
            return False
        if st.depth < 0:
            return True  # the middle closed a bracket opened before it, on an earlier line
        if line.first < 0:
            return None if partial else False
        head = line.head  # the line from its first character on (its first 16)
        if head[0] in ")]}":
            return True
        if _continues(self._prev_tail):
            return False
        syntax = self.syntax
        markers = self._comment_markers
        rest = line.read - line.first
        if partial and any(len(marker) >= rest and marker.startswith(head) for marker in markers):
            return None  # it may still become a comment
        suffix_line = self._suffix_line
        if not partial and suffix_line is not None and line.last == len(suffix_line) == line.same:
            return True  # it repeats the suffix's first line
        if head.startswith(markers) or (syntax.preprocessor and head[0] == "#"):
            return False
        unfinished_word = partial and line.word_end == line.read
        if self._kind == _BLOCK:
            if self._block_indent is None or line.indent >= self._block_indent:
                return False
            if syntax.indent_blocks:
                return True
            if unfinished_word:
                return None  # it may be a label
            label = line.after_word == ":" and line.last == line.word_end + 1
            return not (label and not head.startswith("default"))
        # a statement begun on the cursor's line: it ends at a line back at the cursor's indentation
        if line.indent > self._cursor_indent:
            return False
        if unfinished_word:
            return None  # the first word may still grow into ``else``
        return line.word_end < 0 or line.word() not in syntax.continue_words

    def _complete(self, line: str) -> bool:
        """Is the statement of this whole line (from the cursor line's start) complete at its end?"""
        st = self._line_state.copy()
        sig = self._scanner.scan(line, 0, len(line), st)
        if st.mode != CODE or st.depth > 0:
            return False
        if sig < 0:
            return True  # blank or a comment
        tail = line[:sig]
        syntax = self.syntax
        if sig != st.literal_end and _continues(tail[-8:]):
            return False
        if syntax.indent_blocks:
            return _trailing_word(tail) not in _PY_CONTINUES_WORDS
        if syntax.needs_semicolon and tail[-1] not in ";}":
            start = tail.lstrip()
            return start.startswith("@") or (syntax.preprocessor and start.startswith("#"))
        return True

    def _inside_end(self, text: str, at: int) -> int:
        """The end of a middle written inside a string or comment, whose closer starts at ``at``: a
        closer on a line of its own goes with that line (the suffix has both)."""
        line_start = text.rfind("\n", 0, at) + 1
        if line_start > 0 and not text[line_start:at].strip() and not self._suffix_rest.strip():
            return end_of_line(text, line_start - 1)
        return at


def end_of_line(text: str, newline: int) -> int:
    """Where the line whose newline is at ``newline`` ends: before a ``\\r`` that precedes it."""
    return newline - 1 if newline > 0 and text[newline - 1] == "\r" else newline


def _continues(tail: str) -> bool:
    """Does a line whose code ends with ``tail`` (its last characters) go on on the next line?"""
    if not tail:
        return False
    if tail.endswith(("=>", "->")):
        return True
    return tail[-1] in _CONTINUES and not tail.endswith(("++", "--", "...", "import *"))


def _trailing_word(tail: str) -> str | None:
    """The word (``[A-Za-z_]\\w*``) that ``tail`` ends with, as ``re.search(r"[A-Za-z_]\\w*$", tail)``
    finds it, read backwards from the end: such a search tries every start of a long run of word
    characters and reads the run's rest from each (quadratic), where this reads the run once."""
    end = len(tail) - 1 if tail.endswith("\n") else len(tail)  # ``$`` also matches before a last newline
    start = end
    while start > 0 and (tail[start - 1].isalnum() or tail[start - 1] == "_"):
        start -= 1
    word = _WORD_START.search(tail, start, end)
    return None if word is None else tail[word.start() : end]


def _first_full_line(suffix: str, newline: int) -> str | None:
    """The suffix's first non-blank line after the cursor's own, without trailing whitespace."""
    while newline >= 0:
        start = newline + 1
        newline = suffix.find("\n", start)
        line = suffix[start : len(suffix) if newline < 0 else newline].rstrip()
        if line:
            return line
    return None


def middle_end(
    prefix: str, suffix: str, text: str, *, file_path: str | None = None, mode: str = "auto"
) -> int | None:
    """How many characters of ``text`` (a middle generated for the hole between ``prefix`` and
    ``suffix``) to keep when the middle is complete within it, else None. See :class:`MiddleEnd`.

    ``mode``: "auto" (the rules), "line" (the cursor's line only), "block" (the cursor's block),
    "none" (never ends). The language comes from ``file_path``'s ending, else from the code.
    """
    return MiddleEnd(prefix, suffix, file_path, mode).feed(text)
