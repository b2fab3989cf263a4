"""Generation loops that run on the engine's worker thread: one request, or a batch."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, generate_step
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from .stops import StopMatcher

if TYPE_CHECKING:
    from .engine import Completion, GenerationParams, StarCoderEngine, _Request

_PENALTY_CONTEXT = 20  # tokens the repetition penalty looks back over (mlx-lm's default)


class TextStream:
    """One request's output: streaming UTF-8-safe detokenization, stop tokens and stop strings."""

    def __init__(self, engine: StarCoderEngine, params: GenerationParams):
        self._detokenizer = engine.tokenizer.detokenizer
        self._matcher = StopMatcher(params.stop)
        self._stop_ids = engine.eos_token_ids | params.stop_token_ids
        self.token_ids: list[int] = []
        self._unsent_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stop_sequence: str | None = None

    def add(self, token: int) -> str:
        """Take one generated token; return the text that became safe to show (maybe "")."""
        self.token_ids.append(token)
        self._unsent_ids.append(token)
        if token in self._stop_ids:
            self.finish_reason = "stop"
            return self._drain()
        self._detokenizer.add_token(token)
        text, self.stop_sequence = self._matcher.feed(self._detokenizer.last_segment)
        if self.stop_sequence is not None:
            self.finish_reason = "stop"
        return text

    def take_ids(self) -> list[int]:
        ids, self._unsent_ids = self._unsent_ids, []
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


def _sampler(params: GenerationParams) -> Any:
    return make_sampler(
        params.temperature,
        top_p=params.top_p if params.top_p < 1.0 else 0.0,
        min_p=params.min_p,
        top_k=params.top_k,
    )


def _logits_processors(params: GenerationParams, cached: Sequence[int]) -> list[Any] | None:
    """mlx-lm's processors; with a reused cache they also see the cached tail of the prompt."""
    if params.repetition_penalty is None:
        return None
    processors = make_logits_processors(
        repetition_penalty=params.repetition_penalty, repetition_context_size=_PENALTY_CONTEXT
    )
    if not cached:
        return processors
    head = mx.array(list(cached[-_PENALTY_CONTEXT:]))
    return [lambda tokens, logits, p=p: p(mx.concatenate([head, tokens]), logits) for p in processors]


def run_single(engine: StarCoderEngine, request: _Request) -> None:
    """Prefill what the prompt cache lacks, then decode, sending chunks to the request's sink."""
    from .engine import CompletionChunk

    if request.cancelled.is_set():  # its caller left while it waited in the queue
        return
    params, ids = request.params, request.ids
    start = time.perf_counter()
    cache, cached = engine._prompt_caches.take(engine.model, ids)
    if params.seed is not None:
        mx.random.seed(params.seed)
    text = TextStream(engine, params)
    steps = generate_step(
        mx.array(ids[cached:]),
        engine.model,
        max_tokens=params.max_tokens,
        sampler=_sampler(params),
        logits_processors=_logits_processors(params, ids[:cached]),
        prompt_cache=cache,
        kv_bits=engine.kv_bits,
        kv_group_size=engine.kv_group_size,
        quantized_kv_start=0,
    )
    first = None
    completed = False
    piece = ""
    try:
        for token, _ in steps:
            first = first or time.perf_counter()
            piece = text.add(token)
            if text.finish_reason is not None or request.cancelled.is_set():
                break  # ``piece`` (text before a stop string) goes out with the last chunk
            if piece:
                request.sink(CompletionChunk(piece, text.take_ids()))
                piece = ""
        completed = True
    finally:
        steps.close()
        if completed:  # a cache left by an error mid-step is not trusted again
            engine._prompt_caches.put((ids + text.token_ids)[: cache[0].offset], cache)
    if request.cancelled.is_set():
        return
    end = time.perf_counter()
    first = first or end
    last = piece + text.finish("length")
    request.sink(
        CompletionChunk(
            last,
            text.take_ids(),
            finish_reason=text.finish_reason,
            prompt_tokens=len(ids),
            cached_tokens=cached,
            completion_tokens=len(text.token_ids),
            stop_sequence=text.stop_sequence,
            prompt_seconds=first - start,
            generation_seconds=end - first,
        )
    )


def run_batch(
    engine: StarCoderEngine, prompts: list[list[int]], params: GenerationParams
) -> list[Completion]:
    """All prompts through mlx-lm's BatchGenerator at once; each ends on its own stops and length."""
    from .engine import Completion

    start = time.perf_counter()
    if params.seed is not None:
        mx.random.seed(params.seed)
    stop_ids = engine.eos_token_ids | params.stop_token_ids
    generator = BatchGenerator(
        engine.model,
        max_tokens=params.max_tokens,
        stop_tokens=[[t] for t in sorted(stop_ids)],
        sampler=_sampler(params),
        logits_processors=_logits_processors(params, ()),
        prefill_batch_size=len(prompts),
        completion_batch_size=len(prompts),
    )
    try:
        uids = generator.insert(prompts, max_tokens=[params.max_tokens] * len(prompts))
        streams = {uid: TextStream(engine, params) for uid in uids}
        texts: dict[int, list[str]] = {uid: [] for uid in uids}
        done: set[int] = set()
        while len(done) < len(uids):
            for response in generator.next_generated():
                if response.uid in done:
                    continue
                stream = streams[response.uid]
                texts[response.uid].append(stream.add(response.token))
                if stream.finish_reason is None and response.finish_reason is None:
                    continue
                texts[response.uid].append(stream.finish(response.finish_reason or "length"))
                done.add(response.uid)
                if response.finish_reason is None:  # we stopped it (a stop string): free its row
                    generator.remove([response.uid])
    finally:
        generator.close()
    seconds = time.perf_counter() - start
    return [
        Completion(
            text="".join(texts[uid]),
            token_ids=streams[uid].token_ids,
            finish_reason=streams[uid].finish_reason or "length",
            prompt_tokens=len(ids),
            cached_tokens=0,
            completion_tokens=len(streams[uid].token_ids),
            stop_sequence=streams[uid].stop_sequence,
            generation_seconds=seconds,
        )
        for uid, ids in zip(uids, prompts, strict=True)
    ]
