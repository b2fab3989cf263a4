"""RepoIndex: a repository folder's files, definitions and imports, kept fresh, asked for the context
of a hole."""

from __future__ import annotations

import os
import threading
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import InvalidParameterError
from ..fim.request import ContextFile
from .chunks import FileEntry, TokenCounts, Unit
from .files import FileTree, read_beneath, relative_path
from .lexical import Window, WordIndex
from .memory import HELD_PER_FILE, RepoMemoryNotice, held_bytes
from .rank import (
    STABLE_SHARE,
    Hole,
    Related,
    Tables,
    file_cost,
    head_lines,
    order_files,
    outline_candidates,
    render,
    select,
    tail_lines,
)
from .symbols import WORD, parse

#: A definition longer than this is too broad to stand for the code near the cursor.
MAX_NEAR_LINES = 200
#: How many recently requested files count as "recently seen".
RECENT_FILES = 10
#: How many times a lookup packs to fit the exact budget.
FIT_TRIES = 3
#: Counters whose token counts are kept between lookups (the latest).
COUNTERS_KEPT = 4
#: The lexical query: the prefix's last lines and half as many of the suffix's first.
WINDOW_QUERY_LINES = 20
_JS_ENDINGS = ("", ".ts", ".tsx", ".js", ".jsx", ".mjs", ".cjs", "/index.ts", "/index.js")


class RepoIndex:
    """The code of a repository folder, indexed to pick the related code for a fill-in-the-middle hole.

    Scans ``root`` once (``.gitignore`` files and ``.git/info/exclude`` respected; vendored and build
    folders, symlinked folders, lock files, generated, binary, non-UTF-8 and huge files skipped), and
    before every lookup stats what it knows, so an edited, added or deleted file is seen by the next
    lookup; only changed files are parsed again. Every read stays beneath ``root`` (a file later
    swapped for a link that leads out of it is dropped), and one index may serve many threads: its
    methods take turns.

    Example::

        index = RepoIndex("path/to/repo")
        files = index.context_files("pkg/mod.py", prefix, suffix, max_tokens=1024,
                                    count_tokens=engine.count_tokens)
        engine.infill(prefix, suffix, file_path="pkg/mod.py", context_files=files)
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        max_file_bytes: int = 1_000_000,
        max_files: int = 100_000,
        max_total_bytes: int = 256_000_000,
        max_memory_bytes: int = 1_000_000_000,
    ) -> None:
        """Index ``root``: files over ``max_file_bytes`` are skipped, and once ``max_files`` files or
        ``max_total_bytes`` bytes are held, later files (in walk order) are left out. So is a file whose
        tables would take the memory held past ``max_memory_bytes`` (an upper estimate per file,
        :func:`held_bytes`: dense code takes up to 200 bytes per byte of source, typical code 15),
        with one :class:`RepoMemoryNotice`."""
        path = Path(root).expanduser()
        if not path.is_dir():
            msg = f"RepoIndex needs a repository folder; {str(root)!r} is not a folder."
            raise InvalidParameterError(msg)
        self.root = path.resolve()
        self._tree = FileTree(
            self.root, max_file_bytes=max_file_bytes, max_files=max_files, max_total_bytes=max_total_bytes
        )
        self.max_memory_bytes = max_memory_bytes
        self._entries: dict[str, FileEntry] = {}
        self._versions: dict[str, object] = {}
        """The version of each file read, indexed or left out for memory (not read again unchanged)."""
        self._held: dict[str, int] = {}
        """What each indexed file's tables hold (:func:`held_bytes`)."""
        self._held_total = 0
        self._noticed = False
        self._tables = Tables()
        self._words = WordIndex()
        self._imports: dict[str, frozenset[str]] = {}
        self._modules: dict[str, str] = {}
        self._recent: list[str] = []
        self._counters: OrderedDict[Callable[[str], int], TokenCounts] = OrderedDict()
        self._lock = threading.RLock()
        """Held by every public method: a lookup reads the tables a refresh rewrites."""
        self._tree.scan()
        self._sync()

    @property
    def files(self) -> list[str]:
        """The indexed files, relative to ``root`` (``/``-separated), sorted."""
        with self._lock:
            self._refresh()
            return sorted(self._entries)

    def text(self, file_path: str) -> str | None:
        """The text of an indexed file as the latest lookup saw it (None if it is not indexed)."""
        with self._lock:
            entry = self._entries.get(self._relative(file_path))
            return None if entry is None else entry.text

    def refresh(self) -> None:
        """See changed, added and deleted files now (every lookup does this itself)."""
        with self._lock:
            self._refresh()

    def touch(self, file_path: str) -> None:
        """Record ``file_path`` as seen in a request (a ranking signal; every lookup records its file)."""
        rel = self._relative(file_path)
        with self._lock:
            self._touch(rel)

    def context_files(
        self,
        file_path: str,
        prefix: str,
        suffix: str = "",
        *,
        max_tokens: int,
        count_tokens: Callable[[str], int],
        one_per_file: bool = False,
    ) -> list[ContextFile]:
        """Other files' code related to the hole in ``file_path``, in prompt order, within ``max_tokens``.

        Each result names an indexed file by its path relative to ``root``; its text is that file's own
        lines in their order (signature lines, whole short definitions), with a line ``⋮`` where lines
        were left out next to an excerpt. The hole's own file is never included. Each file costs
        ``count_tokens(path) + count_tokens(text) + 2`` (the ``<file_sep>`` and the newline after the
        path), and the results' costs sum to at most ``max_tokens``.

        A file may come twice, once in each part of the context (the part that stays put while the
        cursor moves inside a definition, and the part near the cursor); ``one_per_file=True`` gives
        each file once, its lines of both parts together, where the second part placed it (retrievers).
        ``file_path`` "" is a hole in no file of the repository (a query).
        """
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            msg = f"max_tokens must be an integer >= 0, not {max_tokens!r}."
            raise InvalidParameterError(msg)
        if not callable(count_tokens):
            msg = "count_tokens must be a function text -> number of tokens (e.g. engine.count_tokens)."
            raise InvalidParameterError(msg)
        rel = self._relative(file_path)
        with self._lock:
            self._refresh()
            on_disk = self._on_disk(rel, prefix, suffix)
            outside, near = self._holes(rel, prefix, suffix, on_disk)
            related = self._related(rel, prefix, suffix, on_disk)
            self._touch(rel)
            query = (
                tail_lines(prefix, WINDOW_QUERY_LINES) + "\n" + head_lines(suffix, WINDOW_QUERY_LINES // 2)
            )
            windows = self._words.windows(query, self._entries, rel)
            stable, around = outline_candidates((outside, near), self._entries, self._tables, related)
            return self._fit(rel, (stable, around), related, windows, max_tokens, count_tokens, one_per_file)

    def _refresh(self) -> None:
        if self._tree.refresh():
            self._sync()

    def _touch(self, rel: str) -> None:
        if not rel:
            return  # a query of no file
        if rel in self._recent:
            self._recent.remove(rel)
        self._recent.append(rel)
        del self._recent[: -RECENT_FILES - 1]  # one more: the others stay the same after the hole's

    # --- packing to the exact budget ------------------------------------------------------------

    def _fit(
        self,
        hole_path: str,
        candidates: tuple[Iterable[tuple[float, str, Unit]], Iterable[tuple[float, str, Unit]]],
        related: Related,
        windows: list[Window],
        max_tokens: int,
        count_tokens: Callable[[str], int],
        one_per_file: bool,
    ) -> list[ContextFile]:
        counts = self._token_counts(count_tokens)
        stable, near = candidates
        # Estimated by lines, checked exactly: a budget missed or underused by the estimate is scaled
        # and tried again; the fullest try that fits wins (deterministic for the same request).
        budget = float(max_tokens)
        best: list[ContextFile] = []
        best_spent = -1
        for _ in range(FIT_TRIES):
            limits = (STABLE_SHARE * max_tokens, budget)  # the first part's is the same at every try
            first, second, windowed = select(stable, near, windows, self._entries, limits, counts)
            parts = [
                (part[path], path)
                for part, paths in (
                    (first, order_files(first, set(), related, hole_path)),
                    (second, order_files(second, windowed, related, hole_path)),
                )
                for path in paths
            ]
            if one_per_file:  # a file's lines of both parts (never the same line) where it comes last
                last = {path: k for k, (_, path) in enumerate(parts)}
                parts = [({**first.get(path, {}), **second.get(path, {})}, path) for path in last]
                parts.sort(key=lambda p: last[p[1]])
            files = [ContextFile(path, render(self._entries[path], lines)) for lines, path in parts]
            spent = sum(file_cost(f, counts) for f in files)
            if best_spent < spent <= max_tokens:
                best, best_spent = files, spent
            if not first and not second and not stable and not near and not windows:
                break
            if 0.95 * max_tokens <= spent <= max_tokens:
                break
            budget *= 1.5 if not spent else max_tokens / spent * (0.98 if spent > max_tokens else 1.0)
        if best_spent <= 0:  # every try missed: the last one without its least related files
            while files and sum(file_cost(f, counts) for f in files) > max_tokens:
                files.pop(0)
            best = files
        return best

    def _token_counts(self, count_tokens: Callable[[str], int]) -> TokenCounts:
        """The counts ``count_tokens`` gave so far (none kept for an unhashable counter)."""
        try:
            counts = self._counters.pop(count_tokens, None) or TokenCounts(count_tokens)
        except TypeError:
            return TokenCounts(count_tokens)
        self._counters[count_tokens] = counts  # the latest last
        if len(self._counters) > COUNTERS_KEPT:
            self._counters.popitem(last=False)
        return counts

    # --- keeping the tables in step with the files ----------------------------------------------

    def _sync(self) -> None:
        current = self._tree.files
        changed = False
        for rel in [r for r in self._versions if r not in current]:
            changed |= self._forget(rel)
        for rel, version in current.items():
            if self._versions.get(rel) == version:
                continue
            changed |= self._forget(rel)  # a file that no longer reads as one is dropped here
            text = read_beneath(str(self.root), rel, self._tree.max_file_bytes)
            if text is None:
                continue
            self._versions[rel] = version
            # held_bytes is at least the text twice (text, lines) and the file's own: a full index
            # leaves a file out without parsing it.
            held = 2 * len(text) + HELD_PER_FILE
            if self._held_total + held <= self.max_memory_bytes:
                entry = FileEntry.build(rel, text)
                held = held_bytes(entry)
            if self._held_total + held > self.max_memory_bytes:
                self._left_out(rel, held)
                continue
            self._held[rel] = held
            self._held_total += held
            self._entries[rel] = entry
            self._tables.add(entry)
            self._words.add(entry)
            changed = True
        if changed:
            self._modules = _python_modules(self._entries)
            self._imports = {
                rel: self._resolve(rel, (spec for spec, _, _ in e.symbols.imports))
                for rel, e in self._entries.items()
            }

    def _left_out(self, rel: str, held: int) -> None:
        if not self._noticed:  # once per index: a big repository leaves out many
            self._noticed = True
            notice = (
                f"RepoIndex({str(self.root)!r}) left out {rel!r} and may leave out more: the files indexed "
                f"hold {self._held_total / 1e6:.0f} MB of max_memory_bytes={self.max_memory_bytes:_}, and "
                f"this one's tables would take {held / 1e6:.1f} MB (estimated). Raise max_memory_bytes, "
                "or index a smaller folder."
            )
            warnings.warn(notice, RepoMemoryNotice, stacklevel=4)  # at the caller of RepoIndex()

    def _forget(self, rel: str) -> bool:
        """Drop a file's tables; whether it had any."""
        entry = self._entries.pop(rel, None)
        self._versions.pop(rel, None)
        self._held_total -= self._held.pop(rel, 0)
        if entry is None:
            return False
        self._tables.remove(entry)
        self._words.remove(entry)
        return True

    def _related(self, rel: str, prefix: str, suffix: str, on_disk: FileEntry | None = None) -> Related:
        on_disk = on_disk or self._on_disk(rel, prefix, suffix)
        imported = self._resolve(rel, self._hole_imports(rel, prefix, suffix, on_disk)) - {rel}
        importers = frozenset(p for p, deps in self._imports.items() if rel in deps and p != rel)
        second = frozenset(q for p in imported for q in self._imports.get(p, ())) - imported - {rel}
        # The most recent others: which the hole's own file, seen or not, does not change.
        recent = [p for p in self._recent if p != rel][-RECENT_FILES:]
        return Related(imported, importers, second, recent)

    def _holes(self, rel: str, prefix: str, suffix: str, on_disk: FileEntry | None) -> tuple[Hole, Hole]:
        """The hole as the context's two parts see it. The first part's: the names of the file outside
        the definition the cursor is in, and as the names "near" the cursor those of its signature and
        the file's imports (the same for every cursor position inside the definition). The second
        part's: the names of the whole file and, as near, of the definition's code the editor shows
        and the imports (or of the lines around the cursor, outside a definition or in a long one)."""
        file_words = self._hole_words(on_disk, prefix, suffix)
        around = Hole.of(rel, prefix, suffix, file_words)
        first = prefix.count("\n")  # the cursor's line
        inner = None
        if on_disk is not None:
            text = on_disk.text
            last = first + text.count("\n", len(prefix), len(text) - len(suffix))  # the hole's last line
            for d in on_disk.symbols.definitions:  # sorted by start: the last that holds the hole
                if d.start > first:
                    break
                if d.kind in ("function", "class") and d.end >= last:
                    inner = d
        if inner is None or on_disk is None:
            # No definition known around the cursor: the top-level block it is in, by indentation.
            start = _block_start(prefix)
            head = prefix[start : prefix.find("\n", start)] if prefix.count("\n", start) else ""
            words = frozenset(WORD.findall(prefix[:start])) | frozenset(
                WORD.findall(suffix[_block_end(suffix) :])
            )
            return Hole.outside(rel, words, head), around
        inside = Counter(WORD.findall("\n".join(on_disk.lines[inner.start : inner.end + 1])))
        words = frozenset(w for w, n in on_disk.counts.items() if n > inside.get(w, 0))
        head = on_disk.lines[inner.start : inner.header_end + 1] if inner.header_end < first else []
        # What the file imports is about to be used: as good as near, for both parts.
        imports = [
            line
            for _, a, b in on_disk.symbols.imports
            if b < inner.start or a > inner.end
            for line in on_disk.lines[a : b + 1]
        ]
        outside = Hole.outside(rel, words, "\n".join(head), "\n".join(imports))
        if inner.end - inner.start > MAX_NEAR_LINES:
            return outside, around
        near = tail_lines(prefix, first - inner.start + 1) + "\n" + head_lines(suffix, inner.end - last + 1)
        return outside, Hole.outside(rel, around.file_words, near, "\n".join(imports))

    def _on_disk(self, rel: str, prefix: str, suffix: str) -> FileEntry | None:
        """The indexed hole's file if it starts with the prefix and ends with the suffix (an editor's
        saved file around the line being typed): its tables then stand for the editor's text."""
        entry = self._entries.get(rel)
        if entry is None or len(prefix) + len(suffix) > len(entry.text):
            return None
        return entry if entry.text.startswith(prefix) and entry.text.endswith(suffix) else None

    @staticmethod
    def _hole_words(on_disk: FileEntry | None, prefix: str, suffix: str) -> frozenset[str] | None:
        """The names of prefix and suffix from the file's counts less the hole's (no big regex scan)."""
        if on_disk is None:
            return None
        hidden = Counter(WORD.findall(on_disk.text[len(prefix) : len(on_disk.text) - len(suffix)]))
        if not hidden:
            return on_disk.words
        return frozenset(w for w, n in on_disk.counts.items() if n > hidden.get(w, 0))

    def _hole_imports(self, rel: str, prefix: str, suffix: str, on_disk: FileEntry | None) -> list[str]:
        """The imports of the editor's text: those of the file on disk outside the hole when the disk
        file has the same prefix and suffix (no parse), else the editor's text parsed."""
        if on_disk is None:
            return [spec for spec, _, _ in parse(rel, prefix + suffix, imports_only=True).imports]
        text = on_disk.text
        first = prefix.count("\n")
        last = first + text.count("\n", len(prefix), len(text) - len(suffix))
        return [spec for spec, start, end in on_disk.symbols.imports if end < first or start > last]

    def _resolve(self, rel: str, specs: Iterable[str]) -> frozenset[str]:
        found = set()
        for spec in specs:
            path = _resolve_python(rel, spec, self._modules) if rel.endswith((".py", ".pyi")) else None
            if path is None and spec.startswith("."):
                path = self._resolve_relative(rel, spec)
            if path is not None:
                found.add(path)
        return frozenset(found)

    def _resolve_relative(self, rel: str, spec: str) -> str | None:
        base = os.path.normpath(os.path.join(os.path.dirname(rel), spec)).replace(os.sep, "/")
        for ending in _JS_ENDINGS:
            if base + ending in self._entries:
                return base + ending
        return None

    def _relative(self, file_path: str | os.PathLike[str]) -> str:
        return relative_path(self.root, file_path)


def _block_start(prefix: str) -> int:
    """Where the last line of ``prefix`` that starts with code, not indentation, starts (0 if none)."""
    start = prefix.rfind("\n") + 1  # the cursor's line
    while start > 0 and (start == len(prefix) or prefix[start].isspace()):
        start = prefix.rfind("\n", 0, start - 1) + 1
    return start


def _block_end(suffix: str) -> int:
    """Where the first line after the cursor's in ``suffix`` that starts without indentation starts."""
    at = suffix.find("\n")
    while 0 <= at < len(suffix) - 1:
        if not suffix[at + 1].isspace():
            return at + 1
        at = suffix.find("\n", at + 1)
    return len(suffix)


def _python_modules(entries: dict[str, FileEntry]) -> dict[str, str]:
    modules = {}
    for rel in sorted(entries, key=len, reverse=True):  # the shortest path wins a tie
        if rel.endswith((".py", ".pyi")):
            dotted = rel.rsplit(".", 1)[0].replace("/", ".").removesuffix(".__init__")
            modules[dotted] = rel
    return modules


def _resolve_python(rel: str, spec: str, modules: dict[str, str]) -> str | None:
    if spec.startswith("."):
        dots = len(spec) - len(spec.lstrip("."))
        package = rel.split("/")[:-1]
        if dots > 1:
            package = package[: len(package) - (dots - 1)]
        rest = spec[dots:]
        name = ".".join([*package, rest] if rest else package)
        return modules.get(name)
    parts = spec.split(".")
    for k in range(len(parts)):  # the repository may be the package's folder or one above it
        found = modules.get(".".join(parts[k:]))
        if found is not None:
            return found
    return None
