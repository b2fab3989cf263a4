"""The hole's prefix keeps its start while the editor's window slides down the file.

llama.vim sends the N lines before the cursor as ``input_prefix`` (llama.vscode likewise): at each newline
that window slides down by a line, so the prompt's prefix changes from its first token, and the engine's
prompt cache (exact: it reuses the KV only up to the first token that differs) prefills the whole prefix
again, and in PSM the suffix after it. llama-server hides this with ``--cache-reuse``, which shifts KV
chunks that moved: not exact. Here, instead, each document (:class:`~.supersede.Document`: the tenant and
``cache_salt``, the hole's ``file_path``, the ``id_slot``) remembers the prefix its last request was run with.
When a new request's prefix is that text's window slid down (its first line starts a line of the remembered
text, and from there to the remembered text's last complete line the two agree, over enough lines and enough
non-blank text to say where in the file the window is: the remembered cursor line may have changed since),
the lines the window dropped are put back above it, so the prompt starts where the last one did and the cache
serves it up to the newly typed text. A short text (two blank lines and ``def main(``) matches nothing: it
cannot pull the lines another request of the partition sent for that path.

Exact: the prompt is built from scratch and holds only the file's text as this server last saw it (what a
client with a larger window would send); the cache serves only its exact common prefix, so the answer is
``engine.infill``'s on the longer prefix, and may differ from the answer to the window alone. Texts that
disagree (an edit above the window's start or inside it, another file in the same slot, a window that
moved up or jumped) get nothing added: the request runs as sent and its prefix becomes the one remembered.
The server keeps the longer prefix only when its prompt cuts nothing (the FIM builder would cut the prefix
from its start, or take the room of the client's files); otherwise it starts again from the window as sent,
in one step, so that the next many keystrokes reuse the cache again.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .supersede import Document

if TYPE_CHECKING:  # (types only: the Jupyter server imports this at its start)
    from ..fim.build import FIMPrompt
    from ..fim.request import ContextFile, FIMRequest

#: Documents whose prefix is remembered (the least recently used is forgotten first).
MAX_DOCUMENTS = 128
#: The most characters a document's remembered prefix may have (StarCoder2's 16,384-token context holds
#: about 64 K characters of code): a longer one is not kept, and the next request starts from its window.
MAX_CHARS = 1 << 17
#: Lines the windows must share at least (and half the new window's lines): a shorter overlap of
#: generic lines (a blank line, a lone bracket) says little about where the window is.
MIN_OVERLAP_LINES = 2
#: Non-blank characters the windows must share at least: blank lines and a lone bracket match any file.
MIN_OVERLAP_CHARS = 16


def slid_start(old: str, new: str) -> int | None:
    """Where ``new`` starts in ``old`` when ``new`` is ``old``'s window slid down: a line start ``k`` > 0
    of ``old`` from which ``old``'s complete lines are the start of ``new``, over at least
    :data:`MIN_OVERLAP_LINES` lines and half of ``new``'s, holding :data:`MIN_OVERLAP_CHARS` non-blank
    characters. The first such ``k`` (the longest overlap); None when there is none or ``new`` starts where
    ``old`` does (nothing to add)."""
    known = old[: old.rfind("\n") + 1]  # complete lines only: the old cursor line may have grown or changed
    first_end = new.find("\n") + 1
    if not known or first_end == 0:
        return None
    first = new[:first_end]
    min_lines = max(MIN_OVERLAP_LINES, new.count("\n") // 2)
    # The overlap is at most ``new``: candidates start no earlier than its length from the end.
    k = known.find(first, max(0, len(known) - len(new)))
    while k != -1:
        if (k == 0 or known[k - 1] == "\n") and known.startswith(new[: len(known) - k], k):
            if known.count("\n", k) < min_lines or _non_blank(known, k) < MIN_OVERLAP_CHARS:
                return None  # later candidates overlap even less
            return k or None
        k = known.find(first, k + 1)
    return None


def _non_blank(text: str, start: int) -> int:
    """The characters of ``text[start:]`` that are not whitespace."""
    return sum(len(word) for word in text[start:].split())


class StablePrefixes:
    """The prefix each document's last request was run with."""

    def __init__(self, max_documents: int = MAX_DOCUMENTS, max_chars: int = MAX_CHARS):
        self._last: OrderedDict[Document, str] = OrderedDict()
        self._max_documents = max_documents
        self._max_chars = max_chars

    def extended(self, document: Document, prefix: str) -> str | None:
        """``prefix`` with the remembered lines above it when it is the last prefix's window slid down
        (:func:`slid_start`) and the result is not over the per-document limit; else None."""
        old = self._last.get(document)
        k = None if old is None else slid_start(old, prefix)
        if old is None or k is None or k + len(prefix) > self._max_chars:
            return None
        return old[:k] + prefix

    def remember(self, document: Document, prefix: str) -> None:
        """``prefix`` is what ``document``'s request ran with. An empty one (llama.vim's ring-buffer update
        has no hole) and one over the limit leave the memory as it is, or forget the document."""
        if not prefix:
            return
        if len(prefix) > self._max_chars:
            self._last.pop(document, None)
            return
        self._last[document] = prefix
        self._last.move_to_end(document)
        while len(self._last) > self._max_documents:
            self._last.popitem(last=False)

    def __len__(self) -> int:
        return len(self._last)

    @property
    def chars(self) -> int:
        """The characters remembered, all documents together."""
        return sum(len(text) for text in self._last.values())


def keeps_all(prompt: FIMPrompt, request: FIMRequest, client_files: Sequence[ContextFile]) -> bool:
    """Whether ``prompt`` (of ``request``) holds its prefix and suffix whole and every one of the client's
    own context files whole: a longer prefix then took no room that the request as sent had a use for
    (the repository index's picks are made for the room the hole leaves)."""
    return (
        prompt.prefix_chars_kept == len(request.prefix)
        and prompt.suffix_chars_kept == len(request.suffix)
        and Counter(client_files) <= Counter(prompt.files_kept)
    )
