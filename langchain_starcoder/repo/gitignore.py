"""git's ignore files (gitignore(5)) read and matched as git reads and matches them.

An ignore file is read as bytes (a UTF-8 byte order mark skipped, lines split on ``\\n``, a ``\\r`` before
it dropped, a line cut at a NUL as git's C strings are, unescaped trailing spaces trimmed). Each pattern
follows git's ``dir.c`` (``!`` negation, a trailing ``/`` for folders only, a pattern without ``/`` matched
against the name alone, one with ``/`` against the path below the ignore file's folder) and ``wildmatch.c``
(``*`` and ``?`` never match ``/``, ``**`` crosses folders only as a whole component, ``[...]`` classes with
``!``/``^``, ranges and ``[:alpha:]``, ``\\`` escapes), over the path's bytes.

Patterns become regular expressions in which only the last ``*`` of the pattern may backtrack: every
other one is wrapped in an atomic group that keeps the earliest match, which is also the right one,
because what follows it can absorb any shift (a proof sketch at :func:`_expression`). So a match costs
at most about ``len(pattern)**2 * len(path)`` steps, whatever the pattern, instead of growing as
``len(path)**stars`` with a backtracking translation.
"""

from __future__ import annotations

import itertools
import os
import re
import stat
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

#: An ignore file larger than this is not read; nothing beneath its folder is indexed then.
MAX_IGNORE_FILE_BYTES = 8 * 1024 * 1024
#: An ignore file of more rules than this is not used either (each costs time for every path scanned).
MAX_IGNORE_RULES = 10_000
#: Rules compiled into one regular expression (one match call per chunk and path).
RULES_PER_EXPRESSION = 500
_GLOB_SPECIAL = "*?[\\"
#: wildmatch.c's ``[:name:]`` classes, ASCII only as git's own ctype tables are.
_NAMED_CLASSES = {
    "alnum": "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
    "alpha": "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
    "blank": " \t",
    "cntrl": "".join(map(chr, [*range(0x20), 0x7F])),
    "digit": "0123456789",
    "graph": "".join(map(chr, range(0x21, 0x7F))),
    "lower": "abcdefghijklmnopqrstuvwxyz",
    "print": "".join(map(chr, range(0x20, 0x7F))),
    "punct": "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "space": " \t\n\r",
    "upper": "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "xdigit": "0123456789ABCDEFabcdef",
}
_BYTES = frozenset(map(chr, range(1, 256)))  # a path holds no NUL


class RepoScanNotice(UserWarning):
    """An ignore file the repository scan could not read (nothing beneath its folder is indexed then),
    or a rule in it that can never match and is skipped."""


class MalformedPattern(ValueError):
    """A pattern that git's wildmatch aborts on, so it never matches."""


# --- one pattern ---------------------------------------------------------------------------------

#: The pieces of a parsed pattern: one character's regex, or ``*`` of one of three kinds.
ONE = "one"  # ``*``: any run of characters but ``/``
ANY = "any"  # ``**`` before the end or ``\/``: any run of characters, ``/`` included
DIRS = "dirs"  # ``**/``: nothing, or any run ending with ``/`` (zero or more folders)
_CROSSING_LEADS = {ANY: "(?:.*?)", DIRS: "(?:.*?/)??"}  # lazy: the earliest start is tried first


def _escaped(pattern: str, p: int) -> tuple[str, int]:
    """The character the backslash at ``pattern[p]`` escapes, and where it is, inside a ``[...]``."""
    p += 1
    if p >= len(pattern):
        raise MalformedPattern("a '[' is never closed")
    return pattern[p], p


def _class(pattern: str, i: int) -> tuple[frozenset[str], int]:
    """The characters a ``[...]`` at ``pattern[i]`` matches, and where it ends; wildmatch.c's loop."""
    p = i + 1
    n = len(pattern)
    negated = p < n and pattern[p] in "!^"
    p += negated
    members: set[str] = set()
    previous = ""  # the last single character, which a following ``-`` makes a range's start
    while True:
        if p >= n:
            raise MalformedPattern("a '[' is never closed")
        ch = pattern[p]
        if ch == "\\":
            ch, p = _escaped(pattern, p)
            members.add(ch)
        elif ch == "-" and previous and p + 1 < n and pattern[p + 1] != "]":
            p += 1
            end = pattern[p]
            if end == "\\":
                end, p = _escaped(pattern, p)
            members.update(map(chr, range(ord(previous), ord(end) + 1)))  # empty if reversed, as in git
            ch = ""
        elif ch == "[" and p + 1 < n and pattern[p + 1] == ":":
            close = pattern.find("]", p + 2)
            if close < 0:
                raise MalformedPattern("a '[' is never closed")
            if close - (p + 2) < 1 or pattern[close - 1] != ":":
                members.add("[")  # no ``:]``: a plain ``[``
            else:
                name = pattern[p + 2 : close - 1]
                if name not in _NAMED_CLASSES:
                    raise MalformedPattern(f"[:{name}:] is not a character class")
                members.update(_NAMED_CLASSES[name])
                p = close
                ch = ""
        else:
            members.add(ch)
        previous = ch
        p += 1
        if p < n and pattern[p] == "]":
            break
    matched = (_BYTES - members) if negated else members
    return frozenset(matched - {"/"}), p + 1


def _pieces(pattern: str, start: int, *, whole_names: bool) -> list[str]:
    """``pattern`` as regex pieces for single characters and star kinds. ``start`` is where wildmatch
    begins (git compares the literal prefix before it first), which decides whether a ``**`` sits at
    the start; ``whole_names``: the pattern is matched against a name without ``/``."""
    pieces: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            if i + 1 >= n:
                raise MalformedPattern("it ends with a lone backslash")
            pieces.append(re.escape(pattern[i + 1]))
            i += 2
        elif ch == "?":
            pieces.append("[^/]")
            i += 1
        elif ch == "[":
            members, i = _class(pattern, i)
            pieces.append(_charset(members))
        elif ch == "*":
            run_end = i
            while run_end < n and pattern[run_end] == "*":
                run_end += 1
            at_component_start = i == start or pattern[i - 1] == "/"
            at_component_end = run_end == n or pattern.startswith(("/", "\\/"), run_end)
            kind = ONE
            if not whole_names and run_end - i >= 2 and at_component_start and at_component_end:
                kind = DIRS if pattern.startswith("/", run_end) else ANY
                run_end += kind == DIRS  # the ``/`` of ``**/`` belongs to the star
            pieces.append(kind)
            i = run_end
        else:
            pieces.append(re.escape(ch))
            i += 1
    return pieces


def _charset(members: frozenset[str]) -> str:
    if not members:
        return "(?!)"  # a class that matches nothing, as ``[/]`` in git
    codes = sorted(map(ord, members))
    ranges, first, last = [], codes[0], codes[0]
    for code in codes[1:]:
        if code != last + 1:
            ranges.append((first, last))
            first = code
        last = code
    ranges.append((first, last))
    return "[" + "".join(f"\\x{a:02x}" if a == b else f"\\x{a:02x}-\\x{b:02x}" for a, b in ranges) + "]"


def _expression(pieces: tuple[str, ...], name: str) -> str:
    """The regex for ``pieces``, anchored at both ends; ``name`` prefixes its group names.

    Crossing stars (``**``) split the pattern into blocks, ``*`` splits a block into fixed-width
    segments. Every ``*`` + segment but the last is matched atomically at its earliest place: were a
    later place part of a match, the earliest one is too, because the star that follows can take the
    text in between (it holds no ``/``: both stars are ``*``, or the next one crosses folders). Likewise
    each block but the last is matched atomically at its earliest start. So nothing backtracks but the
    last block's start and its last ``*``: a bounded number of tries, each a bounded scan.
    """
    blocks: list[list[str]] = [[]]
    crossings: list[str] = []
    for piece in pieces:
        if piece in _CROSSING_LEADS:
            crossings.append(piece)
            blocks.append([])
        else:
            blocks[-1].append(piece)
    groups = itertools.count()

    def atomic(body: str) -> str:  # ``(?>body)``, spelled so Python 3.10 has it too
        group = f"{name}_{next(groups)}"
        return f"(?=(?P<{group}>{body}))(?P={group})"

    def block(pieces: list[str], last: bool) -> str:
        segments = [""]
        for piece in pieces:
            if piece == ONE:
                segments.append("")
            else:
                segments[-1] += piece
        out = segments[0]
        for k, segment in enumerate(segments[1:], 1):
            out += f"[^/]*{segment}" if last and k == len(segments) - 1 else atomic(f"[^/]*?{segment}")
        return out

    out = block(blocks[0], last=len(blocks) == 1)
    for k, (crossing, pieces_) in enumerate(zip(crossings, blocks[1:], strict=True), 1):
        last = k == len(blocks) - 1
        body = _CROSSING_LEADS[crossing] + block(pieces_, last)
        out += body if last else atomic(body)
    return out + r"\Z"


# --- one ignore file -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One pattern line of an ignore file."""

    line: int
    text: str
    """The line as git keeps it (bytes as Latin-1 characters)."""
    negate: bool
    dir_only: bool
    name_only: bool
    """No ``/`` in the pattern: it is matched against the last name of a path."""
    pieces: tuple[str, ...]
    """Its pattern parsed: one regex per character, or a star kind (``ONE``, ``ANY``, ``DIRS``)."""
    expression: str


def _rule(line: int, text: str) -> Rule:
    """The rule of a trimmed line (git's ``parse_path_pattern``); MalformedPattern if it never matches."""
    negate = text.startswith("!")
    pattern = text[1:] if negate else text
    dir_only = pattern.endswith("/")
    pattern = pattern[:-1] if dir_only else pattern
    name_only = "/" not in pattern
    if not name_only and pattern.startswith("/"):
        pattern = pattern[1:]
    prefix = next((i for i, ch in enumerate(pattern) if ch in _GLOB_SPECIAL), len(pattern))
    pieces = tuple(_pieces(pattern, prefix, whole_names=name_only))
    return Rule(line, text, negate, dir_only, name_only, pieces, _expression(pieces, f"r{line}"))


def _trim_trailing_spaces(line: str) -> str:
    """git's ``trim_trailing_spaces``: unescaped spaces at the end go (tabs stay)."""
    last_space = None
    i = 0
    while i < len(line):
        if line[i] == " ":
            last_space = i if last_space is None else last_space
        else:
            if line[i] == "\\":
                i += 1
                if i == len(line):
                    return line
            last_space = None
        i += 1
    return line if last_space is None else line[:last_space]


def _lines(data: bytes) -> Iterator[tuple[int, str]]:
    """The pattern lines of an ignore file, numbered from 1, as git's ``add_patterns_from_buffer``."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw or raw.startswith(b"#"):
            continue
        raw = raw[:-1] if raw.endswith(b"\r") else raw
        text = _trim_trailing_spaces(raw.partition(b"\0")[0].decode("latin-1"))
        if text and text != "!":
            yield number, text


def _shown(text: str) -> str:
    return text.encode("latin-1").decode("utf-8", "replace")


class IgnoreFile:
    """The rules of one ``.gitignore`` (or ``.git/info/exclude``), for paths below its folder.

    ``data`` is the file's bytes (a ``str`` is taken as UTF-8); ``name`` is how notices call the file.
    A rule git would never match (an unclosed ``[``, an unknown ``[:class:]``, a trailing lone ``\\``)
    is skipped with one :class:`RepoScanNotice` for the file. A file of over ``MAX_IGNORE_RULES`` rules
    fails closed, as one that cannot be read (:meth:`unreadable`).
    """

    def __init__(self, data: bytes | str = b"", *, name: str = ".gitignore") -> None:
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        self.name = name
        self.everything = False
        """Fail closed: every path below the folder is ignored."""
        self.rules: list[Rule] = []
        skipped: list[str] = []
        for number, text in _lines(data):
            if len(self.rules) == MAX_IGNORE_RULES:
                self.rules, skipped = [], []
                self._fail_closed(f"it holds over {MAX_IGNORE_RULES} rules")
                break
            try:
                self.rules.append(_rule(number, text))
            except MalformedPattern as error:
                skipped.append(f"line {number} {_shown(text)!r} ({error})")
        # Per kind of path and of rule, chunks of rules the latest first: the first that matches decides.
        self._chunks = {
            (is_dir, name_only): self._compile(
                [r for r in self.rules if r.name_only == name_only and (is_dir or not r.dir_only)], skipped
            )
            for is_dir in (False, True)
            for name_only in (False, True)
        }
        if skipped:
            notice = f"{name}: skipped {len(skipped)} rule(s) that can never match, as in git: "
            notice += "; ".join(skipped)
            warnings.warn(notice, RepoScanNotice, stacklevel=2)

    @classmethod
    def unreadable(cls, name: str, reason: str) -> IgnoreFile:
        """The stand-in for an ignore file that cannot be read: it ignores everything below its folder,
        so that nothing it may name enters a prompt; says so with one :class:`RepoScanNotice`."""
        ignore = cls(name=name)
        ignore._fail_closed(reason)
        return ignore

    def _fail_closed(self, reason: str) -> None:
        folder = self.name.rpartition("/")[0] or "the repository root"
        notice = (
            f"{self.name} could not be read ({reason}), so nothing beneath {folder} is indexed; "
            "make it a readable regular file to index that folder."
        )
        warnings.warn(notice, RepoScanNotice, stacklevel=2)
        self.everything = True

    @staticmethod
    def _compile(rules: list[Rule], skipped: list[str]) -> list[_Chunk]:
        chunks = []
        ordered = rules[::-1]
        for start in range(0, len(ordered), RULES_PER_EXPRESSION):
            chunk = ordered[start : start + RULES_PER_EXPRESSION]
            try:
                regex = _alternatives(chunk)
            except (re.error, RecursionError, OverflowError):  # find the rule(s) at fault
                chunk = [rule for rule in chunk if _compiles(rule, skipped)]
                regex = _alternatives(chunk)
            chunks.append((regex, {f"r{rule.line}": rule for rule in chunk}))
        return chunks

    def match(self, relative: str, is_dir: bool) -> bool | None:
        """True if ignored, False if re-included by a ``!`` rule, None if no rule speaks of it.
        ``relative`` is ``/``-separated, below this file's folder (as ``os.scandir`` names decode)."""
        if self.everything:
            return True
        if not relative.isascii():  # git compares bytes: one Latin-1 character per byte
            relative = os.fsencode(relative).decode("latin-1")
        winner = None
        for name_only, start in ((False, 0), (True, relative.rfind("/") + 1)):
            for regex, rules in self._chunks[is_dir, name_only]:
                found = regex.match(relative, start)
                if found is not None:
                    rule = rules[str(found.lastgroup)]
                    winner = rule if winner is None or rule.line > winner.line else winner
                    break
        return None if winner is None else not winner.negate


#: One compiled chunk of rules: its regex, and the rule each alternative's closing group names.
_Chunk = tuple[re.Pattern[str], dict[str, Rule]]


def _alternatives(rules: list[Rule]) -> re.Pattern[str]:
    """One regex trying ``rules`` in order; the empty group closing each alternative names its rule,
    and sits last so that the engine can reject an alternative by its first character."""
    return re.compile("|".join(f"{rule.expression}(?P<r{rule.line}>)" for rule in rules), re.DOTALL)


def _compiles(rule: Rule, skipped: list[str]) -> bool:
    try:
        re.compile(rule.expression, re.DOTALL)
    except (re.error, RecursionError, OverflowError) as error:
        skipped.append(f"line {rule.line} {_shown(rule.text)!r} ({error})")
        return False
    return True


def read_ignore_file(path: str, name: str, *, follow_symlinks: bool = False) -> IgnoreFile | None:
    """The ignore file at ``path`` (``name``: how notices call it), None if there is none.

    One that exists but cannot be read fails closed (:meth:`IgnoreFile.unreadable`): not a regular file,
    unreadable, over ``MAX_IGNORE_FILE_BYTES``, or a symlink unless ``follow_symlinks`` (git does not
    follow an in-tree ``.gitignore`` either).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow_symlinks else os.O_NOFOLLOW)  # a FIFO cannot block
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        if not follow_symlinks and os.path.islink(path):
            return IgnoreFile.unreadable(name, "it is a symbolic link, which git does not follow either")
        return IgnoreFile.unreadable(name, error.strerror or str(error))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return IgnoreFile.unreadable(name, "it is not a regular file")
        if info.st_size > MAX_IGNORE_FILE_BYTES:
            return IgnoreFile.unreadable(name, f"it is over {MAX_IGNORE_FILE_BYTES} bytes")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_IGNORE_FILE_BYTES + 1)
    except OSError as error:
        return IgnoreFile.unreadable(name, error.strerror or str(error))
    finally:
        os.close(fd)
    if len(data) > MAX_IGNORE_FILE_BYTES:
        return IgnoreFile.unreadable(name, f"it is over {MAX_IGNORE_FILE_BYTES} bytes")
    return IgnoreFile(data, name=name)
