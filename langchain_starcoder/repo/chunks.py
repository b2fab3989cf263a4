"""A file as the ranker sees it: its lines, identifiers and definitions, cut into code-aware units
(signature lines for outlines, whole definitions for excerpts)."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .symbols import WORD, Definition, Symbols, name_parts, parse

#: A definition longer than this is offered by its signature only, never whole.
MAX_EXCERPT_LINES = 40
#: Distinct lines, their characters, and whole texts, whose token counts a counter keeps (memory stays
#: bounded: lines of files since changed are no longer shared with the index).
MAX_COUNTED_LINES, MAX_COUNTED_CHARS, MAX_COUNTED_TEXTS = 500_000, 20_000_000, 512


@dataclass(frozen=True, slots=True)
class Unit:
    """Lines of one file that go into the prompt together."""

    path: str
    start: int
    end: int
    """Its last line (inclusive)."""
    definition: Definition | None
    excerpt: bool
    """True for a run of code (a gap next to it gets a marker), False for signature lines."""


class TokenCounts:
    """One counter's token counts, kept by text: lines and paths (always valid, and shared by the files
    that repeat a line: about half of a repository's lines are repeats) and the latest whole texts.
    Packing estimates a text's tokens as its lines' (a newline adds about a quarter)."""

    def __init__(self, count_tokens: Callable[[str], int]) -> None:
        self.count_tokens = count_tokens
        self._lines: dict[str, int] = {}
        self._chars = 0
        """The characters of the lines in ``_lines``."""
        self._texts: OrderedDict[str, int] = OrderedDict()

    def line(self, text: str) -> int:
        n = self._lines.get(text)
        if n is None:
            if len(self._lines) >= MAX_COUNTED_LINES or self._chars >= MAX_COUNTED_CHARS:
                self._lines.clear()
                self._chars = 0
            n = self._lines[text] = self.count_tokens(text)
            self._chars += len(text)
        return n

    def lines(self, entry: FileEntry, lines: Iterable[int]) -> int:
        """The tokens of ``entry``'s ``lines``, summed (packing sums thousands per lookup)."""
        known, texts = self._lines, entry.lines
        total = 0
        for i in lines:
            n = known.get(texts[i])
            total += self.line(texts[i]) if n is None else n
        return total

    def text(self, text: str) -> int:
        """A whole text's tokens (the files that stay the same while the cursor moves are not counted
        again)."""
        if "\n" not in text:
            return self.line(text)
        n = self._texts.get(text)
        if n is None:
            n = self._texts[text] = self.count_tokens(text)
            if len(self._texts) > MAX_COUNTED_TEXTS:
                self._texts.popitem(last=False)  # the oldest
        return n


@dataclass
class FileEntry:
    path: str
    text: str
    lines: list[str]
    words: frozenset[str]
    counts: dict[str, int]
    """How many times the file uses each name."""
    once: frozenset[str]
    """The names the file uses exactly once."""
    symbols: Symbols
    signatures: list[Unit] = field(default_factory=list)
    bodies: dict[str, list[Unit]] = field(default_factory=dict)
    """Whole definitions short enough to excerpt, by name."""
    classes: dict[str, Unit] = field(default_factory=dict)
    """The signature unit of each class, by name (a method's outline line needs its class's)."""
    by_part: dict[str, list[Unit]] = field(default_factory=dict)
    """Per word part of the defined names (``get_repo`` -> get, repo), the signatures holding it."""
    windows: dict[str, tuple[int, ...]] | None = None
    """Per word, the first lines of its 20-line windows holding it (made when the file is indexed)."""

    _line_sizes: dict[int, tuple[int, tuple[str, ...]]] = field(default_factory=dict, repr=False)

    def line_size(self, i: int) -> tuple[int, tuple[str, ...]]:
        """Line ``i``'s UTF-8 size and names, worked out once per file version (lookups reuse them)."""
        found = self._line_sizes.get(i)
        if found is None:
            line = self.lines[i]
            found = self._line_sizes[i] = (len(line.encode("utf-8")), tuple(WORD.findall(line)))
        return found

    @classmethod
    def build(cls, path: str, text: str) -> FileEntry:
        symbols = parse(path, text)
        counts = Counter(WORD.findall(text))
        once = frozenset(w for w, n in counts.items() if n == 1)
        entry = cls(path, text, split_lines(text), frozenset(counts), dict(counts), once, symbols)
        for d in symbols.definitions:
            # A definition's first line only: more names per token than whole multi-line signatures
            # (recall at 1,024 tokens 0.60 -> 0.66 on rich, 0.52 -> 0.55 on huggingface_hub).
            unit = Unit(path, d.start, d.start, d, excerpt=False)
            entry.signatures.append(unit)
            for part in name_parts(d.name):
                entry.by_part.setdefault(part, []).append(unit)
            if d.kind == "class":
                entry.classes.setdefault(d.name, unit)
            short = d.header_end < d.end < d.start + MAX_EXCERPT_LINES
            if d.kind in ("function", "class") and short:
                entry.bodies.setdefault(d.name, []).append(Unit(path, d.start, d.end, d, excerpt=True))
        return entry


def split_lines(text: str) -> list[str]:
    r"""The lines of ``text`` as the parser numbers them: ended by ``\n`` only (``str.splitlines`` also
    ends one at a form feed or ``\u2028``), a ``\r`` before it dropped, no empty line after the last."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if "\r" in text:
        lines = [line.removesuffix("\r") for line in lines]
    return lines
