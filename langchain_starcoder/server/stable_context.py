"""Context files in a stable order between keystrokes, so that the prompt cache's common prefix stays long.

The prompt lays out the context files first and the hole last; the engine reuses the KV cache up to the
first token that differs from a recent prompt. A context whose files come in another order at the next
keystroke (a repository index ranks its picks anew for every prefix, a client sorts its chunks by score)
moves that point to the first moved file, and everything after it is prefilled again. So each document's
files keep the order they had last time: files seen before come first, in their previous order, and new
ones follow in the order given. Nothing is reused inexactly: the prompt is built from scratch and the
cache serves only its exact common prefix. StarCoder2 was trained with a repository's files in random
order (its paper, section 5, as summaries quote it), so no order is out of its distribution.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from ..fim_request import ContextFile
from .supersede import Document

#: Documents whose order is remembered (least recently used go first).
MAX_DOCUMENTS = 256


class ContextOrders:
    """The order each document's context files had in its last request."""

    def __init__(self, max_documents: int = MAX_DOCUMENTS):
        self._last: OrderedDict[Document, tuple[ContextFile, ...]] = OrderedDict()
        self._max = max_documents

    def order(self, document: Document | None, files: Sequence[ContextFile]) -> list[int]:
        """The positions of ``files`` in the order to lay them out: those of the document's last request
        first, in that order, then the others as given. As given without a document."""
        if document is None:
            return list(range(len(files)))
        waiting: dict[ContextFile, list[int]] = {}
        for i, file in enumerate(files):
            waiting.setdefault(file, []).append(i)
        before = [waiting[file].pop(0) for file in self._last.get(document, ()) if waiting.get(file)]
        taken = set(before)
        order = before + [i for i in range(len(files)) if i not in taken]
        self._last[document] = tuple(files[i] for i in order)
        self._last.move_to_end(document)
        while len(self._last) > self._max:
            self._last.popitem(last=False)
        return order


def reordered_used(used_in_order: Sequence[str], order: Sequence[int], given: int) -> list[str]:
    """``input_extra_used`` in the client's order: ``used_in_order[k]`` is about file ``order[k]``, and
    the client gave files ``0 .. given-1`` (the others are the server's repository context)."""
    by_position = dict(zip(order, used_in_order, strict=True))
    return [by_position[i] for i in range(given)]
