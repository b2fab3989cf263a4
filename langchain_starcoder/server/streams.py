"""Answers over time: server-sent events, a client's disconnect cancelling its work, llama.cpp's
``t_max_predict_ms`` cut."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response

from ..types import Completion, CompletionChunk, join_chunks
from .errors import APIError, api_error
from .shapes import TIME_LIMIT

T = TypeVar("T")

#: How often a non-streamed request checks whether its client is still there.
DISCONNECT_POLL_SECONDS = 0.1


async def time_limited(
    stream: AsyncIterator[CompletionChunk], limit_ms: float, prompt_tokens: int
) -> AsyncIterator[CompletionChunk]:
    """llama.cpp's ``t_max_predict_ms``: once this long has passed since the first text and a newline
    has been generated, end the answer there (editors ask for it: a line now beats a block later).

    The cut answer's last chunk is made here: its prompt count is the built prompt's, its cached
    count unknown (None), its times measured here.
    """
    started = time.perf_counter()
    first: float | None = None
    generated, newline = 0, False
    try:
        async for chunk in stream:
            yield chunk
            if chunk.finish_reason is not None or limit_ms <= 0:
                continue
            now = time.perf_counter()
            first = now if first is None else first
            generated += len(chunk.token_ids)
            newline = newline or "\n" in chunk.text
            if newline and (now - first) * 1000 >= limit_ms:
                yield CompletionChunk(
                    "",
                    [],
                    finish_reason=TIME_LIMIT,
                    prompt_tokens=prompt_tokens,
                    cached_tokens=None,
                    completion_tokens=generated,
                    prompt_seconds=first - started,
                    generation_seconds=now - first,
                )
                return
    finally:
        await stream.aclose()  # type: ignore[attr-defined]  # a cut (or dropped) answer stops generating


async def join(stream: AsyncIterator[CompletionChunk]) -> Completion:
    return join_chunks([chunk async for chunk in stream])


async def unless_gone(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, cancelling it when the client disconnects first (an editor drops its
    request at each keystroke; the engine should not keep generating for nobody)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise APIError(499, "The client disconnected.", kind="client_closed")
    finally:
        await _cancelled(task)


async def _cancelled(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` (cancelling the engine's generation) and wait until it has ended, so that what it
    was reading (a stream mid-``anext``) is no longer running when the caller closes it."""
    if not task.done():
        task.cancel()
        await asyncio.wait({task})  # raises nothing itself, and the task's cleanup is quick
    if not task.cancelled():
        task.exception()  # an error that raced the disconnect is not reported as never retrieved


async def sse(
    request: Request,
    stream: AsyncIterator[CompletionChunk],
    events: Callable[[CompletionChunk], list[dict[str, Any]]],
    *,
    done_marker: bool,
) -> Response:
    """A server-sent-events response of ``events(chunk)`` for each chunk, ``data: [DONE]`` last if asked.

    The first chunk is awaited before answering, so a bad request still gets its error status. A client
    that disconnects cancels the generator, and closing the stream cancels the generation.
    """
    try:
        first = await unless_gone(request, anext(stream))  # a client may leave during a long prefill
    except BaseException:
        await stream.aclose()  # type: ignore[attr-defined]
        raise

    async def body() -> AsyncIterator[dict[str, str]]:
        try:
            chunk: CompletionChunk | None = first
            while chunk is not None:
                for event in events(chunk):
                    yield {"data": json.dumps(event)}
                chunk = None if chunk.finish_reason is not None else await anext(stream, None)
            if done_marker:
                yield {"data": "[DONE]"}
        except Exception as e:  # after the status line: the error goes in the stream
            yield {"data": json.dumps({"error": {"message": str(api_error(e)), "type": "server_error"}})}
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    return EventSourceResponse(body(), ping=15)
