"""Engine results as LlamaIndex responses: counts in ``additional_kwargs`` and ``raw``, streams as
cumulative responses with deltas, and a chat answer's tool calls (``ToolCallBlock``\\ s, OpenAI-style
``tool_calls``; a call cut short is never one) as a tool plan reads them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from llama_index.core.base.llms.generic_utils import completion_response_to_chat_response
from llama_index.core.base.llms.types import ChatResponse, CompletionResponse, TextBlock, ToolCallBlock

from ._tools import InvalidToolCall, ToolCall, ToolPlan
from .types import Completion, CompletionChunk, counts, join_chunks


def with_calls(
    response: ChatResponse, content: str, calls: Sequence[ToolCall], invalid: Sequence[InvalidToolCall]
) -> ChatResponse:
    """``response`` whose message holds ``content`` and the calls: ``ToolCallBlock``\\ s, OpenAI's
    ``tool_calls`` and, for a call left incomplete, ``invalid_tool_calls`` (never a call)."""
    blocks: list[Any] = [TextBlock(text=content)] if content else []
    blocks += [ToolCallBlock(tool_call_id=c.id, tool_name=c.name, tool_kwargs=c.arguments) for c in calls]
    message = response.message
    message.blocks = blocks
    message.additional_kwargs["tool_calls"] = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
        for c in calls
    ]
    if invalid:
        message.additional_kwargs["invalid_tool_calls"] = [
            {"id": c.id, "text": c.text, "error": c.error} for c in invalid
        ]
    return response


def completion_response(completion: Completion, *, delta: str | None = None) -> CompletionResponse:
    """A response whose ``additional_kwargs`` hold the counts and whose ``raw`` adds the token ids,
    timings and an OpenAI-style ``usage`` (the shape LlamaIndex's ``TokenCountingHandler`` reads)."""
    info = counts(completion)
    raw = {
        **info,
        "token_ids": list(completion.token_ids),
        "prompt_seconds": completion.prompt_seconds,
        "generation_seconds": completion.generation_seconds,
        "prompt_tps": completion.prompt_tps,
        "generation_tps": completion.generation_tps,
        "usage": completion.usage(),
    }
    return CompletionResponse(text=completion.text, delta=delta, additional_kwargs=info, raw=raw)


def _response(chunks: list[CompletionChunk], text: str) -> CompletionResponse | None:
    """The response after the latest chunk (``text``: all so far); the last one carries the counts."""
    last = chunks[-1]
    if last.finish_reason is not None:
        return completion_response(join_chunks(chunks), delta=last.text)
    # Skip empty pieces (text held back while it may be a stop string's start).
    return CompletionResponse(text=text, delta=last.text) if last.text else None


def _chat_response(response: CompletionResponse) -> ChatResponse:
    chat = completion_response_to_chat_response(response)  # LlamaIndex's own (counts on the message)
    chat.delta, chat.additional_kwargs = response.delta, response.additional_kwargs  # and beside it
    return chat


def chat_answer(completion: Completion, plan: ToolPlan | None) -> ChatResponse:
    """A chat's response; with tools, its text and calls read back (an incomplete call is no call)."""
    response = _chat_response(completion_response(completion))
    if plan is None:
        return response
    reply = plan.read(completion.text)
    return with_calls(response, reply.content, reply.calls, reply.invalid)


class _Responses:
    """Streamed chunks as LlamaIndex responses: the text so far and the new ``delta``, the counts on
    the last; with a tool plan, the calls complete so far on each chat response."""

    def __init__(self, chat: bool, plan: ToolPlan | None) -> None:
        self._chat = chat
        self._reader = plan.reader() if plan is not None else None
        self._seen: list[CompletionChunk] = []
        self._text = ""
        self._calls: list[Any] = []

    def take(self, chunk: CompletionChunk) -> Any | None:
        """The response to ``chunk``, or None where it shows nothing new."""
        self._seen.append(chunk)
        if self._reader is None:
            self._text += chunk.text
            response = _response(self._seen, self._text)
            return _chat_response(response) if self._chat and response is not None else response
        last = chunk.finish_reason is not None
        shown, calls = self._reader.feed(chunk.text)
        invalid: list[Any] = []
        if last:
            rest, invalid = self._reader.end()
            shown += rest
        self._text += shown
        self._calls += calls
        if not (shown or calls or last):
            return None
        if last:
            response = completion_response(join_chunks(self._seen), delta=shown)
        else:
            response = CompletionResponse(text=self._text, delta=shown)
        return with_calls(_chat_response(response), self._text, self._calls, invalid)


def stream_responses(
    chunks: Iterator[CompletionChunk], chat: bool = False, plan: ToolPlan | None = None
) -> Iterator[Any]:
    responses = _Responses(chat, plan)
    try:
        for chunk in chunks:
            if (response := responses.take(chunk)) is not None:
                yield response
    finally:
        chunks.close()  # type: ignore[attr-defined]  # a consumer that stops early cancels the generation


async def astream_responses(
    chunks: AsyncIterator[CompletionChunk], chat: bool = False, plan: ToolPlan | None = None
) -> AsyncIterator[Any]:
    responses = _Responses(chat, plan)
    try:
        async for chunk in chunks:
            if (response := responses.take(chunk)) is not None:
                yield response
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
