"""Context files in a stable order between keystrokes, so that the prompt cache's common prefix stays long.

The prompt lays out the context files first and the hole last; the engine reuses the KV cache up to the
first token that differs from a recent prompt. A context whose files come in another order at the next
keystroke (a repository index ranks its picks anew for every prefix, a client sorts its chunks by score)
moves that point to the first moved file, and everything after it is prefilled again. So each document's
files keep the order they had last time: files seen before come first, in their previous order, and new
ones follow in the order given. Nothing is reused inexactly: the prompt is built from scratch and the
cache serves only its exact common prefix. StarCoder2 was trained with a repository's files in random
order (its paper, section 5, as summaries quote it), so no order is out of its distribution.

Only a digest of each file (its path and text) is kept, which is all an order needs, and the digests are
bounded in number, all documents together: the memory stays under a few MB whatever the clients send (whole
files were kept before: 60 requests of 52 files of 65 KB took the server from 118 to 398 MB).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .supersede import Document

if TYPE_CHECKING:  # (types only: the Jupyter server imports this at its start)
    from ..fim.request import ContextFile

#: Documents whose order is remembered (least recently used go first).
MAX_DOCUMENTS = 256
#: File digests remembered, all documents together (least recently used documents go first; a document
#: with more files than this is not remembered): 16 bytes each, about 60 with Python's overhead.
MAX_FILES = 16_384


def file_digest(file: ContextFile) -> bytes:
    """What identifies a context file for its order: a digest of its path and text."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(file.path.encode("utf-8", "surrogatepass"))
    digest.update(b"\0")
    digest.update(file.text.encode("utf-8", "surrogatepass"))
    return digest.digest()


class ContextOrders:
    """The order each document's context files had in its last request, as digests of the files."""

    def __init__(self, max_documents: int = MAX_DOCUMENTS, max_files: int = MAX_FILES):
        self._last: OrderedDict[Document, tuple[bytes, ...]] = OrderedDict()
        self._max = max_documents
        self._max_files = max_files
        self._files = 0
        self._lock = threading.Lock()  # requests lay out their prompts in threads

    def order(self, document: Document | None, files: Sequence[ContextFile]) -> list[int]:
        """The positions of ``files`` in the order to lay them out: those of the document's last request
        first, in that order, then the others as given. As given without a document."""
        if document is None:
            return list(range(len(files)))
        digests = [file_digest(file) for file in files]
        waiting: dict[bytes, list[int]] = {}
        for i, digest in enumerate(digests):
            waiting.setdefault(digest, []).append(i)
        with self._lock:
            last = self._last.pop(document, ())
            self._files -= len(last)
            before = [waiting[digest].pop(0) for digest in last if waiting.get(digest)]
            taken = set(before)
            order = before + [i for i in range(len(files)) if i not in taken]
            if len(files) <= self._max_files:
                self._last[document] = tuple(digests[i] for i in order)
                self._files += len(files)
            while len(self._last) > self._max or self._files > self._max_files:
                self._files -= len(self._last.popitem(last=False)[1])
        return order

    def __len__(self) -> int:
        return len(self._last)

    @property
    def files(self) -> int:
        """The file digests remembered, all documents together."""
        return self._files


def reordered_used(used_in_order: Sequence[str], order: Sequence[int], given: int) -> list[str]:
    """``input_extra_used`` in the client's order: ``used_in_order[k]`` is about file ``order[k]``, and
    the client gave files ``0 .. given-1`` (the others are the server's repository context)."""
    by_position = dict(zip(order, used_in_order, strict=True))
    return [by_position[i] for i in range(given)]
