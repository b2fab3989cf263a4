"""Jobs: a request made ready for a backend (by :mod:`.prepare`), handed to it, its chunks streamed
or collected.

Each function takes what it needs (the backend, the tokenizer, the jobs), never the engine: the
front calls these, and nothing here calls back.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..backends import Backend, Generation
from ..backends.grammar import Grammar
from ..decoding.filter import Filter
from ..decoding.sink import ChunkSink, Emit
from ..decoding.streams import AsyncChunkStream, ChunkStream
from ..types import Completion, CompletionChunk, GenerationParams, join_chunks


@dataclass(frozen=True)
class Job:
    """A request made ready for a backend: prompt ids, settings with every stop id, the compiled
    constraint (the backend masks each step with it) and the filters its text passes through, in
    order (:mod:`langchain_starcoder.decoding.filter`). A job runs once: its filters keep the
    generation's state."""

    ids: list[int]
    params: GenerationParams
    grammar: Grammar | None = None
    filters: tuple[Filter, ...] = ()


def to_generation(tokenizer: Any, job: Job, emit: Emit) -> Generation:
    sink = ChunkSink(tokenizer, job.params, len(job.ids), emit, job.filters)
    return Generation(job.ids, job.params, sink, grammar=job.grammar)


def submit_one(backend: Backend, tokenizer: Any, job: Job, emit: Emit) -> Generation:
    generation = to_generation(tokenizer, job, emit)
    future = backend.submit([generation])
    # Errors raised by the backend reach the caller through the same channel as chunks.
    future.add_done_callback(lambda f: f.exception() is not None and emit(f.exception()))
    return generation


def stream(backend: Backend, tokenizer: Any, job: Job) -> ChunkStream:
    events: queue.SimpleQueue = queue.SimpleQueue()
    return ChunkStream(submit_one(backend, tokenizer, job, events.put), events)


def astream(backend: Backend, tokenizer: Any, prepare: Callable[[], Job]) -> AsyncChunkStream:
    """The job ``prepare`` makes (in a thread, on the first ``__anext__``), streamed to the event loop."""
    return AsyncChunkStream(prepare, partial(submit_one, backend, tokenizer))


def submit_batch(
    backend: Backend, tokenizer: Any, jobs: list[Job]
) -> tuple[Future[None], list[Generation], list[list]]:
    chunks: list[list[CompletionChunk]] = [[] for _ in jobs]
    generations = [to_generation(tokenizer, job, out.append) for job, out in zip(jobs, chunks, strict=True)]
    return backend.submit(generations), generations, chunks


def collect(backend: Backend, tokenizer: Any, jobs: list[Job]) -> list[Completion]:
    future, generations, chunks = submit_batch(backend, tokenizer, jobs)
    try:
        future.result()
    except BaseException:  # e.g. Ctrl-C while waiting: stop the batch
        for g in generations:
            g.cancelled.set()
        raise
    return [join_chunks(c) for c in chunks]


async def acollect(backend: Backend, tokenizer: Any, jobs: list[Job]) -> list[Completion]:
    future, generations, chunks = submit_batch(backend, tokenizer, jobs)
    try:
        await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        for g in generations:
            g.cancelled.set()
        raise
    return [join_chunks(c) for c in chunks]
