"""From generated token ids to text chunks.

A :class:`ChunkSink` runs on the backend's thread (see :mod:`langchain_starcoder.backends`): it
detokenizes UTF-8-safely and ends the generation at stop ids (:class:`TextStream`), passes the text
through the job's filters in order (:mod:`.filter`: stop strings, where a FIM middle ends, the suffix
overlap, a constraint's verdict), and hands out chunks only when there is text to show. The chunks go
to a caller through :mod:`.streams`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..types import CompletionChunk, GenerationParams

if TYPE_CHECKING:
    from .filter import Filter

Emit = Callable[[Any], None]
# ChunkSink.start without prompt_seconds: the prompt is timed from start to the first token.
_TIMED_HERE: Any = ...


class TextStream:
    """One generation's text: streaming UTF-8-safe detokenization and stop ids."""

    def __init__(self, tokenizer: Any, params: GenerationParams):
        self._detokenizer = tokenizer.detokenizer  # a fresh copy per access
        self._stop_ids = params.stop_token_ids
        self.token_ids: list[int] = []
        self._sent = 0  # token_ids before this one went out with a chunk
        self.finish_reason: str | None = None

    def add(self, token: int) -> str:
        """Take one generated token; return the text that became whole (maybe ""). At a stop id
        (``finish_reason`` "stop"), the rest of the text."""
        self.token_ids.append(token)
        if token in self._stop_ids:
            self.finish_reason = "stop"
            return self._drain()
        self._detokenizer.add_token(token)
        return self._detokenizer.last_segment

    def take_ids(self) -> list[int]:
        ids, self._sent = self.token_ids[self._sent :], len(self.token_ids)
        return ids

    def finish(self, reason: str) -> str:
        """End the stream (if it has not stopped) and return the last text."""
        if self.finish_reason is not None:
            return ""
        self.finish_reason = reason
        return self._drain()

    def _drain(self) -> str:
        self._detokenizer.finalize()
        return self._detokenizer.last_segment


class ChunkSink:
    """A backend's :class:`~langchain_starcoder.backends.TokenSink` that emits :class:`CompletionChunk`\\ s.

    The text goes through ``filters`` in order (a :class:`~.filter.Filter` may hold text back, or
    end the generation). The last chunk carries ``finish_reason`` (as the filters settle it), the
    counts and timings; it also carries the text of the last token when the generation ends at
    ``max_tokens``, so no stream ends on an empty chunk then.
    """

    def __init__(
        self,
        tokenizer: Any,
        params: GenerationParams,
        prompt_tokens: int,
        emit: Emit,
        filters: Sequence[Filter] = (),
    ):
        self._text = TextStream(tokenizer, params)
        self._filters = tuple(filters)
        self._live = 0  # the filters from this one on are finished at the end
        self._max_tokens = params.max_tokens
        self._prompt_tokens = prompt_tokens
        self._emit = emit
        self._cached = 0
        self._started = self._first = 0.0
        self._prompt_seconds: Any = _TIMED_HERE  # or the backend's figure (None: unknown)
        self._held = ""  # text that goes out with the last chunk
        self._accepted = self._drafted = 0

    def start(self, cached_tokens: int, prompt_seconds: float | None = _TIMED_HERE) -> None:
        self._cached = cached_tokens
        self._started = time.perf_counter()
        self._prompt_seconds = prompt_seconds

    def token(self, token_id: int) -> bool:
        self._first = self._first or time.perf_counter()
        stream = self._text
        piece = stream.add(token_id)
        if stream.finish_reason is not None:  # a stop id: the text is complete
            piece = self._last(piece, cut=False)
        elif piece:
            for f in self._filters:
                piece = f.feed(piece)
                if f.ended is not None:
                    self._end(f)
                if not piece:
                    break
        stopped = stream.finish_reason is not None
        if stopped or len(stream.token_ids) >= self._max_tokens:
            self._held += piece  # the last chunk is next
        elif piece:
            self._emit(CompletionChunk(piece, stream.take_ids()))
        return stopped

    def speculated(self, accepted: int, drafted: int) -> None:
        self._accepted, self._drafted = accepted, drafted

    def finish(self, cached_tokens: int | None = None) -> None:
        end = time.perf_counter()
        if cached_tokens is not None:
            self._cached = cached_tokens
        first = self._first or end
        timed = self._prompt_seconds is _TIMED_HERE
        stream = self._text
        rest = stream.finish("length")  # "" once stopped
        # only an answer the model or a filter ended (an end token, a stop string) has a whole last line
        text = self._held + self._last(rest, cut=stream.finish_reason != "stop")
        reason = stream.finish_reason
        last: dict[str, Any] = {"constrained": False}
        for f in self._filters:
            reason = f.settle(reason, last)
        self._emit(
            CompletionChunk(
                text,
                stream.take_ids(),
                finish_reason=reason,
                prompt_tokens=self._prompt_tokens,
                cached_tokens=self._cached,
                completion_tokens=len(stream.token_ids),
                prompt_seconds=first - self._started if timed else self._prompt_seconds,
                generation_seconds=end - first,
                accepted_draft_tokens=self._accepted,
                draft_tokens=self._drafted,
                **last,
            )
        )

    def _end(self, by: Filter) -> None:
        """``by`` ended the text: the generation stops, and the filters before it are done."""
        if self._text.finish_reason is None:
            self._text.finish_reason = "stop"
            self._live = self._filters.index(by)

    def _last(self, text: str, *, cut: bool) -> str:
        """The rest of the text: ``text`` through the filters not done yet, each finished."""
        for f in self._filters[self._live :]:
            text = (f.feed(text) if text else "") + f.finish(cut=cut)
        self._live = len(self._filters)
        return text
