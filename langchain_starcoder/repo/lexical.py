"""Lexical retrieval: the 20-line windows (stride 10) of other files that share the most rare words with
the code around the hole (RepoCoder's sparse retrieval, over an inverted index kept in step with the
files, so an edit is searchable at the next lookup without rebuilding anything)."""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, field

from .chunks import FileEntry, Unit
from .symbols import WORD

WINDOW_LINES = 20
WINDOW_STRIDE = 10
#: Files searched window by window, of those sharing the most rare words with the query.
TOP_FILES = 6
#: A word in more than this share of the files says nothing about relatedness.
COMMON_SHARE = 0.3
#: A window: its score, file, first and last line (plain values, which the garbage collector leaves).
Window = tuple[float, str, int, int]


@dataclass
class WordIndex:
    """Which files use each word."""

    files_with: defaultdict[str, dict[str, None]] = field(default_factory=lambda: defaultdict(dict))
    """Per word, the files using it (a dict of plain strings: the garbage collector skips it)."""
    files: int = 0

    def add(self, entry: FileEntry) -> None:
        self.files += 1
        for word in entry.words:
            self.files_with[word][entry.path] = None
        window_postings(entry)  # made now: the first lookups that reach a big file do not pay for it

    def remove(self, entry: FileEntry) -> None:
        self.files -= 1
        for word in entry.words:
            paths = self.files_with.get(word)
            if paths is not None:
                paths.pop(entry.path, None)
                if not paths:
                    del self.files_with[word]

    def windows(self, query: str, entries: dict[str, FileEntry], exclude: str) -> list[Window]:
        """The windows of other files best matching ``query``, best first."""
        n = max(self.files, 1)
        weights = {}
        for word in dict.fromkeys(WORD.findall(query)):  # in order: scores summed the same each run
            df = len(self.files_with.get(word, ()))
            if 0 < df <= max(1, COMMON_SHARE * n):
                weights[word] = math.log(1 + n / df)
        scores: defaultdict[str, float] = defaultdict(float)
        for word, weight in weights.items():
            for path in self.files_with[word]:
                scores[path] += weight
        scores.pop(exclude, None)
        found = []
        for path in heapq.nlargest(TOP_FILES, scores, key=lambda p: (scores[p], p)):
            entry = entries[path]
            postings = window_postings(entry)
            by_start: defaultdict[int, float] = defaultdict(float)
            for word, weight in weights.items():  # only the windows holding a query word are touched
                for start in postings.get(word, ()):
                    by_start[start] += weight
            last = len(entry.lines) - 1
            for start, score in by_start.items():
                end = min(start + WINDOW_LINES - 1, last)
                found.append((score, path, start, end))
        found.sort(key=lambda w: (-w[0], w[1], w[2]))
        return found


def window_unit(window: Window) -> Unit:
    """The excerpt a window shows (made only when packing reaches it: a lookup finds thousands)."""
    _, path, start, end = window
    return Unit(path, start, end, None, excerpt=True)


def window_postings(entry: FileEntry) -> dict[str, tuple[int, ...]]:
    """Per word, the first lines of the file's windows that hold it (made once per file version; a
    window is lines ``start .. start + WINDOW_LINES - 1``)."""
    if entry.windows is None:
        lines = entry.lines
        starts = range(0, max(len(lines) - WINDOW_LINES + WINDOW_STRIDE, 1), WINDOW_STRIDE)
        last = starts[-1]
        postings: defaultdict[str, list[int]] = defaultdict(list)
        for b in range(0, len(lines), WINDOW_STRIDE):
            # A stride block's lines lie in the windows starting at it and the block before (the
            # last window runs to the file's end).
            block = min(b, last)
            first = block - WINDOW_LINES + WINDOW_STRIDE
            mine = [s for s in range(first, block + 1, WINDOW_STRIDE) if s >= 0 and s + WINDOW_LINES > b]
            for word in set(WORD.findall("\n".join(lines[b : b + WINDOW_STRIDE]))):
                held = postings[word]
                for s in mine:
                    if not held or held[-1] < s:
                        held.append(s)
        entry.windows = {word: tuple(starts) for word, starts in postings.items()}  # tuples: left by the GC
    return entry.windows
