"""The filters a job's text passes through as it is decoded, one concern each: stop strings
(:mod:`.stops`), where a FIM middle ends (:mod:`.middle`), a middle that repeats the suffix
(:mod:`.overlap`), a constraint's verdict (:mod:`.grammar`). A job lists its filters (the engine's
``prepare`` picks them) and :class:`~.sink.ChunkSink` runs them in that order: each gets what the
ones before it let through.
"""

from __future__ import annotations

from typing import Any, Protocol


class Filter(Protocol):
    """One concern of decoding, applied to a generation's text as it is decoded.

    Per generation, the sink calls:

    - :meth:`feed` with each new piece of text (never empty): the filter returns what it lets
      through now (maybe ""); what it holds back (it may yet be cut) comes out of a later call. To
      end the text there, it sets :attr:`ended`: what that call returned is the last it lets through,
      and the generation stops with finish reason "stop".
    - :meth:`finish` once nothing more is decoded: the text it still holds that is kept. Only the
      filters from the one that ended the text on are finished (those before it hold text past the
      end, which is dropped).
    - :meth:`settle`, once, for the last chunk.
    """

    ended: str | None
    """What ended the text here (a stop string, why a middle ended); None while it goes on."""

    def feed(self, text: str) -> str:
        """Take the next ``text``; return the part that is safe to show."""
        ...

    def finish(self, *, cut: bool) -> str:
        """What is still held and kept, once nothing more comes. ``cut``: the generation was stopped
        before the model or a filter ended it (``max_tokens``, a cancel), so its last line may be
        unfinished."""
        ...

    def settle(self, reason: str, last: dict[str, Any]) -> str:
        """The finish reason as this filter rules it, given ``reason`` so far; the filter's fields of
        the last :class:`~langchain_starcoder.types.CompletionChunk` go in ``last``."""
        ...
