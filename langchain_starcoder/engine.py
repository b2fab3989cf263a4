"""StarCoderEngine: one MLX StarCoder2 model, its tokenizer, and the one thread that runs them."""

from __future__ import annotations

import asyncio
import math
import os
import queue
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import mlx.core as mx
import numpy as np

from . import fim
from .errors import ContextLengthError, EngineClosedError, InvalidParameterError, StarCoderError
from .generation import run_batch, run_single
from .loading import (
    load_model,
    load_tokenizer,
    read_config,
    resolve_model_path,
    validate_load_options,
)
from .models.starcoder2 import ModelArgs
from .prompt_cache import PromptCacheStore

T = TypeVar("T")
Prompt = str | Sequence[int]


@dataclass(frozen=True)
class Completion:
    """The result of one generation request."""

    text: str
    token_ids: list[int]
    finish_reason: str
    """"stop" (an end-of-text token or a stop string) or "length" (``max_tokens`` reached)."""
    prompt_tokens: int
    cached_tokens: int
    """Prompt tokens served from a reused KV cache instead of being prefilled."""
    completion_tokens: int
    stop_sequence: str | None = None
    """The stop string that ended the generation, if one did."""
    prompt_seconds: float = 0.0
    generation_seconds: float = 0.0

    @property
    def prompt_tps(self) -> float:
        """Prefilled prompt tokens per second (cached tokens excluded)."""
        new = self.prompt_tokens - self.cached_tokens
        return new / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def generation_tps(self) -> float:
        return self.completion_tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0


@dataclass(frozen=True)
class CompletionChunk:
    """A piece of a streamed completion. Only the last chunk has ``finish_reason`` and the counts."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    stop_sequence: str | None = None
    prompt_seconds: float | None = None
    generation_seconds: float | None = None


@dataclass(frozen=True)
class GenerationParams:
    """Validated generation settings; every public generation method takes these as keywords."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)

    @classmethod
    def create(
        cls,
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float | None = None,
        stop: str | Sequence[str] | None = (),
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
    ) -> GenerationParams:
        def bad(msg: str) -> InvalidParameterError:
            return InvalidParameterError(msg)

        if not _is_int(max_tokens) or max_tokens < 1:
            raise bad(f"max_tokens must be a positive integer, not {max_tokens!r}.")
        if not _is_real(temperature) or temperature < 0:
            raise bad(f"temperature must be a number >= 0 (0 is greedy), not {temperature!r}.")
        if not _is_real(top_p) or not 0 < top_p <= 1:
            raise bad(f"top_p must be in (0, 1], not {top_p!r}.")
        if not _is_int(top_k) or top_k < 0:
            raise bad(f"top_k must be an integer >= 0 (0 turns it off), not {top_k!r}.")
        if not _is_real(min_p) or not 0 <= min_p < 1:
            raise bad(f"min_p must be in [0, 1), not {min_p!r}.")
        if repetition_penalty is not None and (not _is_real(repetition_penalty) or repetition_penalty <= 0):
            raise bad(f"repetition_penalty must be a number > 0, not {repetition_penalty!r}.")
        if seed is not None and not _is_int(seed):
            raise bad(f"seed must be an integer, not {seed!r}.")
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        for s in stops:
            if not isinstance(s, str) or not s:
                raise bad(f"stop strings must be non-empty strings, not {s!r}.")
            _check_text(s, "stop string")
        return cls(
            max_tokens=int(max_tokens),
            temperature=float(temperature),
            top_p=float(top_p),
            top_k=int(top_k),
            min_p=float(min_p),
            repetition_penalty=None if repetition_penalty is None else float(repetition_penalty),
            stop=tuple(dict.fromkeys(stops)),
            seed=seed,
            stop_token_ids=frozenset(stop_token_ids),
        )


def _is_int(x: Any) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, int | float | np.number) and not isinstance(x, bool) and math.isfinite(x)


def _check_text(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        msg = f"The {what} is not valid Unicode (a lone surrogate at index {e.start}); fix the text."
        raise InvalidParameterError(msg) from e


class _Request:
    """One generation on the worker: the prompt, its settings, where results go, and a cancel flag."""

    def __init__(self, ids: list[int], params: GenerationParams, sink: Callable[[Any], None]):
        self.ids = ids
        self.params = params
        self.sink = sink
        self.cancelled = threading.Event()


# MLX aborts the process at exit if a thread that ran MLX work has ended, or is woken while Python
# shuts down. So worker threads never end and are never woken at exit: a closed engine's worker
# waits on its retired queue until a new engine hands it a queue of its own.
_pool_lock = threading.Lock()
_idle_queues: list[queue.SimpleQueue] = []


def _serve(jobs: queue.SimpleQueue) -> None:
    while True:
        job = jobs.get()
        if isinstance(job, queue.SimpleQueue):  # handed over to a new engine
            jobs = job
        else:
            job()
        del job  # hold no reference to the engine between jobs, so it can be collected


def _start_worker(jobs: queue.SimpleQueue) -> None:
    """Serve ``jobs`` on an idle worker thread, or on a new one."""
    with _pool_lock:
        if _idle_queues:
            _idle_queues.pop().put(jobs)
            return
    threading.Thread(target=_serve, args=(jobs,), name="starcoder-engine", daemon=True).start()


def _retire(jobs: queue.SimpleQueue) -> None:
    with _pool_lock:
        _idle_queues.append(jobs)


class StarCoderEngine:
    """A loaded StarCoder2 model with KV-cached, streaming, stoppable generation.

    Setup:
        .. code-block:: bash

            pip install langchain-starcoder

    Key init args:
        model: str
            Hub id (``mlx-community/starcoder2-3b-4bit``) or a local checkpoint folder.
        quantize: int | None
            4 or 8 to quantize a full-precision checkpoint while loading.
        dtype: str
            "auto" (float32 compute on the CPU, the checkpoint's dtype on a GPU), "float32",
            "float16" or "bfloat16".
        kv_bits: int | None
            4 or 8 to keep the KV cache quantized (about 4x / 2x smaller than float16).
        max_prompt_caches: int
            How many recent requests' KV caches to keep for prefix reuse (default 4).
        max_prompt_cache_bytes: int | None
            A bound on their total size (default 4 GiB). A cache costs
            ``2 * layers * kv_heads * head_dim * bytes`` per token: 60 KiB per token for
            starcoder2-3b in float32 (30 x 2 x 128 x 4 x 2), so a full 16k context is about 1 GiB.

    Instantiate:
        .. code-block:: python

            from langchain_starcoder import StarCoderEngine

            engine = StarCoderEngine.load("mlx-community/starcoder2-3b-4bit")

    Invoke:
        .. code-block:: python

            completion = engine.generate("def fibonacci(n):", max_tokens=64, stop=["\\ndef "])
            print(completion.text, completion.finish_reason, completion.cached_tokens)

    Stream:
        .. code-block:: python

            for chunk in engine.stream("def quicksort(items):", max_tokens=64):
                print(chunk.text, end="", flush=True)

    Async:
        .. code-block:: python

            completion = await engine.agenerate("def add(a, b):")
            async for chunk in engine.astream("class Stack:"):
                print(chunk.text, end="")

    Threads: every MLX call of an engine runs on the engine's own worker thread (MLX streams are
    thread-local); any number of threads and event loops may call it at once. Requests run one
    after another in arrival order; ``generate_batch`` runs its prompts together.
    """

    def __init__(
        self,
        path: Path,
        *,
        name: str | None = None,
        quantize: int | None = None,
        group_size: int = 64,
        dtype: str = "auto",
        kv_bits: int | None = None,
        max_prompt_caches: int = 4,
        max_prompt_cache_bytes: int | None = 4 << 30,
    ):
        validate_load_options(quantize, group_size, dtype, kv_bits)
        self.path = Path(path)
        self.name = name or str(path)
        self.kv_bits = kv_bits
        config = read_config(self.path)
        _kv_group_size(ModelArgs.from_dict(config), kv_bits)  # refuse a bad kv_bits before loading
        self.tokenizer = load_tokenizer(self.path, config)
        self._data_tokenizer = data_tokenizer(self.tokenizer._tokenizer.backend_tokenizer)
        self._vocab: dict[str, int] = self.tokenizer.get_vocab()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        _start_worker(self._jobs)
        self._closed = False
        self._lock = threading.Lock()
        # An engine dropped unclosed frees its worker; at exit nothing is done (see _serve).
        self._retire_worker = weakref.finalize(self, _retire, self._jobs)
        self._retire_worker.atexit = False
        self._prompt_caches = PromptCacheStore(max_prompt_caches, max_prompt_cache_bytes)
        try:
            loaded = self._call(
                lambda: load_model(self.path, quantize=quantize, group_size=group_size, dtype=dtype)
            )
        except BaseException:
            self.close()
            raise
        self.model = loaded.model
        self.config: ModelArgs = loaded.args
        self.kv_group_size = _kv_group_size(self.config, kv_bits)
        self.raw_config: dict[str, Any] = loaded.config
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids)

    @classmethod
    def load(
        cls,
        model: str | os.PathLike[str],
        *,
        quantize: int | None = None,
        group_size: int = 64,
        dtype: str = "auto",
        kv_bits: int | None = None,
        revision: str | None = None,
        **options: Any,
    ) -> StarCoderEngine:
        """Load a StarCoder2 checkpoint from a folder or the Hugging Face hub.

        Args:
            model: A local folder, or a hub id (downloaded and cached by huggingface_hub; set
                ``HF_HUB_OFFLINE=1`` to use the cache only).
            quantize: None, 4 or 8: quantize a full-precision checkpoint on load. A checkpoint that
                is already quantized loads as it is; asking to quantize it again is an error.
            group_size: Quantization group size (32, 64 or 128), with ``quantize``.
            dtype: "auto" picks per device: float32 compute on the CPU (including quantization
                scales; MLX's float16 CPU kernels are up to 35x slower), the checkpoint's dtype on a
                GPU. Or "float32", "float16", "bfloat16".
            kv_bits: None, 4 or 8: quantize the KV cache.
            revision: A hub branch, tag or commit to pin the download to.
            options: ``max_prompt_caches`` and ``max_prompt_cache_bytes`` (see the class docs).
        """
        validate_load_options(quantize, group_size, dtype, kv_bits)
        path = resolve_model_path(model, revision)
        return cls(
            path, name=str(model), quantize=quantize, group_size=group_size, dtype=dtype,
            kv_bits=kv_bits, **options,
        )  # fmt: skip

    # --- the worker thread -----------------------------------------------------------------

    def _submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()

        def job() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn())
            except BaseException as e:
                future.set_exception(e)

        with self._lock:  # close() takes it too: no job lands on a retired queue
            if self._closed:
                msg = f"The engine for {self.name} is closed; load a new one."
                raise EngineClosedError(msg)
            self._jobs.put(job)
        return future

    def _call(self, fn: Callable[[], T]) -> T:
        return self._submit(fn).result()

    def close(self) -> None:
        """Free the prompt caches and retire the worker thread. The engine cannot be used after."""
        if self._closed:
            return
        try:
            self._call(self._prompt_caches.clear)  # waits, so the worker is idle when we return
        finally:
            with self._lock:
                self._closed = True
            self._retire_worker()

    # --- tokens ------------------------------------------------------------------------------

    @property
    def context_window(self) -> int:
        """The model's context length (``max_position_embeddings``)."""
        return self.config.max_position_embeddings

    @property
    def sliding_window(self) -> int | None:
        return self.config.sliding_window

    def encode(self, text: str, *, special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``. With ``special_tokens=False`` control-token strings in the text
        (``<file_sep>``, ``<|endoftext|>``...) are encoded as plain text: use it for untrusted data."""
        if not isinstance(text, str):
            msg = f"Expected text (str), got {type(text).__name__}."
            raise InvalidParameterError(msg)
        _check_text(text, "text")
        tokenizer = self.tokenizer._tokenizer.backend_tokenizer if special_tokens else self._data_tokenizer
        return tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def token_id(self, token: str) -> int | None:
        """The id of a special token such as ``<fim_prefix>``, or None if the vocabulary lacks it."""
        return self._vocab.get(token)

    # --- forward passes ------------------------------------------------------------------------

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """float32 logits of shape ``[len(token_ids), vocab]`` from one full forward pass, no cache."""
        ids = self._check_ids(token_ids)

        def run() -> np.ndarray:
            out = self.model(mx.array(ids)[None]).astype(mx.float32)
            return np.array(out[0])

        return self._call(run)

    # --- generation ------------------------------------------------------------------------------

    def generate(self, prompt: Prompt, **params: Any) -> Completion:
        """Generate a completion of ``prompt`` (text, or token ids).

        Keyword args: ``max_tokens=256``, ``temperature=0.0`` (greedy), ``top_p=1.0``, ``top_k=0``,
        ``min_p=0.0``, ``repetition_penalty=None``, ``stop=()`` (strings; the text ends before the
        first one that appears), ``seed=None`` (makes sampling reproducible).
        """
        return _collect(self.stream(prompt, **params))

    def stream(self, prompt: Prompt, **params: Any) -> Iterator[CompletionChunk]:
        """Like :meth:`generate`, yielding chunks of text as they are ready.

        No chunk holds any part of a stop string. Leaving the loop early cancels the generation.
        """
        events: queue.SimpleQueue = queue.SimpleQueue()
        request = self._enqueue(prompt, params, events.put)
        return _iterate(request, events)

    async def agenerate(self, prompt: Prompt, **params: Any) -> Completion:
        chunks = [c async for c in self.astream(prompt, **params)]
        return _collect(iter(chunks))

    def astream(self, prompt: Prompt, **params: Any) -> AsyncIterator[CompletionChunk]:
        """Async :meth:`stream`: the event loop is never blocked; cancelling the task cancels the request."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def sink(event: Any) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                request.cancelled.set()

        request = self._enqueue(prompt, params, sink)
        return _aiterate(request, events)

    def generate_batch(self, prompts: Sequence[Prompt], **params: Any) -> list[Completion]:
        """Generate for several prompts at once (truly batched), each as it would alone (greedy)."""
        return self._submit_batch(prompts, params).result()

    async def agenerate_batch(self, prompts: Sequence[Prompt], **params: Any) -> list[Completion]:
        return await asyncio.wrap_future(self._submit_batch(prompts, params))

    def _submit_batch(self, prompts: Sequence[Prompt], params: dict[str, Any]) -> Future[list[Completion]]:
        if isinstance(prompts, str) or not prompts:
            msg = "A batch is a non-empty list of prompts."
            raise InvalidParameterError(msg)
        gen = GenerationParams.create(**params)
        ids = [self._prompt_ids(p, gen) for p in prompts]
        return self._submit(lambda: run_batch(self, ids, gen))

    def clear_cache(self) -> None:
        """Drop every kept prompt cache and return MLX's cached buffers to the system."""
        self._call(lambda: (self._prompt_caches.clear(), mx.clear_cache()))

    @property
    def prompt_cache_bytes(self) -> int:
        return self._call(lambda: self._prompt_caches.nbytes)

    # --- fill-in-the-middle (the work is in fim.py) ----------------------------------------------

    def infill(
        self,
        prefix: str,
        suffix: str = "",
        *,
        context_files: Sequence[fim.ContextFile] = (),
        repo_name: str | None = None,
        file_path: str | None = None,
        mode: str = "psm",
        max_prompt_tokens: int | None = None,
        trim_suffix_overlap: bool = True,
        **generation: Any,
    ) -> Completion:
        """Generate the code between ``prefix`` and ``suffix``; ``text`` is the middle only.

        The prompt is built by :func:`langchain_starcoder.fim.build_fim_prompt` (PSM or SPM; with
        ``context_files``, ``repo_name`` or ``file_path``, StarCoder2's repository layout), within
        ``max_prompt_tokens`` (default: the context window minus ``max_tokens``). Generation stops
        at ``<|endoftext|>``, ``<file_sep>``, ``<repo_name>`` and the ``<fim_*>`` tokens, and at any
        ``stop`` string. With ``trim_suffix_overlap`` (default) an end of the middle that repeats the
        start of the suffix is dropped (rule: :class:`langchain_starcoder.fim.SuffixOverlap`).
        ``generation``: the keywords of :meth:`generate`.

        Prompt cache: the layout puts the repo name and context files first, then the hole's file,
        so repeated infills with the same files reuse their KV cache and prefill only from the first
        changed token. In PSM an edit at the hole re-prefills the end of the prefix and the suffix;
        in SPM (suffix before prefix) it re-prefills only the end of the prefix.
        """
        return fim.infill(
            self, prefix, suffix, context_files=context_files, repo_name=repo_name,
            file_path=file_path, mode=mode, max_prompt_tokens=max_prompt_tokens,
            trim_suffix_overlap=trim_suffix_overlap, **generation,
        )  # fmt: skip

    def stream_infill(
        self,
        prefix: str,
        suffix: str = "",
        *,
        context_files: Sequence[fim.ContextFile] = (),
        repo_name: str | None = None,
        file_path: str | None = None,
        mode: str = "psm",
        max_prompt_tokens: int | None = None,
        trim_suffix_overlap: bool = True,
        **generation: Any,
    ) -> Iterator[CompletionChunk]:
        """:meth:`infill`, streamed. Text that may turn out to repeat the suffix is held back until
        the next chunk settles it (or the end trims it)."""
        return fim.stream_infill(
            self, prefix, suffix, context_files=context_files, repo_name=repo_name,
            file_path=file_path, mode=mode, max_prompt_tokens=max_prompt_tokens,
            trim_suffix_overlap=trim_suffix_overlap, **generation,
        )  # fmt: skip

    async def ainfill(
        self,
        prefix: str,
        suffix: str = "",
        *,
        context_files: Sequence[fim.ContextFile] = (),
        repo_name: str | None = None,
        file_path: str | None = None,
        mode: str = "psm",
        max_prompt_tokens: int | None = None,
        trim_suffix_overlap: bool = True,
        **generation: Any,
    ) -> Completion:
        """Async :meth:`infill`."""
        return await fim.ainfill(
            self, prefix, suffix, context_files=context_files, repo_name=repo_name,
            file_path=file_path, mode=mode, max_prompt_tokens=max_prompt_tokens,
            trim_suffix_overlap=trim_suffix_overlap, **generation,
        )  # fmt: skip

    def astream_infill(
        self,
        prefix: str,
        suffix: str = "",
        *,
        context_files: Sequence[fim.ContextFile] = (),
        repo_name: str | None = None,
        file_path: str | None = None,
        mode: str = "psm",
        max_prompt_tokens: int | None = None,
        trim_suffix_overlap: bool = True,
        **generation: Any,
    ) -> AsyncIterator[CompletionChunk]:
        """Async :meth:`stream_infill` (the event loop is never blocked)."""
        return fim.astream_infill(
            self, prefix, suffix, context_files=context_files, repo_name=repo_name,
            file_path=file_path, mode=mode, max_prompt_tokens=max_prompt_tokens,
            trim_suffix_overlap=trim_suffix_overlap, **generation,
        )  # fmt: skip

    # --- internals -------------------------------------------------------------------------------

    def _check_ids(self, token_ids: Sequence[int]) -> list[int]:
        if isinstance(token_ids, str) or not all(_is_int(t) for t in token_ids):
            msg = "Token ids must be a sequence of integers."
            raise InvalidParameterError(msg)
        ids = [int(t) for t in token_ids]
        if not ids:
            msg = "The prompt is empty: give at least one token."
            raise InvalidParameterError(msg)
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            msg = f"Token ids {bad[:5]} are outside the vocabulary [0, {self.config.vocab_size})."
            raise InvalidParameterError(msg)
        return ids

    def _prompt_ids(self, prompt: Prompt, params: GenerationParams) -> list[int]:
        if isinstance(prompt, str):
            if not prompt.strip():
                msg = "The prompt is empty or only whitespace; give the model some text to continue."
                raise InvalidParameterError(msg)
            ids = self.encode(prompt)
        elif isinstance(prompt, Sequence):
            ids = self._check_ids(prompt)
        else:
            msg = f"A prompt is text or a list of token ids, not {type(prompt).__name__}."
            raise InvalidParameterError(msg)
        if len(ids) + params.max_tokens > self.context_window:
            msg = (
                f"The prompt has {len(ids)} tokens and max_tokens is {params.max_tokens}: together "
                f"{len(ids) + params.max_tokens}, more than the model's context window of "
                f"{self.context_window}. Shorten the prompt or lower max_tokens."
            )
            raise ContextLengthError(msg)
        return ids

    def _enqueue(self, prompt: Prompt, params: dict[str, Any], sink: Callable[[Any], None]) -> _Request:
        gen = GenerationParams.create(**params)
        request = _Request(self._prompt_ids(prompt, gen), gen, sink)
        future = self._submit(lambda: run_single(self, request))
        # Errors raised on the worker reach the caller through the same channel as chunks.
        future.add_done_callback(lambda f: f.exception() is not None and sink(f.exception()))
        return request


def _kv_group_size(config: ModelArgs, kv_bits: int | None) -> int:
    """MLX quantizes in groups of 32, 64 or 128 along the head dimension."""
    group = next((g for g in (64, 32) if config.head_dim % g == 0), None)
    if kv_bits is not None and group is None:
        msg = f"kv_bits needs a head dimension divisible by 32; this model's is {config.head_dim}."
        raise InvalidParameterError(msg)
    return group or 64


def data_tokenizer(backend: Any) -> Any:
    """A copy of a ``tokenizers.Tokenizer`` that reads control-token strings as plain text."""
    from tokenizers import Tokenizer

    data = Tokenizer.from_str(backend.to_str())
    data.encode_special_tokens = True
    return data


def _iterate(request: _Request, events: queue.SimpleQueue) -> Iterator[CompletionChunk]:
    try:
        while True:
            event = events.get()
            if isinstance(event, BaseException):
                raise event
            yield event
            if event.finish_reason is not None:
                return
    finally:
        request.cancelled.set()


async def _aiterate(request: _Request, events: asyncio.Queue) -> AsyncIterator[CompletionChunk]:
    try:
        while True:
            event = await events.get()
            if isinstance(event, BaseException):
                raise event
            yield event
            if event.finish_reason is not None:
                return
    finally:
        request.cancelled.set()


def _collect(chunks: Iterator[CompletionChunk]) -> Completion:
    texts: list[str] = []
    ids: list[int] = []
    for chunk in chunks:
        texts.append(chunk.text)
        ids.extend(chunk.token_ids)
        if chunk.finish_reason is not None:
            return Completion(
                text="".join(texts),
                token_ids=ids,
                finish_reason=chunk.finish_reason,
                prompt_tokens=chunk.prompt_tokens or 0,
                cached_tokens=chunk.cached_tokens or 0,
                completion_tokens=chunk.completion_tokens or 0,
                stop_sequence=chunk.stop_sequence,
                prompt_seconds=chunk.prompt_seconds or 0.0,
                generation_seconds=chunk.generation_seconds or 0.0,
            )
    msg = "The generation ended without a final chunk."
    raise StarCoderError(msg)
