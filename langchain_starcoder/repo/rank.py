"""Choosing, ordering and packing a hole's repository context into a token budget.

What a hole needs from other files are the names its file does not already show: the methods, functions
and constants of other modules it is about to use. So the context is an outline (signature lines) chosen
to cover such names, best first. A name's worth starts from how many files of the repository use it
exactly once (a name files use in passing, the way a hole would; its square root, so that relatedness
outweighs popularity), raised when its file is imported by the hole's file, imports it or was seen
recently, when its class is mentioned in the hole's file or named in the signature of a name used near
the cursor (the type of what the code there holds), and by how much of its words (``delete_tag``: delete,
tag) the code near the cursor uses. Each name is covered once (a line covers every name on it), and never
the same line twice. Each file's chosen lines are written in their order; files are ordered by how
related they are to the hole's file (which the cursor's position does not change), least first, so the
most related code sits nearest the hole and a cursor moving inside a function keeps the prompt's start.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from ..fim.request import ContextFile
from .chunks import FileEntry, TokenCounts, Unit
from .lexical import Window, window_unit
from .symbols import WORD, head_lines, name_parts, tail_lines

#: Per name: base value, base value where the hole's file shows it, word parts, parts' weights.
NameValues = tuple[float, float, frozenset[str], tuple[tuple[str, float], ...]]

#: The line standing for left-out lines between an excerpt and the rest of the file's lines.
GAP_MARKER = "⋮"
#: Tokens a context file costs besides ``count_tokens(path) + count_tokens(text)``: StarCoder2's
#: ``<file_sep>`` and the newline after the path.
FRAME_TOKENS = 2
#: Lines of the prefix's end and the suffix's start that count as "near the cursor".
NEAR_PREFIX_LINES = 30
NEAR_SUFFIX_LINES = 10
#: The share of the budget lexical windows may take before the outline (measured: benchmarks/repo_context).
WINDOW_SHARE = 0.4
#: What joining lines adds to their tokens, per line (measured on StarCoder2-sized BPEs: about 0.25).
NEWLINE_TOKENS = 0.3
#: Units that do not fit before packing gives up on what is left.
MAX_MISSES = 200
#: How much more a name is worth whose word parts all occur near the cursor.
PART_BOOST = 3.0
#: The share of the budget packed from what the hole's file says outside the definition the cursor is
#: in (the same while the cursor moves inside it): the start of the context, which stays put.
STABLE_SHARE = 0.5
#: How many signatures of each related file are offered besides those that share a word with the hole.
FILE_CANDIDATES = 150
#: How many of the repository's most used names are candidates at each lookup (300 recalled as much as
#: 1,000 on five repositories, with a third fewer units to score: benchmarks/RESULTS.md, row 13).
GLOBAL_CANDIDATES = 300


@dataclass(frozen=True)
class Hole:
    path: str
    file_words: frozenset[str]
    near_words: frozenset[str]
    near_parts: frozenset[str] = frozenset()
    """The word parts (``get_repo_info`` -> get, repo, info) of the names near the cursor."""

    @classmethod
    def of(cls, path: str, prefix: str, suffix: str, file_words: frozenset[str] | None = None) -> Hole:
        """The hole's names; ``file_words``, when the caller knows them, saves reading a big file again."""
        if file_words is None:
            file_words = frozenset(WORD.findall(prefix)) | frozenset(WORD.findall(suffix))
        near = tail_lines(prefix, NEAR_PREFIX_LINES) + "\n" + head_lines(suffix, NEAR_SUFFIX_LINES)
        return cls.outside(path, file_words, near)

    @classmethod
    def outside(cls, path: str, file_words: frozenset[str], near: str, imported: str = "") -> Hole:
        """The hole with the file's names ``file_words``, the text ``near`` the cursor, and the file's
        import statements (names it is about to use: as good as near, but no words to match)."""
        near_words = frozenset(WORD.findall(near))
        parts = frozenset(p for w in near_words for p in name_parts(w))
        return cls(path, file_words, near_words | frozenset(WORD.findall(imported)), parts)


@dataclass(frozen=True)
class Related:
    """How other files relate to the hole's, independent of where the cursor is."""

    imported: frozenset[str]
    importers: frozenset[str]
    second_hop: frozenset[str]
    recent: Sequence[str]
    """Files recently seen in requests, most recent last."""

    def weight(self, path: str, hole_path: str) -> float:
        w = 0.0
        if path in self.imported:
            w += 2.0
        elif path in self.importers:
            w += 0.6
        elif path in self.second_hop:
            w += 0.4
        if path in self.recent:
            w += 1.0 * (1 + list(self.recent).index(path)) / len(self.recent)
        if path.rpartition("/")[0] == hole_path.rpartition("/")[0]:
            w += 0.2
        return w


@dataclass
class Tables:
    """Repository-wide statistics the ranking reads, kept in step with the index's files."""

    used_once: Counter[str] = field(default_factory=Counter)
    """Per name, how many files use it exactly once."""
    defined: dict[str, dict[str, list[Unit]]] = field(default_factory=dict)
    """Per name, the signature units defining it, by file."""
    members: dict[str, dict[str, list[Unit]]] = field(default_factory=dict)
    """Per class name, the signature units of its methods and fields, by file."""
    parts: Counter[str] = field(default_factory=Counter)
    """Per word part, how many definitions' names hold it."""
    units: int = 0
    """How many definitions the repository has."""
    _popular: list[tuple[str, Unit]] | None = None
    _shortest: dict[str, Unit] = field(default_factory=dict)
    _values: dict[str, NameValues] = field(default_factory=dict)
    _most_used: dict[str, tuple[FileEntry, list[Unit]]] = field(default_factory=dict)

    def add(self, entry: FileEntry) -> None:
        self.used_once.update(entry.once)
        for unit in entry.signatures:
            d = unit.definition
            assert d is not None
            self.defined.setdefault(d.name, {}).setdefault(entry.path, []).append(unit)
            self.parts.update(name_parts(d.name))
            self.units += 1
            if d.parent is not None:
                self.members.setdefault(d.parent, {}).setdefault(entry.path, []).append(unit)
        self._popular = None
        self._shortest.clear()
        self._values.clear()
        self._most_used.clear()

    def remove(self, entry: FileEntry) -> None:
        self.used_once.subtract(entry.once)
        for unit in entry.signatures:
            d = unit.definition
            assert d is not None
            self.parts.subtract(name_parts(d.name))
            self.units -= 1
            for table, key in ((self.defined, d.name), (self.members, d.parent)):
                if key is not None and key in table:
                    table[key].pop(entry.path, None)
                    if not table[key]:
                        del table[key]
        self._popular = None
        self._shortest.clear()
        self._values.clear()
        self._most_used.clear()

    def shortest(self, name: str) -> Unit:
        """The definition of ``name`` that takes the fewest lines and characters to show."""
        unit = self._shortest.get(name)
        if unit is None:
            units = _units(self.defined[name])
            unit = self._shortest[name] = min(units, key=lambda u: (u.end - u.start, len(u.path), u.path))
        return unit

    def name_values(self, name: str) -> NameValues:
        """What ranking a signature of ``name`` reads (cached per name until the files change): its
        base value, the same where the hole's file shows the name, its word parts, and each part
        weighted by its rarity among the repository's definitions (the weights sum to 1)."""
        found = self._values.get(name)
        if found is None:
            used = self.used_once[name]
            # where the hole's file shows the name, its one use there is not counted
            plain, shown = math.sqrt(0.5 + used), math.sqrt(max(0.5 + used - 1, 0.0))
            if name.startswith("_") and not name.startswith("__"):
                plain, shown = plain * 0.5, shown * 0.5
            parts = name_parts(name)
            weights = [math.log(1 + max(self.units, 1) / max(self.parts[p], 1)) for p in parts]
            total = sum(weights)
            pairs = tuple(zip(parts, (w / total for w in weights), strict=True))
            found = self._values[name] = (plain, shown, frozenset(parts), pairs)
        return found

    def most_used(self, entry: FileEntry) -> list[Unit]:
        """The file's ``FILE_CANDIDATES`` signatures whose names most files use once (all in a short file)."""
        if len(entry.signatures) <= FILE_CANDIDATES:
            return entry.signatures
        found = self._most_used.get(entry.path)
        if found is None or found[0] is not entry:
            top = heapq.nlargest(FILE_CANDIDATES, entry.signatures, key=lambda u: self.used_once[_name(u)])
            found = self._most_used[entry.path] = (entry, top)
        return found[1]

    def popular(self) -> list[tuple[str, Unit]]:
        """The defined names most files use once, most first, each with its shortest definition."""
        if self._popular is None:
            names = [n for n in self.defined if self.used_once[n] > 0]
            top = heapq.nlargest(GLOBAL_CANDIDATES, names, key=lambda n: (self.used_once[n], n))
            self._popular = [(n, self.shortest(n)) for n in top]
        return self._popular


class Ranked:
    """Candidates best first, sorted only as far as they are read: packing stops long before the tail
    of the thousands a big file's neighbours offer."""

    def __init__(self, keyed: list[tuple[float, str, int, int]], units: list[Unit]) -> None:
        """``keyed``: (minus the value, path, first line, the unit's index in ``units``) per candidate:
        tuples of plain values, which the garbage collector stops tracking (a lookup makes thousands)."""
        heapq.heapify(keyed)
        self._heap = keyed
        self._units = units
        self._sorted: list[tuple[float, str, int, int]] = []
        """Popped from the heap: kept as plain tuples too (a tuple holding a unit would stay tracked)."""

    def __iter__(self) -> Iterator[tuple[float, str, Unit]]:
        k = 0
        while True:
            if k == len(self._sorted):
                if not self._heap:
                    return
                self._sorted.append(heapq.heappop(self._heap))
            negated, _, _, i = self._sorted[k]
            unit = self._units[i]
            yield -negated, unit.definition.name, unit  # type: ignore[union-attr] (signatures have one)
            k += 1

    def __bool__(self) -> bool:
        return bool(self._sorted or self._heap)


def outline_candidates(
    holes: Sequence[Hole], entries: dict[str, FileEntry], tables: Tables, related: Related
) -> list[Ranked]:
    """Per hole (the same file seen by each part of the context), the signature units worth showing
    for it, best first: (value, the name it covers, unit). What is offered to more than one hole is
    gathered once (a lookup offers thousands)."""
    hole_path = holes[0].path
    own = entries.get(hole_path)
    own_once = own.once if own is not None else frozenset()
    used_once = tables.used_once
    # The units offered, once each: first those offered to every hole (boost 0), then per hole the
    # boost of each one offered to it (by index: dicts of plain numbers, which the garbage collector
    # does not track).
    index: dict[tuple[str, int], int] = {}
    offered_units: list[Unit] = []
    boosts: list[dict[int, float]] = [{} for _ in holes]

    def offer_all(offered: Iterable[Unit]) -> None:
        for unit in offered:
            key = (unit.path, unit.start)
            if key not in index and unit.path != hole_path:
                index[key] = len(offered_units)
                offered_units.append(unit)

    def offer(k: int, offered: Iterable[Unit], boost: float) -> None:
        given = boosts[k]
        for unit in offered:
            key = (unit.path, unit.start)
            i = index.get(key)
            if i is None:
                if unit.path == hole_path:
                    continue
                i = index[key] = len(offered_units)
                offered_units.append(unit)
            b = given.get(i)
            if b is None or boost > b:
                given[i] = boost

    # The repository's most used names, each by its shortest definition.
    offer_all([unit for n, unit in tables.popular() if used_once[n] > (n in own_once)])
    # Each related file's most used signatures, and those sharing a word with what a hole sees near
    # the cursor (a long module offers thousands of signatures that no lookup values highly).
    near_parts = frozenset().union(*(h.near_parts for h in holes))
    for path in sorted({*related.imported, *related.importers, *related.second_hop, *related.recent}):
        entry = entries.get(path)
        if entry is not None:
            offer_all(tables.most_used(entry))
            for part in sorted(near_parts.intersection(entry.by_part)):
                offer_all(entry.by_part[part])
    to_all = len(offered_units)
    for k, hole in enumerate(holes):
        classes = {name for name in hole.file_words if name in tables.members}  # classes the file mentions
        for name in sorted(hole.near_words):
            if name in tables.defined:
                unit = tables.shortest(name)
                offer(k, [unit], 0.0)
                # The classes its signature names (a returned or annotated type): what the code near
                # the cursor holds, whose members it is about to use.
                classes.update(w for w in entries[unit.path].line_size(unit.start)[1] if w in tables.members)
        for name in sorted(classes):
            for units in tables.members[name].values():
                offer(k, units, 2.0)

    file_weight = {path: related.weight(path, hole_path) for path in {u.path for u in offered_units}}
    cached, name_values = tables._values, tables.name_values
    keyed: list[list[tuple[float, str, int, int]]] = [[] for _ in holes]
    # What each hole's loop reads, looked up once (the loop runs thousands of times per lookup).
    views = [(boosts[k], h.file_words, h.near_words, h.near_parts, keyed[k]) for k, h in enumerate(holes)]
    for i, unit in enumerate(offered_units):
        name = unit.definition.name  # type: ignore[union-attr] (signature units define a name)
        plain, shown, parts, weights = cached.get(name) or name_values(name)
        # The hole's own file says nothing of itself; a name it shows already is worth its
        # signature only when used nearby.
        base = shown if name in own_once else plain
        weight = file_weight[unit.path]
        for given, file_words, near_words, near_parts, out in views:
            boost = given.get(i)
            if boost is None:
                if i >= to_all:
                    continue
                boost = 0.0
            if name in file_words:
                if name not in near_words:
                    continue
                value = base * 0.3
            else:
                value = base * (1.0 + weight + boost)
            if not near_parts.isdisjoint(parts):
                near_weight = 0.0
                for p, w in weights:  # (a plain loop: a generator costs more for 2 or 3 parts)
                    if p in near_parts:
                        near_weight += w
                value *= 1.0 + PART_BOOST * near_weight
            if value > 0:  # keyed best first, then by place
                out.append((-value, unit.path, unit.start, i))
    return [Ranked(k, offered_units) for k in keyed]


def select(
    stable: Iterable[tuple[float, str, Unit]],
    near: Iterable[tuple[float, str, Unit]],
    windows: Sequence[Window],
    entries: dict[str, FileEntry],
    limits: tuple[float, float],
    counts: TokenCounts,
) -> tuple[dict[str, dict[int, bool]], dict[str, dict[int, bool]], set[str]]:
    """The lines to show in the context's two parts, by file (each with whether an excerpt holds it),
    whose cost estimated from their tokens fits the budget, and the files of the second part given
    windows. ``limits``: the first part's budget and the whole's.

    The first part is the ``stable`` outline (what the hole's file says outside the definition the
    cursor is in), the same while the cursor moves inside the definition. The second, after it, holds
    what the code near the cursor asks for: the ``near`` outline within ``1 - WINDOW_SHARE`` of the
    budget, the best ``windows`` (lexical matches of the code around the cursor), then more outline in
    what is left. A line is shown once, in either part."""
    parts: tuple[dict[str, dict[int, bool]], dict[str, dict[int, bool]]] = ({}, {})
    lines_of: dict[str, set[int]] = {}
    covered: set[str] = set()
    windowed: set[str] = set()
    spent = 0.0
    part = 0

    def take(unit: Unit, extra: Sequence[Unit], limit: float) -> bool | None:
        """Add the unit's new lines if they fit: True, False if not, None if it has none."""
        nonlocal spent
        entry = entries[unit.path]
        taken = lines_of.setdefault(unit.path, set())
        new = [unit, *extra]
        lines = {i for u in new for i in range(u.start, u.end + 1) if i not in taken}
        if not lines:
            return None
        need = counts.lines(entry, lines) + NEWLINE_TOKENS * len(lines)
        if unit.excerpt:
            need += 2  # a gap marker line
        chosen = parts[part]
        if unit.path not in chosen:
            need += counts.line(entry.path) + FRAME_TOKENS
        if spent + need > limit:
            return False
        spent += need
        taken.update(lines)
        shown = chosen.setdefault(unit.path, {})
        for u in new:
            for i in range(u.start, u.end + 1):
                if i in lines or i in shown:
                    shown[i] = shown.get(i, False) or u.excerpt
        for i in lines:
            covered.update(entry.line_size(i)[1])
        return True

    def outline(candidates: Iterable[tuple[float, str, Unit]], done: set[int], limit: float) -> None:
        misses = 0
        for k, (_, name, unit) in enumerate(candidates):
            if k in done or name in covered:
                continue
            owner = _owner(entries[unit.path], unit)
            if take(unit, [owner] if owner is not None else [], limit) is not False:
                done.add(k)
            else:
                misses += 1
                if misses > MAX_MISSES:
                    return

    first, budget = limits
    outline(stable, set(), min(first, budget))
    part = 1
    near_done: set[int] = set()
    outline(near, near_done, budget * (1 - WINDOW_SHARE))
    misses = 0
    for window in windows:
        unit = window_unit(window)
        taken = take(unit, (), budget)
        if taken:
            windowed.add(unit.path)
        elif taken is False:
            misses += 1
            if misses > MAX_MISSES // 10:
                break
    outline(near, near_done, budget)
    return parts[0], parts[1], windowed


def _name(unit: Unit) -> str:
    assert unit.definition is not None
    return unit.definition.name


def _units(by_file: dict[str, list[Unit]]) -> list[Unit]:
    return [u for units in by_file.values() for u in units]


def _owner(entry: FileEntry, unit: Unit) -> Unit | None:
    """The signature of the class a method or field sits in (its outline line needs it)."""
    d = unit.definition
    if d is None or d.parent is None:
        return None
    owner = entry.classes.get(d.parent)
    return owner if owner is not None and owner.start < unit.start else None


def render(entry: FileEntry, lines: dict[int, bool]) -> str:
    """The chosen lines of one file in their order (each with whether an excerpt holds it), a marker
    at each gap an excerpt borders."""
    out: list[str] = []
    previous = None
    for i in sorted(i for i in lines if i < len(entry.lines)):
        if previous is not None and i > previous + 1 and (lines[i] or lines[previous]):
            out.append(GAP_MARKER)
        out.append(entry.lines[i])
        previous = i
    return "\n".join(out)


def order_files(paths: Iterable[str], windowed: set[str], related: Related, hole_path: str) -> list[str]:
    """Outline-only files first, then those with windows (which change as the cursor moves), each
    group least related first, so the most related code sits right before the hole; ties by path."""
    return sorted(paths, key=lambda p: (p in windowed, related.weight(p, hole_path), p))


def file_cost(file: ContextFile, counts: TokenCounts) -> int:
    """What a context file spends of the budget: its path, its text and its frame."""
    return counts.line(file.path) + counts.text(file.text) + FRAME_TOKENS
