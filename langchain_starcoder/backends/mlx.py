"""The in-process MLX backend: one worker thread that owns the model, its prompt caches and every MLX call.

MLX streams are thread-local (mlx >= 0.31.2), so all evaluation for one model happens on its worker;
callers reach it through a job queue (see :mod:`langchain_starcoder.backends` for the contract).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import queue
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.generate import BatchGenerator, generate_step
from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache, trim_prompt_cache

from .._progress import advance_to, prefill_bar, prefill_steps
from ..errors import EngineClosedError, InvalidParameterError
from ..loading import LoadedModel
from ..loading.adapter import Adapter
from ..types import CachePartition, is_int
from . import Generation
from .mlx_adapters import adapted_copy
from .prompt_cache import CacheLayout, DiskPromptCache, PromptCacheStore, cache_key, hash_weights_aside
from .prompt_cache.disk import MIN_GAIN_TOKENS
from .settings import check_cache_bounds, kv_group_size, logits_processors_for, prefill_chunk, sampler_for
from .speculative import (
    DEFAULT_DRAFT_TOKENS,
    DEFAULT_LOOKUP_TOKENS,
    DraftModel,
    PassCosts,
    PromptLookup,
    decode,
)
from .workers import retire_worker, start_worker

T = TypeVar("T")


class _Cancelled(Exception):
    """Raised inside mlx-lm's prefill loop (through its progress callback) to stop between chunks."""


# MLX aborts the process ("terminate called without an active exception") if a worker is evaluating
# when Python shuts down: a stream left open, a draft model catching up after a request. So backends
# still open at exit are closed then, which cancels their work and waits until their workers are idle.
_open_backends: weakref.WeakSet[MLXBackend] = weakref.WeakSet()


@atexit.register
def _close_open_backends() -> None:
    for backend in list(_open_backends):
        backend.close()


# A forked child has none of its parent's worker threads: nothing there to close or wait for.
os.register_at_fork(after_in_child=_open_backends.clear)


class MLXBackend:
    """A StarCoder checkpoint loaded into MLX, run on its own worker thread.

    Args:
        load: Builds the model (``loading.load_model`` with its settings); run on the worker.
        name, path: The checkpoint, for messages (and the folder, when there is one).
        kv_bits: 4 or 8 to keep the KV cache quantized, from the first token on, so a reused
            cache gives exactly what a fresh one would.
        max_prompt_caches, max_prompt_cache_bytes: Bounds of the prompt-cache store.
        prefill_step_size: Prompt tokens per prefill step (None: see :func:`.settings.prefill_chunk`).
        prompt_cache_dir, max_prompt_cache_dir_bytes: A folder that keeps long prompt caches across
            processes, and its byte limit (see :mod:`.prompt_cache.disk`).
        prompt_cache_key: What the front knows that a kept cache must match (the tokenizer, the
            load settings); the backend adds the weights' contents and its own settings.
        draft: Builds a draft model of the same vocabulary (on the worker), for speculative decoding.
        num_draft_tokens: The draft model's draft length: always this many, or None: up to
            :data:`DEFAULT_DRAFT_TOKENS`, where the measured costs say a draft pays.
        adapter: The fine-tuning adapter ``load`` applies (None: the base): its digest joins every
            request's cache partition, so KV of one adapter (or none) never serves another.
        weights_digest: The weights' digest for the disk cache's key when the caller knows it (an
            adapter's backend on its base's weights: :meth:`with_adapter`); None: hashed from ``path``.
    """

    def __init__(
        self,
        load: Callable[[], LoadedModel],
        *,
        name: str,
        path: Path | None = None,
        kv_bits: int | None = None,
        max_prompt_caches: int = 4,
        max_prompt_cache_bytes: int | None = 4 << 30,
        prefill_step_size: int | None = None,
        prompt_cache_dir: Path | None = None,
        max_prompt_cache_dir_bytes: int = 4 << 30,
        prompt_cache_key: Mapping[str, Any] | None = None,
        draft: Callable[[], LoadedModel] | None = None,
        num_draft_tokens: int | None = None,
        adapter: Adapter | None = None,
        weights_digest: str | None = None,
    ):
        check_cache_bounds(max_prompt_caches, max_prompt_cache_bytes)
        if prefill_step_size is not None and (not is_int(prefill_step_size) or prefill_step_size < 1):
            msg = f"prefill_step_size must be a positive integer or None, not {prefill_step_size!r}."
            raise InvalidParameterError(msg)
        self.name = name
        self.path = path
        self.kv_bits = kv_bits
        self.adapter = adapter
        # What a backend on these weights with another adapter keeps the same (with_adapter).
        self._settings: dict[str, Any] = {
            "kv_bits": kv_bits,
            "max_prompt_caches": max_prompt_caches,
            "max_prompt_cache_bytes": max_prompt_cache_bytes,
            "prefill_step_size": prefill_step_size,
            "prompt_cache_dir": prompt_cache_dir,
            "max_prompt_cache_dir_bytes": max_prompt_cache_dir_bytes,
            "prompt_cache_key": prompt_cache_key,
            "num_draft_tokens": num_draft_tokens,
        }
        self._weights_digest = weights_digest
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        start_worker(self._jobs)
        self._closed = False
        self._lock = threading.Lock()
        # A backend dropped unclosed frees its worker (one open at exit is closed instead, above).
        self._retire_worker = weakref.finalize(self, retire_worker, self._jobs)
        self._retire_worker.atexit = False
        _open_backends.add(self)
        self._prompt_caches = PromptCacheStore(max_prompt_caches, max_prompt_cache_bytes)
        self._live: set[Generation] = set()  # submitted and not ended: close() cancels them
        self._disk: DiskPromptCache | None = None  # (set once the weights are loaded; close() reads it)
        # The weights' digest (for the disk cache's key) is hashed while the worker loads them.
        hashing = None
        if prompt_cache_dir is not None and weights_digest is None:
            hashing = hash_weights_aside(path, prompt_cache_dir)
        self.num_draft_tokens = num_draft_tokens
        # What passes cost here, learned per way of drafting: a draft model's drafts cost more.
        self._costs = {"lookup": PassCosts(), "draft": PassCosts()}
        try:
            self.loaded = self.call(load)  # on the worker: MLX arrays belong to the thread that made them
            self.draft_model = None if draft is None else self.call(draft).model
        except BaseException:
            self.close()
            raise
        self.model = self.loaded.model
        self.config = self.loaded.args
        self.raw_config: dict[str, Any] = self.loaded.config
        self.kv_group_size = kv_group_size(self.config, kv_bits)
        self.context_window = self.config.max_position_embeddings
        self.vocab_size = self.config.vocab_size
        self.sliding_window = self.config.sliding_window
        self._prefill_chunk = prefill_step_size or prefill_chunk(self.model)
        if prompt_cache_dir is not None:
            try:
                if self._weights_digest is None:
                    self._weights_digest = hashing.result() if hashing is not None else name
                weights = self._weights_digest
                front_key = {**(prompt_cache_key or {}), "weights": weights}
                self._disk = self._open_disk_cache(prompt_cache_dir, max_prompt_cache_dir_bytes, front_key)
            except BaseException:
                self.close()
                raise

    def with_adapter(self, adapter: Adapter) -> MLXBackend:
        """A backend on this one's weights (the same arrays: an adapter costs its own tensors only) with
        ``adapter`` applied, its own worker and prompt caches (the adapter's partition), and this one's
        settings. Closing either leaves the other running."""
        if self.adapter is not None:
            msg = (
                f"The engine for {self.name} runs the adapter {self.adapter.path} already; call with_adapter "
                "on an engine of the base model (loaded without adapter_path)."
            )
            raise InvalidParameterError(msg)
        base, draft = self.loaded, self.draft_model
        return MLXBackend(
            partial(adapted_copy, base, adapter, self.name),
            name=self.name,
            path=self.path,
            draft=None if draft is None else partial(LoadedModel, draft, None, {}),
            adapter=adapter,
            weights_digest=self._weights_digest,
            **self._settings,
        )

    def _open_disk_cache(self, folder: Path, max_bytes: int, front_key: Mapping[str, Any]) -> DiskPromptCache:
        """The folder's caches valid for exactly these weights (by content), settings and tokenizer."""
        dtypes = sorted({str(a.dtype) for _, a in tree_flatten(self.model.parameters())})
        parts = {
            **front_key,
            "parameter_dtypes": dtypes,
            "quantization": self.raw_config.get("quantization"),
            "kv_bits": self.kv_bits,
            "kv_group_size": self.kv_group_size,
            "sliding_window": self.sliding_window,
            "mlx": mx.__version__,
            "device": str(mx.default_device()),
        }
        layout = CacheLayout(
            layers=len(self.model.layers),
            kv_heads=self.config.num_key_value_heads,
            head_dim=self.config.head_dim,
            kv_bits=self.kv_bits,
            kv_group_size=self.kv_group_size,
            max_tokens=self.context_window,
        )
        return DiskPromptCache(folder, cache_key(parts), max_bytes, layout)

    # --- the worker thread ---------------------------------------------------------------------

    def _submit_job(self, fn: Callable[[], T]) -> Future[T]:
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

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the worker thread (where MLX work for this model must run) and return its result."""
        return self._submit_job(fn).result()

    def close(self) -> None:
        """Cancel what is running or queued (its callers get EngineClosedError), free the prompt
        caches and retire the worker."""
        with self._lock:  # from here on nothing new is queued
            if self._closed:
                return
            self._closed = True
            _open_backends.discard(self)
            cleared: Future[None] = Future()
            self._jobs.put(lambda: (self._prompt_caches.clear(), cleared.set_result(None)))
        for generation in list(self._live):
            generation.cancelled.set()
        try:
            cleared.result()  # the worker is idle when we return
        finally:
            self._retire_worker()
            if self._disk is not None:
                self._disk.close()  # the queued writes land before we return

    # --- the backend contract ------------------------------------------------------------------

    def submit(self, generations: Sequence[Generation]) -> Future[None]:
        gens = list(generations)

        def job() -> None:
            try:
                if len(gens) == 1:
                    self._run_one(gens[0])
                else:
                    self._run_batch(gens)
            finally:
                self._live.difference_update(gens)
            if self._closed and any(g.cancelled.is_set() for g in gens):
                msg = f"The engine for {self.name} was closed during this request; load a new one."
                raise EngineClosedError(msg)  # reaches the caller instead of a stream that never ends

        self._live.update(gens)
        try:
            return self._submit_job(job)
        except BaseException:
            self._live.difference_update(gens)
            raise

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        def run() -> np.ndarray:
            out = self.model(mx.array(list(token_ids))[None]).astype(mx.float32)
            return np.array(out[0])

        return self.call(run)

    def clear_cache(self) -> None:
        """Forget the in-memory prompt caches (files in ``prompt_cache_dir`` stay)."""
        self.call(lambda: (self._prompt_caches.clear(), mx.clear_cache()))

    @property
    def prompt_cache_bytes(self) -> int:
        return self.call(lambda: self._prompt_caches.nbytes)

    # --- generation loops (on the worker) ------------------------------------------------------

    def _new_cache(self) -> list[Any]:
        """The model's layer caches, then the draft model's (stored and reused together)."""
        if self.kv_bits is None:
            cache = make_prompt_cache(self.model)
        else:
            cache = [QuantizedKVCache(self.kv_group_size, self.kv_bits) for _ in self.model.layers]
        return cache if self.draft_model is None else cache + make_prompt_cache(self.draft_model)

    def _run_one(self, gen: Generation) -> None:
        """Prefill what the prompt cache lacks (in chunks, cancellable), then decode."""
        if gen.cancelled.is_set():  # its caller left while it waited in the queue
            return
        partition = self._partition(gen)
        cache, cached = self._take_cache(gen.prompt, partition)
        gen.sink.start(cached)
        speculation = self._speculation(gen)
        if speculation is None:
            held = self._decode_plain(gen, cache, cached)
        else:
            held = self._decode_speculative(gen, cache, cached, *speculation)
        if self._disk is not None:  # before finish: a script that exits right after still writes it
            layers = cache[: len(self.model.layers)]  # (a draft model's layers are not kept on disk)
            self._disk.offer(held[: layers[0].offset], layers, partition)
        if not gen.cancelled.is_set():
            gen.sink.finish()
        self._store(held, cache, partition)  # after finish: a draft's catching up delays no caller

    def _partition(self, gen: Generation) -> CachePartition:
        """``gen``'s cache partition under this model's adapter (the base's: the request's own)."""
        partition = gen.params.partition
        if self.adapter is None:
            return partition
        return dataclasses.replace(partition, adapter=self.adapter.digest)

    def _speculation(self, gen: Generation) -> tuple[str, int, PassCosts | None] | None:
        """How to draft (a set length always drafts; None: where the measured costs say it pays), or None:
        greedy only, without a repetition penalty (its scores depend on the history a draft changes)."""
        if gen.params.temperature > 0 or gen.params.repetition_penalty is not None:
            return None
        lookup = gen.params.prompt_lookup_num_tokens
        if self.draft_model is not None and not lookup:
            kind, k_set, k_auto = "draft", self.num_draft_tokens, DEFAULT_DRAFT_TOKENS
        else:
            kind, k_set, k_auto = "lookup", lookup, DEFAULT_LOOKUP_TOKENS
        if k_set is not None:
            return (kind, k_set, None) if k_set > 0 else None
        costs = self._costs[kind]
        if gen.grammar is not None or costs.never_pays(k_auto):  # (a grammar's mask makes every step wait)
            return None
        return kind, k_auto, costs

    def _prefill(self, model: Any, cache: list[Any], ids: Sequence[int], gen: Generation | None) -> None:
        """Run ``ids`` into ``cache`` in chunks; a cancel of ``gen`` takes effect between them."""
        for start in prefill_steps(len(ids), self._prefill_chunk, shown=gen is not None):
            if gen is not None and gen.cancelled.is_set():
                raise _Cancelled
            model(mx.array(ids[start : start + self._prefill_chunk])[None], cache=cache)
            mx.eval([c.state for c in cache])

    def _store(self, tokens: list[int], cache: list[Any], partition: CachePartition) -> None:
        """Keep ``cache`` for ``partition``'s reuse; a draft model's layers are brought to the model's."""
        n_layers = len(self.model.layers)
        held = cache[0].offset
        if self._prompt_caches.max_entries <= 0:
            return
        if len(cache) > n_layers:
            draft = cache[n_layers:]
            if draft[0].offset > held:
                trim_prompt_cache(draft, draft[0].offset - held)
            self._prefill(self.draft_model, draft, tokens[draft[0].offset : held], None)
        self._prompt_caches.put(tokens[:held], cache, partition)

    def _decode_speculative(
        self, gen: Generation, cache: list[Any], cached: int, kind: str, k_max: int, costs: PassCosts | None
    ) -> list[int]:
        """Greedy decoding with drafts (:func:`.speculative.decode`); returns the tokens the cache holds
        a prefix of. An error leaves a cache that is not trusted again (not returned: it raises)."""
        ids = gen.prompt
        n_layers = len(self.model.layers)
        target = cache[:n_layers]
        generated: list[int] = []
        try:
            self._prefill(self.model, target, ids[cached:-1], gen)
            if kind == "draft":
                draft_cache = cache[n_layers:]
                self._prefill(self.draft_model, draft_cache, ids[draft_cache[0].offset : -1], gen)
                drafter: Any = DraftModel(self.draft_model, draft_cache, ids)
            else:
                drafter = PromptLookup(ids)

            def emit(token: int) -> bool:
                generated.append(token)
                return gen.sink.token(token) or gen.cancelled.is_set()

            _, accepted, drafted = decode(
                self.model,
                target,
                ids,
                max_tokens=gen.params.max_tokens,
                drafter=drafter,
                k_max=k_max,
                costs=costs,
                emit=emit,
                grammar=gen.grammar,
            )
            gen.sink.speculated(accepted, drafted)
            if kind == "draft":
                drafter.settle()
        except _Cancelled:
            pass  # stopped between prefill chunks: what the caches hold is exact
        return ids + generated

    def _decode_plain(self, gen: Generation, cache: list[Any], cached: int) -> list[int]:
        """mlx-lm's generate_step: sampling, repetition penalties, or where drafts do not pay; returns
        the tokens the cache holds a prefix of (an error raises: that cache is not trusted again)."""
        params, ids = gen.params, gen.prompt
        cache = cache[: len(self.model.layers)]
        if params.seed is not None:
            mx.random.seed(params.seed)

        bar = prefill_bar(len(ids) - cached - 1, self._prefill_chunk)  # (the last goes in with a decode step)

        def check_cancel(done: int, total: int) -> None:  # (mlx-lm calls it once a prefill step)
            nonlocal bar
            if gen.cancelled.is_set():
                raise _Cancelled
            bar = bar and advance_to(bar, done)  # closed when done: before the first token streams

        # mlx-lm computes token n+1 before it yields token n, so at max_tokens it would run one forward
        # pass past the end (a whole decode step of waiting for the next request): ask for one token
        # less and take the last one from the sampler.
        sampled: list[mx.array] = []
        sampler = sampler_for(params)

        def sample(logprobs: mx.array) -> mx.array:
            sampled[:] = [sampler(logprobs)]
            return sampled[0]

        steps = generate_step(
            mx.array(ids[cached:]),
            self.model,
            max_tokens=params.max_tokens - 1,
            sampler=sample,
            logits_processors=logits_processors_for(params, ids[:cached], gen.grammar),
            prompt_cache=cache,
            prefill_step_size=self._prefill_chunk,
            prompt_progress_callback=check_cancel,
        )
        generated: list[int] = []
        try:
            for token, _ in steps:
                generated.append(token)
                if gen.sink.token(token) or gen.cancelled.is_set():
                    break
            else:  # max_tokens - 1 yielded: the last token was sampled, never yielded
                generated.append(int(sampled[0].item()))
                gen.sink.token(generated[-1])
        except _Cancelled:
            pass  # stopped between prefill chunks: what the cache holds is exact
        finally:
            steps.close()
            if bar is not None:
                bar.close()
        return ids + generated

    def _take_cache(self, ids: list[int], partition: CachePartition) -> tuple[list[Any], int]:
        """``partition``'s in-memory cache sharing the longest prefix with ``ids``, or a longer file's."""
        in_memory = self._prompt_caches.longest(ids, partition)
        if self._disk is not None and len(ids) - 1 >= in_memory + MIN_GAIN_TOKENS:  # else no file can win
            name, n = self._disk.longest(ids, partition)
            n = min(n, len(ids) - 1)
            if name is not None and n >= in_memory + MIN_GAIN_TOKENS:
                cache = self._disk.load(name, ids, n, partition)
                if cache is not None:  # the model's layers; a draft model's are prefilled afresh
                    draft = [] if self.draft_model is None else make_prompt_cache(self.draft_model)
                    return cache + draft, n
        return self._prompt_caches.take(ids, partition, self._new_cache)

    def _run_batch(self, gens: list[Generation]) -> None:
        """All prompts through mlx-lm's BatchGenerator at once; each ends on its own stops and length."""
        gens = [g for g in gens if not g.cancelled.is_set()]  # callers that left while it was queued
        if not gens:
            return
        params = gens[0].params  # sampling settings are one per batch; stops and lengths per prompt
        if params.seed is not None:
            mx.random.seed(params.seed)
        generator = BatchGenerator(  # each row ends when its sink says so, or at its max_tokens
            self.model,
            sampler=sampler_for(params),
            logits_processors=logits_processors_for(params, ()),
            prefill_batch_size=len(gens),
            completion_batch_size=len(gens),
            prefill_step_size=self._prefill_chunk,
        )
        try:
            prompts = [g.prompt for g in gens]
            rows = [logits_processors_for(params, (), g.grammar) or [] for g in gens]  # a matcher per row
            uids = generator.insert(prompts, [g.params.max_tokens for g in gens], logits_processors=rows)
            live = dict(zip(uids, gens, strict=True))
            for gen in gens:
                gen.sink.start(0)
            while live:
                left = [uid for uid, g in live.items() if g.cancelled.is_set()]
                if left:
                    generator.remove(left)
                    for uid in left:
                        del live[uid]
                    if not live:
                        return
                _, responses = generator.next()  # one prefill chunk, or one decode step
                for response in responses:
                    gen = live.get(response.uid)
                    if gen is None:
                        continue
                    if not gen.sink.token(response.token) and response.finish_reason is None:
                        continue
                    del live[response.uid]
                    if response.finish_reason is None:  # the front stopped it: free its row
                        generator.remove([response.uid])
                    gen.sink.finish()
        finally:
            generator.close()
