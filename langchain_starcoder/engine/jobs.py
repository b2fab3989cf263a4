"""Jobs: a request made ready for a backend (in the caller's thread, or a worker thread for async),
then handed to it, its chunks streamed or collected.

Each helper takes what it needs (the backend, the tokenizer, the end ids), never the engine: the
front calls these, and nothing here calls back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from .._tokens import max_text_chars
from ..backends import Backend, Generation
from ..backends.grammar import Grammar, GrammarCompiler, with_json_whitespace
from ..decoding.sink import ChunkSink, ChunkStream, Emit
from ..ends import MiddleEnd, MiddleGate
from ..errors import ContextLengthError, InvalidParameterError
from ..fim.build import FIMPrompt
from ..fim.request import FIMRequest
from ..types import Completion, CompletionChunk, GenerationParams, is_int, join_chunks

Prompt = str | Sequence[int] | FIMRequest


@dataclass(frozen=True)
class Job:
    """A request made ready for a backend: prompt ids, settings with every stop id, a FIM middle's ends."""

    ids: list[int]
    params: GenerationParams
    trim: str | None = None  # the suffix a FIM middle must not repeat
    grammar: Grammar | None = None  # params' constraint, compiled
    end: MiddleEnd | None = None  # where a FIM middle is complete (the hole read once, here)
    min_indent: int = 0


# --- checks ----------------------------------------------------------------------------------------


def split_settings(
    settings: dict[str, Any], backend: Backend, eos_token_ids: frozenset[int]
) -> tuple[GenerationParams, bool]:
    """The generation settings (checked against the backend's model, every end id a stop id) and
    ``parse_special_tokens``, taken out of ``settings``."""
    parse = settings.pop("parse_special_tokens", True)
    if not isinstance(parse, bool):
        msg = f"parse_special_tokens must be True or False, not {parse!r}."
        raise InvalidParameterError(msg)
    params = GenerationParams.create(**settings)
    if params.top_k >= backend.vocab_size:
        msg = (
            f"top_k={params.top_k} is not below the vocabulary size ({backend.vocab_size}); "
            "use 0 to turn it off."
        )
        raise InvalidParameterError(msg)
    check_room(params.max_tokens, backend.context_window)
    check_in_vocab(params.stop_token_ids, backend.vocab_size, "stop_token_ids")
    stops = params.stop_token_ids | eos_token_ids
    return dataclasses.replace(params, stop_token_ids=stops), parse


def check_room(max_tokens: int, context_window: int) -> None:
    if max_tokens >= context_window:
        msg = (
            f"max_tokens={max_tokens} leaves no room for a prompt in the model's "
            f"{context_window}-token context window. Lower max_tokens."
        )
        raise ContextLengthError(msg)


def check_text_prompt(prompt: str) -> None:
    if not prompt or prompt.isspace():  # no copy of a long prompt
        msg = "The prompt is empty or only whitespace; give the model some text to continue."
        raise InvalidParameterError(msg)


def check_prompt_size(tokenizer: Any, context_window: int, chars: int, max_tokens: int = 0) -> None:
    """:meth:`StarCoderEngine.check_prompt_size <langchain_starcoder.StarCoderEngine.check_prompt_size>`."""
    room = context_window - max_tokens
    limit = max_text_chars(tokenizer, room)
    if limit is None or chars <= limit:
        return
    longest = limit // room
    if max_tokens:
        msg = (
            f"The prompt has {chars:,} characters and max_tokens is {max_tokens}: the model's "
            f"{context_window}-token context window leaves {room} tokens for the prompt, which "
            f"hold at most {limit:,} characters (a token of this tokenizer stands for at most "
            f"{longest}). Shorten the prompt or lower max_tokens."
        )
    else:
        msg = (
            f"The prompt has {chars:,} characters: the model's {context_window}-token context "
            f"window holds at most {limit:,} (a token of this tokenizer stands for at most "
            f"{longest}). Shorten the prompt."
        )
    raise ContextLengthError(msg)


def prompt_ids(prompt: Any, vocab_size: int) -> list[int]:
    """A prompt that is not text: token ids, checked (bytes and other types are refused)."""
    if isinstance(prompt, bytes | bytearray | memoryview):
        msg = (
            f"The prompt is {type(prompt).__name__}, not text: decode it first "
            "(e.g. data.decode('utf-8')), or pass token ids as a list of integers."
        )
        raise InvalidParameterError(msg)
    if not isinstance(prompt, Sequence):
        msg = f"A prompt is text or a list of token ids, not {type(prompt).__name__}."
        raise InvalidParameterError(msg)
    return check_ids(prompt, vocab_size)


def check_ids(token_ids: Sequence[int], vocab_size: int) -> list[int]:
    if isinstance(token_ids, str) or not all(is_int(t) for t in token_ids):
        msg = "Token ids must be a sequence of integers."
        raise InvalidParameterError(msg)
    ids = [int(t) for t in token_ids]
    if not ids:
        msg = "The prompt is empty: give at least one token."
        raise InvalidParameterError(msg)
    check_in_vocab(ids, vocab_size, "Token ids")
    return ids


def check_in_vocab(ids: Iterable[int], vocab_size: int, what: str) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        msg = f"{what} {bad[:5]} are outside the vocabulary [0, {vocab_size})."
        raise InvalidParameterError(msg)


def check_batch(prompts: Any) -> Sequence[Prompt]:
    if isinstance(prompts, str | bytes) or not isinstance(prompts, Sequence) or not prompts:
        msg = "A batch is a non-empty list of prompts."
        raise InvalidParameterError(msg)
    return prompts


# --- jobs ------------------------------------------------------------------------------------------


def ids_job(ids: list[int], params: GenerationParams, context_window: int) -> Job:
    """The job of a prompt in token ids, if it fits in the context window with its generation."""
    if len(ids) + params.max_tokens > context_window:
        msg = (
            f"The prompt has {len(ids)} tokens and max_tokens is {params.max_tokens}: together "
            f"{len(ids) + params.max_tokens}, more than the model's context window of "
            f"{context_window}. Shorten the prompt or lower max_tokens."
        )
        raise ContextLengthError(msg)
    return Job(ids, params)


def fim_job(prompt: FIMPrompt, params: GenerationParams, request: FIMRequest) -> Job:
    """The job of a FIM request's prompt: its layout's stop ids added, the suffix to trim and the
    middle's end kept (neither under a constraint: there the grammar says where the middle ends)."""
    params = dataclasses.replace(params, stop_token_ids=params.stop_token_ids | set(prompt.stop_token_ids))
    free = not params.constrained
    trim = request.suffix if request.trim_suffix_overlap and free else None
    end = None
    if request.end != "none" and free:
        language = getattr(request.notebook, "language", None)
        end = MiddleEnd(request.prefix, request.suffix, request.file_path, request.end, language=language)
    return Job(prompt.token_ids, params, trim, end=end, min_indent=request.min_indent if free else 0)


def constrain(job: Job, grammars: GrammarCompiler, backend: Backend) -> Job:
    """``job`` with its constraint compiled (cached per constraint) for ``backend``'s answers (a server
    that pads JSON with whitespace is held to its own); a bad one raises
    :class:`~langchain_starcoder.errors.GrammarError` here, before anything is decoded."""
    constraint = job.params.constraint
    if constraint is None:
        return job
    constraint = with_json_whitespace(constraint, getattr(backend, "json_whitespace", None))
    return dataclasses.replace(job, grammar=grammars.compile(constraint))


def to_generation(tokenizer: Any, job: Job, emit: Emit) -> Generation:
    gate = MiddleGate(job.end and job.end.fresh(), job.min_indent) if job.end or job.min_indent else None
    sink = ChunkSink(tokenizer, job.params, len(job.ids), emit, job.trim, job.grammar, gate)
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
