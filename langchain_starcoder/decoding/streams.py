"""What callers iterate: the chunks of one generation, from a backend's thread to the caller's
thread or event loop. Leaving a stream early, closing it, or dropping it unstarted cancels the
generation.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from ..backends import Generation
from ..types import CompletionChunk
from .sink import Emit

_CLOSED = object()  # put on a stream's queue by close(): wakes a reader waiting in another thread or task


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
