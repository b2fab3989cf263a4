"""StarCoderEngine, the front: text and prompts in, token ids to a backend, text chunks out.

Its public methods (sync, async, stream, batch, infill) are the API. Each generating method is a
line: one call to :mod:`.prepare` (settings, prompt, budget, constraint, filters: a complete
:class:`~.jobs.Job`), one to :mod:`.jobs` (submit it, stream or collect its chunks). Building the
backend (:mod:`.building`), checks (:mod:`.checks`) and FIM prompts with repository context
(:mod:`.fim_prompts`) live beside it, as helpers that take what they need (the backend, the
tokenizer, the context window) and return: this module imports them, never the other way round.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np

from .._tokens import encode_segments
from ..backends import Backend
from ..fim import build as fim
from ..fim.request import FIMRequest
from ..types import Completion, CompletionChunk, GenerationParams, check_text, join_chunks
from . import checks, fim_prompts, jobs
from .building import adapted_backend, connect_backend, llama_cpp_backend, mlx_backend
from .options import LlamaCppOptions, MLXOptions, RemoteOptions, load_options, remote_options
from .prepare import (
    Parts,
    Prompt,
    prepare,
    prepare_batch,
    prepare_infill,
    prepare_infill_later,
    prepare_later,
)


class StarCoderEngine:
    """A StarCoder model (StarCoder2 or the first StarCoder family) with KV-cached, streaming,
    stoppable generation and fill-in-the-middle.

    The engine is the front: it owns the tokenizer and everything about text (prompt building,
    FIM layouts and budgets, stop strings, streaming detokenization, counts) and hands token ids to
    a backend (:mod:`langchain_starcoder.backends`), which runs them.

    Setup:
        .. code-block:: bash

            pip install langchain-starcoder

    Key init args (of :meth:`load`):
        model: str
            Hub id (``mlx-community/starcoder2-3b-4bit``) or a local checkpoint folder.
        quantize: int | None
            4 or 8 to quantize a full-precision checkpoint while loading.
        dtype: str
            "auto" (float32 compute on the CPU, the checkpoint's dtype on a GPU), "float32",
            "float16" or "bfloat16".
        kv_bits: int | None
            4 or 8 to keep the KV cache quantized (about 4x / 2x smaller than float16).
        adapter_path: str | None
            A fine-tuning adapter's folder (LoRA, DoRA or full; ``langchain-starcoder finetune``'s or
            ``mlx_lm.lora``'s), applied on load; :attr:`adapter` says which.
        max_prompt_caches: int
            How many recent requests' KV caches to keep for prefix reuse (default 4).
        max_prompt_cache_bytes: int | None
            A bound on their total size (default 4 GiB). A cache costs
            ``2 * layers * kv_heads * head_dim * bytes`` per token: 60 KiB per token for
            starcoder2-3b in float32 (30 x 2 x 128 x 4 x 2), so a full 16k context is about 1 GiB.
        prompt_cache_dir: str | None
            A folder that keeps long prompt caches across processes (docs/prompt-cache.md): a new
            process reuses a repository context prefilled by an earlier one.

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

    Threads: every MLX call of an engine runs on the backend's own worker thread (MLX streams are
    thread-local); any number of threads and event loops may call it at once. Requests run one
    after another in arrival order; ``generate_batch`` runs its prompts together. Leaving a stream,
    closing it, or cancelling a task cancels its request, also while its prompt is prefilled.
    """

    def __init__(self, backend: Backend, tokenizer: Any, *, name: str | None = None):
        self.backend = backend
        self.tokenizer = tokenizer
        self.name = name or backend.name
        self._parts = Parts.of(backend, tokenizer)  # what preparing a request needs
        self._codec = self._parts.codec
        self._encode_parsed = self._parts.encode_parsed
        self.eos_token_ids = self._parts.eos_token_ids

    @classmethod
    def load(
        cls,
        model: str | os.PathLike[str],
        *,
        options: MLXOptions | LlamaCppOptions | None = None,
        backend: str | None = None,
        llama_cpp: Any = None,
        **settings: Any,
    ) -> StarCoderEngine:
        """Load a StarCoder2 checkpoint from a folder, a GGUF file or the Hugging Face hub into MLX
        (or, with ``backend="llama.cpp"``, into a llama.cpp server this engine starts and owns).

        ``load(model, options=MLXOptions(quantize=4))``, or the same as keywords:
        ``load(model, quantize=4)``.

        Args:
            model: A local folder, a hub id (downloaded and cached by huggingface_hub; set
                ``HF_HUB_OFFLINE=1`` to use the cache only), or a local ``.gguf`` file (llama.cpp,
                Ollama).
            options: Where and how the model runs, its type the backend:
                :class:`~langchain_starcoder.MLXOptions` (in this process; their docs list every
                setting: ``quantize``, ``dtype``, ``kv_bits``, the prompt caches, a draft model...)
                or :class:`~langchain_starcoder.LlamaCppOptions` (a ``llama-server`` child process
                on a free 127.0.0.1 port, converting a folder to GGUF once: docs/scaling-out.md).
            backend: Without ``options``: "mlx" (the default) or "llama.cpp".
            llama_cpp: With ``backend="llama.cpp"``: a dict of the server's settings (threads,
                slots, context, outtype, inexact_past_window, server_args...) or their options.
            settings: Without ``options``: the fields of the backend's options, as keywords. One
                that the backend does not take is refused, naming the backend that does.
        """
        options = load_options(options, backend, llama_cpp, **settings)
        if isinstance(options, LlamaCppOptions):
            managed, tokenizer = llama_cpp_backend(model, options)
            return cls(managed, tokenizer, name=str(model))
        return cls(*mlx_backend(model, options))

    @classmethod
    def connect(
        cls,
        base_url: str,
        *,
        model: str,
        options: RemoteOptions | None = None,
        **settings: Any,
    ) -> StarCoderEngine:
        """An engine whose model runs on a vLLM server or a llama.cpp ``llama-server`` (docs/scaling-out.md).

        The tokenizer, prompt building, stop strings and detokenization stay here; the server gets
        token ids and streams token ids back, so text is never re-tokenized by the server (where a
        ``<file_sep>`` in a user's file would become a control token).

        Args:
            base_url: The server's root, e.g. ``http://127.0.0.1:8080``.
            model: The served model's name (vLLM: the hub id or ``--served-model-name``; llama.cpp:
                ``--alias``); unless the options' ``tokenizer`` is given, also where the tokenizer
                comes from.
            options: How to reach it: :class:`~langchain_starcoder.RemoteOptions` (``tokenizer``,
                ``api_key``, ``timeout``, ``deadline``, ``max_retries``, ``max_concurrency``,
                ``inexact_past_window``, ``adapter``: a LoRA adapter vLLM serves over ``model``; their
                docs say what each does).
            settings: Without ``options``: its fields as keywords (``timeout=120``).

        A server whose model has another vocabulary size or training context than the tokenizer's
        checkpoint is refused here.
        """
        options = remote_options(options, **settings)
        backend, tokenizer = connect_backend(base_url, model=model, options=options)
        return cls(backend, tokenizer, name=model)

    def with_adapter(self, adapter_path: str | os.PathLike[str]) -> StarCoderEngine:
        """An engine on this engine's base weights with the adapter in folder ``adapter_path`` applied
        (docs/engine.md, "Adapters"): on MLX the same weight arrays, not a copy (the adapter costs its own
        tensors only), its own worker and prompt caches (no KV crosses adapters). Closing it leaves this
        engine running, and closing this one leaves it running. This engine must run without an adapter;
        an adapter of another base is refused naming both. ``serve --adapter NAME=DIR`` serves each so.
        """
        return StarCoderEngine(adapted_backend(self.backend, adapter_path), self.tokenizer, name=self.name)

    def close(self) -> None:
        """Free the backend (weights, prompt caches, worker). The engine cannot be used after."""
        self.backend.close()

    # --- what the backend knows --------------------------------------------------------------

    @property
    def context_window(self) -> int:
        """The most tokens a prompt plus its generation may have."""
        return self.backend.context_window

    @property
    def vocab_size(self) -> int:
        return self.backend.vocab_size

    @property
    def sliding_window(self) -> int | None:
        return getattr(self.backend, "sliding_window", None)

    @property
    def kv_bits(self) -> int | None:
        return getattr(self.backend, "kv_bits", None)

    @property
    def adapter(self) -> Any:
        """The fine-tuning adapter the model runs with (:class:`~langchain_starcoder.loading.adapter.Adapter`:
        its ``path``, ``fine_tune_type``, ``rank`` and ``digest``), or None."""
        return getattr(self.backend, "adapter", None)

    @property
    def path(self) -> Any:
        """The local checkpoint folder (None for a remote backend)."""
        return getattr(self.backend, "path", None)

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """float32 logits of shape ``[len(token_ids), vocab]`` from one full forward pass, no cache."""
        return self.backend.logits(checks.check_ids(token_ids, self.vocab_size))

    def clear_cache(self) -> None:
        """Drop every kept prompt cache and free what it held."""
        self.backend.clear_cache()

    @property
    def prompt_cache_bytes(self) -> int:
        return self.backend.prompt_cache_bytes

    # --- tokens ------------------------------------------------------------------------------

    def encode(self, text: str, *, special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``. With ``special_tokens=False`` control-token strings in the text
        (``<file_sep>``, ``<|endoftext|>``...) are encoded as plain text: use it for untrusted data."""
        check_text(text, "text")
        return self._encode_parsed(text) if special_tokens else self._codec.encode_data(text)

    def encode_segments(self, segments: Iterable[tuple[str, bool]], *, check_size: bool = True) -> list[int]:
        """Ids of a prompt in pieces ``(text, is_data)``: control-token strings count only in
        pieces that are not data (see :func:`langchain_starcoder._tokens.encode_segments`).
        Raises ContextLengthError, before tokenizing, for text too long for the context window
        (``check_size=False`` to count the tokens of any text)."""
        segments = list(segments)
        if check_size:
            self.check_prompt_size(sum(len(text) for text, _ in segments))
        return encode_segments(self._codec, segments)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def token_id(self, token: str) -> int | None:
        """The id of a control token such as ``<fim_prefix>`` (an added token the tokenizer marks
        special), or None if the tokenizer has no such control token."""
        return self._codec.token_id(token)

    def check_prompt_size(self, chars: int, max_tokens: int = 0) -> None:
        """Raise ContextLengthError if a text prompt of ``chars`` characters cannot fit in the
        context window with ``max_tokens`` to generate, without tokenizing it: a token stands for
        at most so many characters (:func:`langchain_starcoder._tokens.max_text_chars`)."""
        checks.check_prompt_size(self.tokenizer, self.context_window, chars, max_tokens)

    # --- generation ------------------------------------------------------------------------------

    def generate(self, prompt: Prompt, **settings: Any) -> Completion:
        """Generate a completion of ``prompt``: text, token ids, or a :class:`FIMRequest` (then
        the middle, as :meth:`infill` answers it).

        Keyword args: the generation settings of :class:`~langchain_starcoder.GenerationParams`
        (``max_tokens=256``, ``temperature=0.0`` (greedy), ``top_p``, ``top_k``, ``min_p``, ``seed``,
        ``repetition_penalty``, ``stop=()``: strings, the text ends before the first that appears;
        ``stop_token_ids``; ``cache_salt``: only calls of one salt share cached prompts), and
        ``parse_special_tokens=True``: whether control-token strings written in a text prompt
        (``<fim_prefix>``...) are control tokens. Pass False for text you did not write (all data).
        """
        return join_chunks(self.stream(prompt, **settings))

    def stream(self, prompt: Prompt, **settings: Any) -> Iterator[CompletionChunk]:
        """Like :meth:`generate`, yielding chunks of text as they are ready.

        No chunk holds any part of a stop string. Leaving the loop early, closing the stream or
        dropping it cancels the generation.
        """
        return jobs.stream(self.backend, self.tokenizer, prepare(self._parts, prompt, settings))

    async def agenerate(self, prompt: Prompt, **settings: Any) -> Completion:
        return join_chunks([c async for c in self.astream(prompt, **settings)])

    def astream(self, prompt: Prompt, **settings: Any) -> AsyncIterator[CompletionChunk]:
        """Async :meth:`stream`: the event loop is never blocked (the prompt is tokenized in a
        thread); cancelling the task or closing the stream cancels the request."""
        return jobs.astream(self.backend, self.tokenizer, prepare_later(self._parts, prompt, settings))

    def astream_fim_prompt(
        self, request: FIMRequest, prompt: fim.FIMPrompt, **settings: Any
    ) -> AsyncIterator[CompletionChunk]:
        """:meth:`astream` of ``request`` with ``prompt``: as fim_prompt built it for these settings."""
        later = partial(prepare, self._parts, request, settings, prompt)  # bad settings fail when iterated
        return jobs.astream(self.backend, self.tokenizer, later)

    def generate_batch(self, prompts: Sequence[Prompt], **settings: Any) -> list[Completion]:
        """Generate for several prompts at once (truly batched), each as it would alone (greedy).
        Prompts of every kind (text, ids, :class:`FIMRequest`) may share one batch."""
        return jobs.collect(self.backend, self.tokenizer, prepare_batch(self._parts, prompts, settings))

    async def agenerate_batch(self, prompts: Sequence[Prompt], **settings: Any) -> list[Completion]:
        """Async :meth:`generate_batch`; cancelling the task cancels every prompt of the batch."""
        batch = await asyncio.to_thread(prepare_batch, self._parts, prompts, settings)
        return await jobs.acollect(self.backend, self.tokenizer, batch)

    # --- fill in the middle ------------------------------------------------------------------

    def infill(self, prefix: str | FIMRequest, suffix: str = "", **settings: Any) -> Completion:
        """Generate the code between ``prefix`` and ``suffix``; ``text`` is the middle only.

        Takes a :class:`~langchain_starcoder.fim.request.FIMRequest`, or its fields as arguments
        (``prefix``, ``suffix``, ``context_files``, ``repo_name``, ``file_path``, ``mode``,
        ``max_prompt_tokens``, ``trim_suffix_overlap``, ``end``, ``min_indent``, ``notebook``), the
        settings of :meth:`generate`, and ``repo``: a :class:`~langchain_starcoder.RepoIndex` that picks
        context files for ``file_path`` within the budget the hole leaves (given files win). The prompt
        is built by :func:`langchain_starcoder.fim.build_fim_prompt` (PSM or SPM; StarCoder2's repository
        layout with context files, a repo name or a file path) within ``max_prompt_tokens`` (default:
        the context window minus ``max_tokens``). Generation stops at ``<|endoftext|>``, ``<file_sep>``,
        ``<repo_name>`` and the ``<fim_*>`` tokens, at any ``stop`` string, and with ``end="auto"``
        (default) where the code says the middle is complete (:func:`~langchain_starcoder.middle_end`,
        checked at each newline; ``Completion.middle_end`` says so). With ``trim_suffix_overlap``
        (default) an end that repeats the start of the suffix is dropped (:mod:`.overlap`).

        Prompt cache: the layout puts the repo name and context files first, then the hole's file,
        so repeated infills with the same files reuse their KV cache and prefill only from the first
        changed token. In PSM an edit at the hole re-prefills the end of the prefix and the suffix;
        in SPM (suffix before prefix) it re-prefills only the end of the prefix.
        """
        return join_chunks(self.stream_infill(prefix, suffix, **settings))

    def stream_infill(
        self, prefix: str | FIMRequest, suffix: str = "", **settings: Any
    ) -> Iterator[CompletionChunk]:
        """:meth:`infill`, streamed. Text that may turn out to repeat the suffix is held back until
        the next chunk settles it (or the end trims it)."""
        job = prepare_infill(self._parts, prefix, suffix, settings)
        return jobs.stream(self.backend, self.tokenizer, job)

    async def ainfill(self, prefix: str | FIMRequest, suffix: str = "", **settings: Any) -> Completion:
        """Async :meth:`infill` (the prompt is built in a thread)."""
        return join_chunks([c async for c in self.astream_infill(prefix, suffix, **settings)])

    def astream_infill(
        self, prefix: str | FIMRequest, suffix: str = "", **settings: Any
    ) -> AsyncIterator[CompletionChunk]:
        """Async :meth:`stream_infill`: the prompt is built in a thread, off the event loop."""
        later = prepare_infill_later(self._parts, prefix, suffix, settings)  # bad settings fail here
        return jobs.astream(self.backend, self.tokenizer, later)

    def infill_batch(self, requests: Sequence[FIMRequest], **settings: Any) -> list[Completion]:
        """Several :class:`FIMRequest`\\ s as one batch (:meth:`generate_batch` takes them too).
        ``repo=index`` gives the index to every request that has no ``repo`` of its own."""
        batch = prepare_batch(self._parts, requests, settings, infill=True)
        return jobs.collect(self.backend, self.tokenizer, batch)

    async def ainfill_batch(self, requests: Sequence[FIMRequest], **settings: Any) -> list[Completion]:
        """Async :meth:`infill_batch` (prompts and repository lookups in a thread); cancelling the
        task cancels the batch."""
        batch = await asyncio.to_thread(prepare_batch, self._parts, requests, settings, infill=True)
        return await jobs.acollect(self.backend, self.tokenizer, batch)

    def fim_prompt(self, request: FIMRequest, max_tokens: int = GenerationParams.max_tokens) -> fim.FIMPrompt:
        """The prompt :meth:`infill` builds for ``request`` when generating ``max_tokens``.

        With ``request.repo`` and no ``context_files``, the index picks them (README "Repository
        context"): the hole's part (as much of the prefix and suffix as the budget keeps, its file
        path and control tokens) is measured first, and the index gets the rest of the budget.
        """
        return fim_prompts.fim_prompt(self.tokenizer, self.context_window, request, max_tokens)

    def add_repo_context(
        self, request: FIMRequest, max_tokens: int = GenerationParams.max_tokens
    ) -> FIMRequest:
        """``request`` with its ``repo``'s context files after its own ``context_files`` (which stay
        first), in the budget its hole and its own files leave when generating ``max_tokens``, and
        ``file_path`` relative to the repository; a repository excerpt whose every line a given file
        of the same path holds is left out. (:meth:`infill` instead lets given files win.)"""
        return fim_prompts.add_repo_context(self.tokenizer, self.context_window, request, max_tokens)
