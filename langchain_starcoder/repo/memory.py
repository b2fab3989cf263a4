"""What a file's tables take in a repository index: the upper estimate ``max_memory_bytes`` counts.

The tables grow with a file's names, definitions and lines rather than its bytes (about 15 bytes per
byte of typical code, 200 for a definition on every short line), so the index bounds them by this
estimate, not by source bytes (docs/repository-context.md, "Memory").
"""

from __future__ import annotations

import sys

from .chunks import FileEntry
from .lexical import window_postings
from .symbols import name_parts

#: What a file's tables hold besides its strings, in bytes: per distinct name, definition, word part of
#: a definition's name, whole definition kept to excerpt, window posting, import, line and name use
#: (with what lookups fill in: line sizes, each name's value and shortest definition). Measured with
#: tracemalloc on generated and real files, rounded up: the estimate was 1.17 to 2.2 times what was held.
HELD_PER_NAME, HELD_PER_DEFINITION, HELD_PER_NAME_PART, HELD_PER_EXCERPT = 700, 1300, 300, 250
HELD_PER_POSTING, HELD_PER_IMPORT, HELD_PER_LINE, HELD_PER_USE, HELD_PER_FILE = 16, 3000, 200, 70, 4096


class RepoMemoryNotice(UserWarning):
    """A repository index left files out: their tables would have passed its ``max_memory_bytes``."""


def held_bytes(entry: FileEntry) -> int:
    """An upper estimate of the memory ``entry`` takes in an index's tables: its strings (text, lines,
    names) measured, the rest counted by what it holds. At least twice the text's length and
    ``HELD_PER_FILE``: what the index checks before parsing a file."""
    strings = sys.getsizeof(entry.text) + sum(map(sys.getsizeof, entry.lines)) + 8 * len(entry.lines)
    strings += sum(map(sys.getsizeof, entry.counts))
    return (
        strings
        + HELD_PER_NAME * len(entry.counts)
        + HELD_PER_DEFINITION * len(entry.symbols.definitions)
        + HELD_PER_NAME_PART * sum(len(name_parts(d.name)) for d in entry.symbols.definitions)
        + HELD_PER_EXCERPT * sum(map(len, entry.bodies.values()))
        + HELD_PER_POSTING * sum(map(len, window_postings(entry).values()))
        + HELD_PER_IMPORT * len(entry.symbols.imports)
        + HELD_PER_LINE * len(entry.lines)
        + HELD_PER_USE * sum(entry.counts.values())
        + HELD_PER_FILE
    )
