"""Jobs: a request made ready for a backend (in the caller's thread, or a worker thread for async),
then handed to it, its chunks streamed or collected.
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..backends import Generation
from ..errors import ContextLengthError, InvalidParameterError
from ..streaming import ChunkSink, ChunkStream, Emit
from ..types import Completion, CompletionChunk, FIMRequest, GenerationParams, is_int, join_chunks

if TYPE_CHECKING:
    from .front import StarCoderEngine

Prompt = str | Sequence[int] | FIMRequest


@dataclass(frozen=True)
class Job:
    """A request made ready for a backend: prompt ids, settings with every stop id, FIM trim."""

    ids: list[int]
    params: GenerationParams
    trim: str | None = None  # the suffix a FIM middle must not repeat


def split_settings(engine: StarCoderEngine, settings: dict[str, Any]) -> tuple[GenerationParams, bool]:
    parse = settings.pop("parse_special_tokens", True)
    if not isinstance(parse, bool):
        msg = f"parse_special_tokens must be True or False, not {parse!r}."
        raise InvalidParameterError(msg)
    params = GenerationParams.create(**settings)
    if params.top_k >= engine.vocab_size:
        msg = (
            f"top_k={params.top_k} is not below the vocabulary size ({engine.vocab_size}); "
            "use 0 to turn it off."
        )
        raise InvalidParameterError(msg)
    check_room(engine, params.max_tokens)
    check_in_vocab(engine, params.stop_token_ids, "stop_token_ids")
    stops = params.stop_token_ids | engine.eos_token_ids
    return dataclasses.replace(params, stop_token_ids=stops), parse


def check_room(engine: StarCoderEngine, max_tokens: int) -> None:
    if max_tokens >= engine.context_window:
        msg = (
            f"max_tokens={max_tokens} leaves no room for a prompt in the model's "
            f"{engine.context_window}-token context window. Lower max_tokens."
        )
        raise ContextLengthError(msg)


def prepare(engine: StarCoderEngine, prompt: Prompt, settings: dict[str, Any]) -> Job:
    if isinstance(prompt, FIMRequest):
        return prepare_fim(engine, prompt, settings)
    params, parse = split_settings(engine, dict(settings))
    if isinstance(prompt, str):
        if not prompt or prompt.isspace():  # no copy of a long prompt
            msg = "The prompt is empty or only whitespace; give the model some text to continue."
            raise InvalidParameterError(msg)
        engine.check_prompt_size(len(prompt), params.max_tokens)  # before tokenizing it whole
        ids = engine.encode(prompt, special_tokens=parse)
    elif isinstance(prompt, bytes | bytearray | memoryview):
        msg = (
            f"The prompt is {type(prompt).__name__}, not text: decode it first "
            "(e.g. data.decode('utf-8')), or pass token ids as a list of integers."
        )
        raise InvalidParameterError(msg)
    elif isinstance(prompt, Sequence):
        ids = check_ids(engine, prompt)
    else:
        msg = f"A prompt is text or a list of token ids, not {type(prompt).__name__}."
        raise InvalidParameterError(msg)
    if len(ids) + params.max_tokens > engine.context_window:
        msg = (
            f"The prompt has {len(ids)} tokens and max_tokens is {params.max_tokens}: together "
            f"{len(ids) + params.max_tokens}, more than the model's context window of "
            f"{engine.context_window}. Shorten the prompt or lower max_tokens."
        )
        raise ContextLengthError(msg)
    return Job(ids, params)


def prepare_fim(engine: StarCoderEngine, request: FIMRequest, settings: dict[str, Any]) -> Job:
    # FIM parts are always data: parse_special_tokens does not apply.
    params, _ = split_settings(engine, dict(settings))
    prompt = engine.fim_prompt(request, params.max_tokens)
    params = dataclasses.replace(params, stop_token_ids=params.stop_token_ids | set(prompt.stop_token_ids))
    return Job(prompt.token_ids, params, request.suffix if request.trim_suffix_overlap else None)


def prepare_batch(engine: StarCoderEngine, prompts: Sequence[Prompt], settings: dict[str, Any]) -> list[Job]:
    if isinstance(prompts, str | bytes) or not isinstance(prompts, Sequence) or not prompts:
        msg = "A batch is a non-empty list of prompts."
        raise InvalidParameterError(msg)
    return [prepare(engine, p, settings) for p in prompts]


def check_ids(engine: StarCoderEngine, token_ids: Sequence[int]) -> list[int]:
    if isinstance(token_ids, str) or not all(is_int(t) for t in token_ids):
        msg = "Token ids must be a sequence of integers."
        raise InvalidParameterError(msg)
    ids = [int(t) for t in token_ids]
    if not ids:
        msg = "The prompt is empty: give at least one token."
        raise InvalidParameterError(msg)
    check_in_vocab(engine, ids, "Token ids")
    return ids


def check_in_vocab(engine: StarCoderEngine, ids: Iterable[int], what: str) -> None:
    bad = [t for t in ids if not 0 <= t < engine.vocab_size]
    if bad:
        msg = f"{what} {bad[:5]} are outside the vocabulary [0, {engine.vocab_size})."
        raise InvalidParameterError(msg)


def to_generation(engine: StarCoderEngine, job: Job, emit: Emit) -> Generation:
    sink = ChunkSink(engine.tokenizer, job.params, len(job.ids), emit, job.trim)
    return Generation(job.ids, job.params, sink)


def submit_one(engine: StarCoderEngine, job: Job, emit: Emit) -> Generation:
    generation = to_generation(engine, job, emit)
    future = engine.backend.submit([generation])
    # Errors raised by the backend reach the caller through the same channel as chunks.
    future.add_done_callback(lambda f: f.exception() is not None and emit(f.exception()))
    return generation


def stream(engine: StarCoderEngine, job: Job) -> ChunkStream:
    events: queue.SimpleQueue = queue.SimpleQueue()
    return ChunkStream(submit_one(engine, job, events.put), events)


def submit_batch(
    engine: StarCoderEngine, jobs: list[Job]
) -> tuple[Future[None], list[Generation], list[list]]:
    chunks: list[list[CompletionChunk]] = [[] for _ in jobs]
    generations = [to_generation(engine, job, out.append) for job, out in zip(jobs, chunks, strict=True)]
    return engine.backend.submit(generations), generations, chunks


def collect(engine: StarCoderEngine, jobs: list[Job]) -> list[Completion]:
    future, generations, chunks = submit_batch(engine, jobs)
    try:
        future.result()
    except BaseException:  # e.g. Ctrl-C while waiting: stop the batch
        for g in generations:
            g.cancelled.set()
        raise
    return [join_chunks(c) for c in chunks]


async def acollect(engine: StarCoderEngine, jobs: list[Job]) -> list[Completion]:
    future, generations, chunks = submit_batch(engine, jobs)
    try:
        await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        for g in generations:
            g.cancelled.set()
        raise
    return [join_chunks(c) for c in chunks]
