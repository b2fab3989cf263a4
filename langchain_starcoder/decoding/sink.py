"""From generated token ids to text chunks, and from a backend's thread to the caller.

A :class:`ChunkSink` runs on the backend's thread (see :mod:`langchain_starcoder.backends`): it
detokenizes UTF-8-safely, ends the generation at stop ids and stop strings (holding back what could
be the start of one) and where a FIM middle is complete (:class:`~langchain_starcoder.ends.MiddleGate`),
trims a middle that repeats the suffix, and hands out chunks only when there is text to show.
:class:`ChunkStream` and :class:`AsyncChunkStream` are what callers iterate; leaving one early,
closing it, or dropping it unstarted cancels the generation.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..backends import Generation
from ..ends import MiddleGate
from ..fim.overlap import SuffixOverlap
from ..types import CompletionChunk, GenerationParams
from .stops import StopMatcher

if TYPE_CHECKING:
    from ..backends.grammar import Grammar

Emit = Callable[[Any], None]
# ChunkSink.start without prompt_seconds: the prompt is timed from start to the first token.
_TIMED_HERE: Any = ...
_CLOSED = object()  # put on a stream's queue by close(): wakes a reader waiting in another thread or task


class TextStream:
    """One generation's text: streaming UTF-8-safe detokenization, stop ids and stop strings."""

    def __init__(self, tokenizer: Any, params: GenerationParams):
        self._detokenizer = tokenizer.detokenizer  # a fresh copy per access
        self._matcher = StopMatcher(params.stop)
        self._stop_ids = params.stop_token_ids
        self.token_ids: list[int] = []
        self._sent = 0  # token_ids before this one went out with a chunk
        self.finish_reason: str | None = None
        self.stop_sequence: str | None = None

    def add(self, token: int) -> str:
        """Take one generated token; return the text that became safe to show (maybe "")."""
        self.token_ids.append(token)
        if token in self._stop_ids:
            self.finish_reason = "stop"
            return self._drain()
        self._detokenizer.add_token(token)
        text, self.stop_sequence = self._matcher.feed(self._detokenizer.last_segment)
        if self.stop_sequence is not None:
            self.finish_reason = "stop"
        return text

    def take_ids(self) -> list[int]:
        ids, self._sent = self.token_ids[self._sent :], len(self.token_ids)
        return ids

    def finish(self, reason: str) -> str:
        """End the stream (if it has not stopped itself) and return the last text."""
        if self.finish_reason is not None:
            return ""
        self.finish_reason = reason
        return self._drain()

    def _drain(self) -> str:
        self._detokenizer.finalize()
        text, self.stop_sequence = self._matcher.feed(self._detokenizer.last_segment)
        return text if self.stop_sequence is not None else text + self._matcher.flush()


class ChunkSink:
    """A backend's :class:`~langchain_starcoder.backends.TokenSink` that emits :class:`CompletionChunk`\\ s.

    The last chunk carries ``finish_reason``, the counts and timings; it also carries the text of
    the last token when the generation ends at ``max_tokens``, so no stream ends on an empty chunk
    then. With a ``grammar`` the whole text is checked against it once at the end (whichever backend
    wrote it): "stop" only for a full match, see :attr:`~langchain_starcoder.types.Completion.constrained`.
    """

    def __init__(
        self,
        tokenizer: Any,
        params: GenerationParams,
        prompt_tokens: int,
        emit: Emit,
        trim: str | None,
        grammar: Grammar | None = None,
        gate: MiddleGate | None = None,
    ):
        self._text = TextStream(tokenizer, params)
        self._grammar = grammar
        self._gate = gate
        self._pieces: list[str] = []  # the text shown so far, kept for the grammar's check
        self._overlap = SuffixOverlap(trim) if trim else None
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
        piece = self._shown(self._text.add(token_id))
        if self._gate is not None and self._gate.ended and self._text.finish_reason is None:
            self._text.finish_reason = "stop"  # the middle is complete: the rest of the text is cut
        stopped = self._text.finish_reason is not None
        if stopped or len(self._text.token_ids) >= self._max_tokens:
            self._held += piece  # the last chunk is next
        elif piece:
            self._emit(CompletionChunk(piece, self._text.take_ids()))
        return stopped

    def speculated(self, accepted: int, drafted: int) -> None:
        self._accepted, self._drafted = accepted, drafted

    def finish(self, cached_tokens: int | None = None) -> None:
        end = time.perf_counter()
        if cached_tokens is not None:
            self._cached = cached_tokens
        first = self._first or end
        timed = self._prompt_seconds is _TIMED_HERE
        text = self._held + self._shown(self._text.finish("length"), final=True)
        reason = self._text.finish_reason
        if self._gate is not None and self._gate.ended:  # also found only now (at max_tokens): a whole middle
            reason = "stop"
        if self._grammar is not None:  # "stop" only for a full match; else the text is an incomplete prefix
            reason = "stop" if self._grammar.accepts("".join(self._pieces)) else "length"
        self._emit(
            CompletionChunk(
                text,
                self._text.take_ids(),
                finish_reason=reason,
                prompt_tokens=self._prompt_tokens,
                cached_tokens=self._cached,
                completion_tokens=len(self._text.token_ids),
                stop_sequence=self._text.stop_sequence,
                prompt_seconds=first - self._started if timed else self._prompt_seconds,
                generation_seconds=end - first,
                accepted_draft_tokens=self._accepted,
                draft_tokens=self._drafted,
                constrained=self._grammar is not None,
                middle_end=self._gate.ended if self._gate is not None else None,
            )
        )

    def _shown(self, text: str, final: bool = False) -> str:
        """What of the detokenized ``text`` is shown: not past the middle's end nor into the suffix."""
        if self._gate is not None:
            # only an answer the model ended (an end token, a stop string) has a whole last line
            cut = self._text.finish_reason != "stop"
            text = self._gate.feed(text) + (self._gate.finish(cut=cut) if final else "")
        if self._overlap is not None:
            text = (self._overlap.feed(text) if text else "") + (self._overlap.finish() if final else "")
        if self._grammar is not None and text:
            self._pieces.append(text)
        return text


class ChunkStream(Iterator[CompletionChunk]):
    """The chunks of one generation, as they come. Closing it (or dropping it) cancels the generation."""

    def __init__(self, generation: Generation, events: queue.SimpleQueue):
        self._generation = generation
        self._events = events
        self._done = False

    def __next__(self) -> CompletionChunk:
        if self._done:
            raise StopIteration
        event = self._events.get()
        if event is _CLOSED:
            raise StopIteration
        if isinstance(event, BaseException):
            self.close()
            raise event
        if event.finish_reason is not None:
            self._done = True
        return event

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._events.put(_CLOSED)
        self._generation.cancelled.set()  # a no-op once the generation has ended

    def __del__(self) -> None:
        self.close()


class AsyncChunkStream(AsyncIterator[CompletionChunk]):
    """Async :class:`ChunkStream`. ``prepare`` (tokenizing, prompt building: work that grows with the
    input) runs in a thread on the first ``__anext__``, so the event loop is never blocked by it."""

    def __init__(self, prepare: Callable[[], Any], submit: Callable[[Any, Emit], Generation]):
        self._prepare = prepare
        self._submit = submit
        self._generation: Generation | None = None
        self._events: asyncio.Queue = asyncio.Queue()
        self._done = False

    async def __anext__(self) -> CompletionChunk:
        if self._done:
            raise StopAsyncIteration
        if self._generation is None:
            self._generation = await self._start()
            if self._done:  # closed by another task while the prompt was built: cancel what was submitted
                self._generation.cancelled.set()
        try:
            event = await self._events.get()
        except BaseException:  # the task was cancelled while waiting
            await self.aclose()
            raise
        if event is _CLOSED:
            raise StopAsyncIteration
        if isinstance(event, BaseException):
            await self.aclose()
            raise event
        if event.finish_reason is not None:
            self._done = True
        return event

    async def _start(self) -> Generation:
        job = await asyncio.to_thread(self._prepare)  # a cancel here submits nothing
        loop = asyncio.get_running_loop()
        events = self._events

        def emit(event: Any) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                generation.cancelled.set()

        generation = self._submit(job, emit)
        return generation

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._events.put_nowait(_CLOSED)
        if self._generation is not None:
            self._generation.cancelled.set()

    def __del__(self) -> None:
        if self._generation is not None:
            self._generation.cancelled.set()
