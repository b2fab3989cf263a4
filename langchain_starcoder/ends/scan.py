"""A lexical scanner that knows, line by line, whether code is inside a string, a comment or brackets.

It reads only what the end-of-middle rules need (string and comment delimiters, brackets), with one
compiled regular expression per language, so that a line costs a few regex searches. It is resumable:
the :class:`State` after one line is where the next line starts.
"""

from __future__ import annotations

import functools
import re

from .languages import Syntax

CODE, STRING, COMMENT = 0, 1, 2
_SPACE = " \t\r\n\f\v"
#: After these, a ``/`` starts a regular expression literal rather than a division (JavaScript).
_REGEX_AFTER_CHAR = frozenset("(,=:[!&|?{};+-*%<>~^")
_REGEX_AFTER_WORD = frozenset(
    {
        "return",
        "typeof",
        "case",
        "do",
        "else",
        "in",
        "of",
        "new",
        "delete",
        "void",
        "throw",
        "yield",
        "await",
        "instanceof",
    }
)
#: What decides where a regular expression literal's body goes (a ``/`` closes it outside a class ``[...]``).
_LITERAL_STOPS = re.compile(r"[/\[\]\\\n]")
_FLAGS = re.compile(r"[A-Za-z]*")
_WORD_START = re.compile(r"[A-Za-z_$]")
#: A one-character literal (``'a'``, ``'\n'``, ``'\u{1F600}'``); a ``'`` that starts none is a lifetime.
_CHAR_LITERAL = re.compile(r"'(?:\\(?:u\{[0-9a-fA-F]{1,6}\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'")


class State:
    """Where a scan stands: in code, in a string or in a comment, and the bracket depth.

    ``depth`` counts brackets opened minus closed since the scan's start (it may go below zero).
    ``templates`` holds the depths at which JavaScript template interpolations ``${`` opened.
    """

    __slots__ = (
        "closer",
        "comment_depth",
        "depth",
        "escapes",
        "literal_end",
        "mode",
        "multiline",
        "templates",
    )

    def __init__(self) -> None:
        self.mode = CODE
        self.closer = ""
        self.escapes = True
        self.multiline = False
        self.depth = 0
        self.comment_depth = 0
        self.templates: list[int] = []
        self.literal_end = -1  # where the last string, character or regular expression literal ended

    def copy(self) -> State:
        other = State.__new__(State)
        other.mode, other.closer, other.escapes = self.mode, self.closer, self.escapes
        other.multiline, other.depth, other.comment_depth = self.multiline, self.depth, self.comment_depth
        other.templates = list(self.templates)
        other.literal_end = self.literal_end
        return other

    def rebased(self) -> State:
        """The same place, with brackets counted from here (depth 0)."""
        other = self.copy()
        other.templates = [t - self.depth for t in self.templates]
        other.depth = 0
        return other


class Scanner:
    """Scans text of one language (see :func:`scanner_for`)."""

    def __init__(self, syntax: Syntax):
        self.syntax = syntax
        tokens: list[str] = []
        if syntax.raw_strings == "rust":
            tokens.append(r"(?<![\w])[bc]?r#*\"")
        elif syntax.raw_strings == "cpp":
            tokens.append(r"(?<![\w])(?:u8|[uUL])?R\"[^(\s\"\\]{0,16}\(")
        elif syntax.raw_strings == "csharp":
            tokens.append(r"\$?@\$?\"")
        elif syntax.raw_strings == "lua":
            tokens.append(r"--\[=*\[|\[=*\[")
        tokens += [re.escape(q) for q in syntax.triple_quotes]
        if syntax.block_comment and syntax.raw_strings != "lua":
            tokens.append(re.escape(syntax.block_comment[0]))
        for marker in syntax.line_comments:
            if marker == "#" and syntax.name == "bash":
                tokens.append(r"(?<![^\s;&|(){}])#")  # a comment only where a word starts
            else:
                tokens.append(re.escape(marker))
        tokens += [re.escape(q) for q in syntax.quotes]
        if syntax.char_or_lifetime:
            tokens.append("'")
        if syntax.backtick:
            tokens.append("`")
        if syntax.regex_literals:
            tokens.append("/")
        self._lexical = re.compile("|".join(tokens))  # strings and comments only: a prefix's state
        tokens.append(r"[()\[\]{}]")
        self._code = re.compile("|".join(tokens))
        self._line_comments = frozenset(syntax.line_comments)
        self._block_open = syntax.block_comment[0] if syntax.block_comment else None
        self._block_close = syntax.block_comment[1] if syntax.block_comment else ""
        self._nested = re.compile(
            re.escape(self._block_open or "/*") + "|" + re.escape(self._block_close or "*/")
        )

    def scan(self, text: str, pos: int, end: int, st: State, *, brackets: bool = True) -> int:
        """Advance ``st`` over ``text[pos:end]``; return the index just past the last significant
        character outside comments (strings count), or -1 if there is none. ``brackets=False`` leaves
        brackets uncounted (outside template interpolations): only strings and comments are followed."""
        sig = -1
        closes: dict[int, int] = {}  # where regular expression literals close, for this scan's lines
        while pos < end:
            code = self._code if brackets or st.templates else self._lexical
            mode = st.mode
            if mode == STRING:
                pos, sig = self._string(text, pos, end, st, sig)
                continue
            if mode == COMMENT:
                pos = self._comment(text, pos, end, st)
                continue
            m = code.search(text, pos, end)
            stop = end if m is None else m.start()
            j = stop
            while j > pos and text[j - 1] in _SPACE:
                j -= 1
            if j > pos:
                sig = j
            if m is None:
                return sig
            tok = m.group()
            pos = m.end()
            first = tok[0]
            if first in "([{":
                st.depth += 1
                sig = pos
            elif first in ")]}":
                st.depth -= 1
                sig = pos
                if first == "}" and st.templates and st.depth == st.templates[-1]:
                    st.templates.pop()
                    self._open(st, "`", escapes=True, multiline=True)
            elif tok in self._line_comments:
                newline = text.find("\n", pos, end)
                pos = end if newline < 0 else newline
            elif tok == self._block_open or tok.startswith("--["):
                st.mode, st.comment_depth = COMMENT, 1
                st.closer = self._block_close if tok == self._block_open else "]" + "=" * (len(tok) - 4) + "]"
            elif tok == "/":
                pos, regex = self._slash(text, m.start(), end, closes)
                sig = pos
                if regex:
                    st.literal_end = pos
            elif tok == "'" and self.syntax.char_or_lifetime:
                literal = _CHAR_LITERAL.match(text, m.start(), end)
                if literal is not None:
                    pos = sig = st.literal_end = literal.end()
            else:
                self._open_string(st, tok)
                sig = pos
        return sig

    def find_close(self, text: str, pos: int, end: int, st: State) -> int:
        """Where, in ``text[pos:end]``, the string or comment ``st`` is in closes (the index its closer
        starts at, or of the newline that ends a one-line string); -1 if it does not."""
        if st.mode == STRING:
            body = _string_body(st.closer, st.escapes, st.multiline)
            while True:
                p = body.match(text, pos, end).end()
                if p >= end or (p == end - 1 and st.escapes and text[p] == "\\"):  # (ends inside an escape)
                    return -1
                if text.startswith("${", p):  # an interpolation is read as part of the string
                    pos = p + 2
                    continue
                return p
        if not self.syntax.nested_comments:
            return text.find(st.closer, pos, end)
        depth = st.comment_depth
        for m in self._nested.finditer(text, pos, end):
            depth += 1 if m.group() == self._block_open else -1
            if depth == 0:
                return m.start()
        return -1

    def _open_string(self, st: State, tok: str) -> None:
        syntax = self.syntax
        if tok in syntax.triple_quotes:
            self._open(st, tok, escapes=True, multiline=True)
        elif tok == "`":
            self._open(st, "`", escapes=syntax.backtick == "template", multiline=True)
        elif tok.endswith("(") and syntax.raw_strings == "cpp":  # R"delim(
            self._open(st, ")" + tok[tok.index('"') + 1 : -1] + '"', escapes=False, multiline=True)
        elif tok.startswith("[") and syntax.raw_strings == "lua":  # [==[
            self._open(st, "]" + "=" * (len(tok) - 2) + "]", escapes=False, multiline=True)
        elif len(tok) > 1 and syntax.raw_strings == "rust":  # r#"
            self._open(st, '"' + "#" * tok.count("#"), escapes=False, multiline=True)
        elif len(tok) > 1 and syntax.raw_strings == "csharp":  # @"
            self._open(st, '"', escapes=False, multiline=True)
        else:
            self._open(st, tok, escapes=True, multiline=syntax.multiline_quotes)

    @staticmethod
    def _open(st: State, closer: str, *, escapes: bool, multiline: bool) -> None:
        st.mode, st.closer, st.escapes, st.multiline = STRING, closer, escapes, multiline

    def _string(self, text: str, pos: int, end: int, st: State, sig: int) -> tuple[int, int]:
        body = _string_body(st.closer, st.escapes, st.multiline)
        p = body.match(text, pos, end).end()
        if p >= end or (p == end - 1 and text[p] == "\\"):  # the text ends inside it (or inside an escape)
            return end, end if text[end - 1] not in _SPACE else sig
        if text.startswith("${", p) and st.closer == "`" and st.escapes:
            st.mode = CODE
            st.templates.append(st.depth)
            st.depth += 1
            return p + 2, p + 2
        if text.startswith(st.closer, p):
            st.mode = CODE
            st.literal_end = p + len(st.closer)
            return st.literal_end, st.literal_end
        st.mode = CODE  # a newline ends a one-line string that was never closed
        return p, sig

    def _comment(self, text: str, pos: int, end: int, st: State) -> int:
        if not self.syntax.nested_comments:
            close = text.find(st.closer, pos, end)
            if close < 0:
                return end
            st.mode = CODE
            return close + len(st.closer)
        while True:
            m = self._nested.search(text, pos, end)
            if m is None:
                return end
            pos = m.end()
            st.comment_depth += 1 if m.group() == self._block_open else -1
            if st.comment_depth == 0:
                st.mode = CODE
                return pos

    def _slash(self, text: str, at: int, end: int, closes: dict[int, int]) -> tuple[int, bool]:
        """A ``/`` in JavaScript: a regular expression literal (skipped whole) or a division; where it
        ends, and whether it was a literal. It reads back only over the blanks and the word before it
        (never to the line's start), and ``closes`` keeps where literals close (see :func:`_close`)."""
        j = at
        while j > 0 and text[j - 1] in " \t":
            j -= 1
        before = text[j - 1] if j > 0 and text[j - 1] != "\n" else ""
        regex = before == "" or before in _REGEX_AFTER_CHAR
        if not regex and (before.isalnum() or before in "_$"):
            start = j - 1  # the start of the run of word characters before the ``/``
            while start > 0 and (text[start - 1].isalnum() or text[start - 1] in "_$"):
                start -= 1
            word = _WORD_START.search(text, start, j)
            regex = word is not None and text[word.start() : j] in _REGEX_AFTER_WORD
        if regex and at + 1 < end and text[at + 1] not in "*/\n":
            close = _close(text, at + 1, end, closes)
            if close >= 0:
                return _FLAGS.match(text, close + 1, end).end(), True
        return at + 1, False


def _close(text: str, pos: int, end: int, closes: dict[int, int]) -> int:
    """Where the body of a regular expression literal that starts at ``pos`` closes (the index of its
    ``/``), or -1 when its line ends first. The body reads the same from a place in the same state (in
    a class ``[...]`` or not), so ``closes`` keeps each answer by place and state: bodies that start at
    different ``/`` of a line meet there, and the line is read about once, not once per ``/``."""
    path: list[int] = []
    in_class = False
    while True:
        key = 2 * pos + in_class
        close = closes.get(key)
        if close is not None:
            break
        path.append(key)
        m = _LITERAL_STOPS.search(text, pos, end)
        char, after = ("\n", end) if m is None else (m.group(), m.end())
        if char == "\n" or (char == "\\" and (after >= end or text[after] == "\n")):
            close = -1
            break
        if char == "/" and not in_class:
            close = after - 1
            break
        pos = after + (char == "\\")  # an escape takes the character after it
        in_class = char == "[" or (in_class and char != "]")
    for key in path:
        closes[key] = close
    return close


@functools.cache
def _string_body(closer: str, escapes: bool, multiline: bool) -> re.Pattern[str]:
    """What a string holds up to its closer (or a line's end, for a one-line string)."""
    first, rest = re.escape(closer[0]), re.escape(closer[1:])
    template = closer == "`" and escapes
    stops = first + ("\\\\" if escapes else "") + ("" if multiline else "\\n") + ("$" if template else "")
    parts = [f"[^{stops}]"]
    if escapes:
        parts.append(r"\\[\s\S]")
    if rest:
        parts.append(f"{first}(?!{rest})")
    if template:
        parts.append(r"\$(?!\{)")
    return re.compile(f"(?:{'|'.join(parts)})*")


@functools.cache
def scanner_for(syntax: Syntax) -> Scanner:
    return Scanner(syntax)
