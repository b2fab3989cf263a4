"""Holes cut from a repository's own files: a file, a span of it and the true middle.

Kinds: ``line`` (the rest of a line from a token's start), ``span`` (a random span within a line, as
santacoder-fim), ``block`` (a statement block's body, as SAFIM's block holes), ``call`` (a call's
arguments, as SAFIM's API-call holes) and ``cross_file`` (the rest of a line from a name that another file
of the repository defines and the hole's file does not: CrossCodeEval's criterion, by the definitions
tree-sitter finds). Files are the repository index's (``.gitignore``, binary, huge, unreadable and
generated files left out), parsed with tree-sitter-language-pack's grammars.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..errors import InvalidParameterError
from ..fim.request import ContextFile
from ..repo import RepoIndex
from ..repo.symbols import LANGUAGES, language_of, parse
from ..types import is_int
from ._git import added_lines
from ._syntax import Spots, spots

KINDS = ("line", "span", "block", "call", "cross_file")
#: The most lines and characters a block hole's true middle may have.
MAX_BLOCK_LINES, MAX_BLOCK_CHARS = 15, 1500
#: The most lines and characters a call hole's arguments may have.
MAX_CALL_LINES, MAX_CALL_CHARS = 8, 400
#: Languages whose files may define what another's use (a TypeScript file imports JavaScript).
FAMILIES = {"javascript": "js", "typescript": "js", "tsx": "js", "c": "c", "cpp": "c"}
_CODE = re.compile(r"\w")
_TOKEN = re.compile(r"\w+|[^\w\s]")


class HoleNotice(UserWarning):
    """A kind asked for that the repository has no place for (its share went to the other kinds)."""


@dataclass(frozen=True)
class Hole:
    """One hole: the file's text is ``prefix + truth + suffix``."""

    file: str
    """Its file, relative to the repository root (``/``-separated)."""
    kind: str
    """``line``, ``span``, ``block``, ``call`` or ``cross_file`` (:data:`KINDS`)."""
    language: str
    """The file's tree-sitter language (``python``, ``typescript``...)."""
    prefix: str = field(repr=False)
    suffix: str = field(repr=False)
    truth: str
    """The true middle."""
    line: int = 0
    """The 0-based line the hole starts on."""
    column: int = 0
    """The character of that line it starts at."""
    identifier: str | None = None
    """For ``cross_file``: the name defined in another file that the true middle starts with."""
    defined_in: tuple[str, ...] = ()
    """For ``cross_file``: the other files that define it."""
    context: tuple[ContextFile, ...] = field(default=(), repr=False)
    """Context given with the hole (CrossCodeEval's retrieved chunks); empty for holes cut here."""
    task_id: str = ""
    """A name unique among the holes of a repository (``file:line:column:kind`` when cut here)."""

    def __post_init__(self) -> None:
        if not self.task_id:
            object.__setattr__(self, "task_id", f"{self.file}:{self.line + 1}:{self.column + 1}:{self.kind}")


@dataclass(frozen=True)
class _Candidate:
    """A place for a hole, its exact span drawn when it is picked (``line``, ``span``)."""

    file: str
    language: str
    spots: Spots
    kind: str
    start: int
    end: int
    row: int
    identifier: str | None = None
    defined_in: tuple[str, ...] = ()


def cut_holes(
    repo: RepoIndex | str | os.PathLike[str],
    *,
    kinds: Iterable[str] | str = KINDS,
    n: int = 200,
    seed: int = 0,
    since: str | None = None,
    languages: Iterable[str] | str | None = None,
) -> list[Hole]:
    """``n`` holes of ``kinds`` (as even a share each as their places allow) in the files of ``repo``
    (a folder or a :class:`~langchain_starcoder.RepoIndex`), the same for the same seed and files.

    ``since``: only holes in lines added after that git revision (and in untracked files);
    ``languages``: only files of these tree-sitter languages (``python``, ``go``...). A kind the
    repository has no place for gives its share to the others. Holes come by kind, then file and place.
    """
    kinds, n, wanted = _check(kinds, n, seed, languages)
    index = repo if isinstance(repo, RepoIndex) else RepoIndex(repo)
    added = added_lines(index.root, since) if since is not None else None
    files = [(rel, language_of(rel)) for rel in index.files]
    definitions = _definitions(index, files) if "cross_file" in kinds else _Definitions()
    places: dict[str, list[_Candidate]] = {kind: [] for kind in kinds}
    for rel, language in files:
        if language is None or language not in wanted or (added is not None and rel not in added):
            continue
        text = index.text(rel)
        found = spots(language, text) if text is not None else None
        if found is None:
            continue
        for kind in kinds:
            places[kind] += _FINDERS[kind](rel, language, found, definitions)
    if added is not None:
        places = {k: [c for c in found if _all_added(c, added[c.file])] for k, found in places.items()}
    counts = {kind: len(found) for kind, found in places.items()}
    if n:
        _no_place(index, counts, since, None if languages is None else sorted(wanted))
    quotas = _quotas(counts, n)
    holes = []
    for kind in kinds:
        rng = random.Random(f"{seed}/{kind}")  # a kind's holes do not depend on the other kinds asked
        picked = sorted(rng.sample(range(len(places[kind])), quotas[kind]))
        holes += [_cut(places[kind][i], rng) for i in picked]
    return holes


def _no_place(
    index: RepoIndex, counts: dict[str, int], since: str | None, languages: list[str] | None
) -> None:
    """A :class:`HoleNotice` naming the kinds asked that the repository has no place for."""
    none = [kind for kind, count in counts.items() if not count]
    if not none:
        return
    where = f" in its {', '.join(languages)} files" if languages is not None else ""
    where += f" in lines added since {since}" if since is not None else ""
    rest = ": the other kinds take their share." if len(none) < len(counts) else "."
    msg = f"{index.root} has no place for {', '.join(none)} holes{where}{rest}"
    warnings.warn(msg, HoleNotice, stacklevel=3)


def _check(
    kinds: Iterable[str] | str, n: int, seed: int, languages: Iterable[str] | str | None
) -> tuple[list[str], int, set[str]]:
    """The kinds asked in :data:`KINDS` order, ``n`` and the languages, checked."""
    names = [k.strip() for k in kinds.split(",")] if isinstance(kinds, str) else list(kinds)
    unknown = [k for k in names if k not in KINDS]
    if unknown or not names:
        msg = f"kinds must be some of {', '.join(KINDS)}; not {unknown or names!r}."
        raise InvalidParameterError(msg)
    if not is_int(n) or n < 0:
        msg = f"n must be an integer >= 0 (how many holes), not {n!r}."
        raise InvalidParameterError(msg)
    if not is_int(seed):
        msg = f"seed must be an integer, not {seed!r}."
        raise InvalidParameterError(msg)
    known = set(LANGUAGES.values())
    wanted = known if languages is None else {languages} if isinstance(languages, str) else set(languages)
    if not wanted or wanted - known:
        msg = f"languages must be some of {', '.join(sorted(known))}; not {sorted(wanted - known) or wanted}."
        raise InvalidParameterError(msg)
    return [k for k in KINDS if k in names], n, wanted


def _quotas(counts: dict[str, int], n: int) -> dict[str, int]:
    """An even share of ``n`` per kind; a kind with fewer places gives the rest to the others."""
    quotas = {}
    left = n
    for k, kind in enumerate(sorted(counts, key=lambda kind: counts[kind])):  # sorted() is stable
        quotas[kind] = min(counts[kind], left // (len(counts) - k))
        left -= quotas[kind]
    return quotas


def _all_added(candidate: _Candidate, rows: set[int]) -> bool:
    if candidate.kind in ("line", "span", "cross_file"):
        return candidate.row in rows
    last = candidate.spots.row_of(max(candidate.start, candidate.end - 1))
    return all(row in rows for row in range(candidate.row, last + 1))


# --- places per kind -----------------------------------------------------------------------------


def _lines(rel: str, language: str, found: Spots, _: object) -> list[_Candidate]:
    """Lines with code that has a name, number or word in it (not only brackets)."""
    return [
        _Candidate(rel, language, found, "line", lo, hi, row)
        for row, (lo, hi) in sorted(found.code.items())
        if _CODE.search(found.text, lo, hi)
    ]


def _spans(rel: str, language: str, found: Spots, _: object) -> list[_Candidate]:
    """Lines with at least two characters of code, one a name, number or word."""
    return [
        _Candidate(rel, language, found, "span", lo, hi, row)
        for row, (lo, hi) in sorted(found.code.items())
        if hi - lo >= 2 and _CODE.search(found.text, lo, hi)
    ]


def _blocks(rel: str, language: str, found: Spots, _: object) -> list[_Candidate]:
    out = []
    for start, end in found.blocks:
        lines = found.text.count("\n", start, end) + 1
        if (
            lines <= MAX_BLOCK_LINES
            and end - start <= MAX_BLOCK_CHARS
            and _CODE.search(found.text, start, end)
        ):
            out.append(_Candidate(rel, language, found, "block", start, end, found.row_of(start)))
    return out


def _calls(rel: str, language: str, found: Spots, _: object) -> list[_Candidate]:
    out = []
    for start, end in found.arguments:
        lines = found.text.count("\n", start, end) + 1
        if lines <= MAX_CALL_LINES and end - start <= MAX_CALL_CHARS and found.text[start:end].strip():
            out.append(_Candidate(rel, language, found, "call", start, end, found.row_of(start)))
    return out


def _cross_file(rel: str, language: str, found: Spots, definitions: _Definitions) -> list[_Candidate]:
    """Per line outside the imports, its first name that the file neither defines nor binds and another
    file of the language defines: at the top level for a bare name, anywhere for an attribute's."""
    top, members = definitions.by_family.get(FAMILIES.get(language, language), ({}, {}))
    own, imports = definitions.by_file.get(rel, (frozenset(), frozenset()))
    text, out = found.text, []
    for row, names in sorted(found.names.items()):
        if row in imports or row not in found.code:
            continue
        for start, end in names:
            name = text[start:end]
            if name in own or name in found.bound:
                continue
            others = top.get(name, set()) | (
                members.get(name, set()) if text[start - 1 : start] == "." else set()
            )
            others = others - {rel}
            if others:
                place = _Candidate(rel, language, found, "cross_file", start, found.line_end(row), row, name)
                out.append(dataclasses.replace(place, defined_in=tuple(sorted(others))))
                break
    return out


_FINDERS: dict[str, Callable[..., list[_Candidate]]] = {
    "line": _lines,
    "span": _spans,
    "block": _blocks,
    "call": _calls,
    "cross_file": _cross_file,
}


@dataclass
class _Definitions:
    by_family: dict[str, tuple[dict[str, set[str]], dict[str, set[str]]]] = field(default_factory=dict)
    """Per language family, the files of each name defined at the top level, and of each defined in a
    class (methods, fields). Dunder names are left out: every module has some."""
    by_file: dict[str, tuple[frozenset[str], frozenset[int]]] = field(default_factory=dict)
    """Per file, the names it defines and the lines of its imports."""


def _definitions(index: RepoIndex, files: list[tuple[str, str | None]]) -> _Definitions:
    found = _Definitions()
    for rel, language in files:
        text = index.text(rel) if language is not None else None
        if text is None or language is None:
            continue
        symbols = parse(rel, text)
        imports = frozenset(row for _, first, last in symbols.imports for row in range(first, last + 1))
        found.by_file[rel] = (frozenset(d.name for d in symbols.definitions), imports)
        top, members = found.by_family.setdefault(FAMILIES.get(language, language), ({}, {}))
        for d in symbols.definitions:
            if not (d.name.startswith("__") and d.name.endswith("__")):
                where = members if d.parent is not None or d.kind == "field" else top
                where.setdefault(d.name, set()).add(rel)
    return found


def _cut(place: _Candidate, rng: random.Random) -> Hole:
    text = place.spots.text
    start, end = place.start, place.end
    if place.kind == "line":  # from a token's start with a word after it, to the line's end
        starts = [m.start() for m in _TOKEN.finditer(text, start, end)]
        start = rng.choice([a for a in starts if _CODE.search(text, a, end)])
        end = place.spots.line_end(place.row)
    elif place.kind == "span":  # from and to a character that is not blank, a word's inside
        chars = [i for i in range(start, end) if not text[i].isspace()]
        words = [i for i in chars if _CODE.match(text, i)]
        start = rng.choice([i for i in chars if i <= words[-1]])
        first = next(i for i in words if i >= start)
        end = rng.choice([i + 1 for i in chars if i >= first])
    row = place.spots.row_of(start)
    return Hole(
        file=place.file,
        kind=place.kind,
        language=place.language,
        prefix=text[:start],
        suffix=text[end:],
        truth=text[start:end],
        line=row,
        column=start - place.spots.line_starts[row],
        identifier=place.identifier,
        defined_in=place.defined_in,
    )
