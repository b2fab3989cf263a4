"""Supersession: a newer editor request for the same document cancels the older one still running.

An editor asks for a completion at every pause in typing, and the answer to the previous pause is useless
once the next request is sent, whether or not the editor hangs up (llama.vim and llama.vscode keep their
connection open). So each fill-in-the-middle request claims its document: its partition (on the HTTP
server the tenant of its API key and its ``cache_salt``, server/tenants.py; in JupyterLab the Jupyter user),
the hole's path (``file_path``; the notebook's or file's path) and the llama.cpp ``id_slot`` it names, so no
request supersedes another partition's. A newer claim of the same document stops the older request at its
next step through the engine's own cancellation (closing its stream, as a client that leaves does), and the
older one answers as cancelled (the server's ``finish_reason`` :data:`CANCELLED`; Jupyter's "superseded").
A request that names neither a path nor a slot claims nothing: nothing says which document it is.

A warm-up (nothing to generate: ``n_predict``/``max_tokens`` 0, Jupyter's ``warm_up``) never cancels a
request that generates (someone waits for that one's answer); any newer request cancels it (its prefill so
far stays cached). The answer of the newer request is exactly what it would be alone: nothing of the older
one is reused but the prompt cache, which is exact.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from ..types import CompletionChunk

#: ``finish_reason`` (and llama.cpp ``stop_type``) of an answer a newer request for its document cancelled.
CANCELLED = "cancelled"


@dataclass(frozen=True)
class Document:
    """Which requests supersede each other, and whose memory (stable prefix, context order) is shared:
    one partition's hole in one file and slot."""

    partition: str
    """Whose document: the server's tenant and ``cache_salt`` (server/tenants.py ``partition``; "" for the
    shared one), or the Jupyter user."""
    path: str | None
    """A digest of the hole's ``file_path`` (a client's path may be long: the memories keep the digest)."""
    slot: int | None


def document_of(partition: str | None, path: Any, slot: Any) -> Document | None:
    """The document a request of ``partition`` is about, or None when it names neither a path nor a slot."""
    has_path = isinstance(path, str) and path != ""
    has_slot = isinstance(slot, int) and not isinstance(slot, bool) and slot >= 0
    if not has_path and not has_slot:
        return None
    digest = hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest()[:32] if has_path else None
    return Document(partition or "", digest, slot if has_slot else None)


@dataclass(eq=False)
class Claim:
    """One running request's hold on its document; ``superseded`` is set when a newer one takes it."""

    document: Document | None
    warm_up: bool
    superseded: asyncio.Event = field(default_factory=asyncio.Event)
    _on_supersede: list[Callable[[], Any]] = field(default_factory=list)

    def on_supersede(self, callback: Callable[[], Any]) -> None:
        """Call ``callback`` (once) when a newer request supersedes this one."""
        self._on_supersede.append(callback)

    def supersede(self) -> None:
        if self.superseded.is_set():
            return
        self.superseded.set()
        for callback in self._on_supersede:
            callback()


class Documents:
    """The running requests of each document (on the event loop's thread only: no locks)."""

    def __init__(self) -> None:
        self._running: dict[Document, list[Claim]] = {}

    def claim(self, document: Document | None, *, warm_up: bool) -> Claim:
        """Take ``document`` for a new request, superseding the older requests it outranks."""
        claim = Claim(document, warm_up)
        if document is None:
            return claim
        running = self._running.setdefault(document, [])
        for older in running:
            if older.warm_up or not warm_up:  # a warm-up never cancels an answer someone waits for
                older.supersede()
        running.append(claim)
        return claim

    def release(self, claim: Claim) -> None:
        running = self._running.get(claim.document) if claim.document is not None else None
        if running is None or claim not in running:
            return
        running.remove(claim)
        if not running:
            del self._running[claim.document]  # type: ignore[arg-type]

    def __len__(self) -> int:
        return sum(len(claims) for claims in self._running.values())


def supersedable(
    documents: Documents | None,
    document: Document | None,
    stream: AsyncIterator[CompletionChunk],
    prompt_tokens: int | None,
    *,
    warm_up: bool = False,
) -> AsyncIterator[CompletionChunk]:
    """``stream`` (the engine's own, whose ``aclose`` cancels its generation) claimed for ``document``:
    a newer request's claim closes it and its last chunk says :data:`CANCELLED`. With no registry (the
    server's supersession off) or no document, ``stream`` as it is."""
    if documents is None or document is None:
        return stream
    return _until_superseded(documents, documents.claim(document, warm_up=warm_up), stream, prompt_tokens)


async def _until_superseded(
    documents: Documents, claim: Claim, stream: AsyncIterator[CompletionChunk], prompt_tokens: int | None
) -> AsyncIterator[CompletionChunk]:
    # The engine's stream is closed from the newer request's handler: that ends the generation at its
    # next step (or before it starts) and the pending read here, with no task per chunk.
    claim.on_supersede(lambda: asyncio.ensure_future(stream.aclose()))  # type: ignore[attr-defined]
    started = time.perf_counter()
    first: float | None = None
    generated = 0
    try:
        async for chunk in stream:
            if first is None and chunk.token_ids:
                first = time.perf_counter()
            generated += len(chunk.token_ids)
            yield chunk
            if chunk.finish_reason is not None:
                return
        if claim.superseded.is_set():
            now = time.perf_counter()
            yield CompletionChunk(
                "",
                [],
                finish_reason=CANCELLED,
                prompt_tokens=prompt_tokens,
                cached_tokens=None,
                completion_tokens=generated,
                prompt_seconds=None if first is None else first - started,
                generation_seconds=0.0 if first is None else now - first,
            )
    finally:
        documents.release(claim)
        await stream.aclose()  # type: ignore[attr-defined]
