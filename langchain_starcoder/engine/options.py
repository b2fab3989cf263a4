"""The typed settings of :meth:`~langchain_starcoder.StarCoderEngine.load` and ``connect``: one frozen
dataclass per way to run a model (:class:`MLXOptions` in this process, :class:`LlamaCppOptions` in a
llama-server child, :class:`RemoteOptions` on a server elsewhere). Each refuses a bad value when it is
made, and is hashable: the shared registry keys its engines on them.

``load``'s and ``connect``'s keyword form (``load(model, quantize=4)``) becomes options here, in
:func:`load_options` and :func:`remote_options`: a keyword that is a field of another way's options
is refused, naming the way that takes it (left at its default, it is not a choice, and is dropped).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..backends.llama_options import LlamaCppOptions as LlamaServerOptions
from ..errors import InvalidParameterError
from ..types import MAX_DRAFT_TOKENS, is_int


@dataclass(frozen=True, kw_only=True)
class _Checkpoint:
    """The fields of the ways that load a checkpoint themselves: its hub revision, GGUF file and adapter."""

    revision: str | None = None
    gguf_file: str | None = None
    adapter_path: str | os.PathLike[str] | None = None


@dataclass(frozen=True, kw_only=True)
class MLXOptions(_Checkpoint):
    """How :meth:`~langchain_starcoder.StarCoderEngine.load` runs a checkpoint in this process, on
    MLX (the default backend): ``StarCoderEngine.load(model, options=MLXOptions(quantize=4))``.

    Args:
        revision: A hub branch, tag or commit to pin the download to.
        gguf_file: The GGUF file to load from the folder or hub repo ``model`` (the hub download
            fetches that one file; ``revision`` pins it). Config and tokenizer come from the file.
            Q4_0, Q4_1 and Q8_0 stay quantized; Q2_K, Q4_K and Q6_K are dequantized (a notice says
            what memory that costs); other types are refused.
        adapter_path: A fine-tuning adapter's folder (``adapters.safetensors`` and ``adapter_config.json``,
            as ``langchain-starcoder finetune`` and ``mlx_lm.lora`` write them: LoRA, DoRA or full
            weights), applied unfused with mlx-lm's ``load_adapters``. One trained on another base, or
            whose files disagree (rank, target modules), or a damaged one is refused. Prompt caches
            are kept apart per adapter (its digest is part of every key, in memory and on disk).
        sliding_window: StarCoder2 GGUF files only (they do not record it): the attention window, 0
            for full attention. By default StarCoder2's published 4096, with a notice.
        quantize: None, 4 or 8: quantize a full-precision checkpoint on load. A checkpoint that is
            already quantized loads as it is; asking to quantize it again is an error.
        group_size: Quantization group size (32, 64 or 128), with ``quantize``.
        dtype: "auto" picks per device: float32 compute on the CPU (including quantization scales;
            MLX's float16 CPU kernels are up to 35x slower), the checkpoint's dtype on a GPU. Or
            "float32", "float16", "bfloat16".
        kv_bits: None, 4 or 8: keep the KV cache quantized from the first token on (a reused prompt
            cache then gives exactly what a fresh one would).
        max_prompt_caches, max_prompt_cache_bytes: How many recent requests' KV caches are kept for
            prefix reuse, and a bound on their total size (None: no bound); see
            :class:`~langchain_starcoder.StarCoderEngine`.
        prefill_step_size: Prompt tokens per prefill step; a cancelled request stops between steps.
            None: 2048 on a GPU, about 4 GFLOP of work on the CPU (16 to 2048 tokens).
        prompt_cache_dir: A folder (made if missing) where prompt caches of at least 256 new tokens
            are kept, so a request in this or a later process whose prompt shares a prefix with one
            loads it instead of prefilling (``cached_tokens`` counts it). A file is used only by the
            same weights (by content), dtype, quantization, ``kv_bits``, window, tokenizer and adapter; a
            damaged one is removed with a ``PromptCacheNotice``. A folder that cannot be written
            gives one notice.
        max_prompt_cache_dir_bytes: The folder's byte limit; least recently used files go first.
        draft_model: A smaller checkpoint of the same vocabulary (a folder, hub id or ``.gguf``
            file; loaded with ``dtype``, as it is stored) that drafts tokens for greedy generation,
            verified by this model in one pass: the output is unchanged (docs/engine.md,
            "Speculative decoding"). A different vocabulary is refused.
        num_draft_tokens: The draft model's tokens per verification: always this many, or None: up
            to 4, only where the measured costs and the acceptance make a draft pay.
    """

    backend: ClassVar[str] = "mlx"
    where: ClassVar[str] = 'the MLX backend (backend="mlx", MLXOptions)'

    sliding_window: int | None = None
    quantize: int | None = None
    group_size: int = 64
    dtype: str = "auto"
    kv_bits: int | None = None
    max_prompt_caches: int = 4
    max_prompt_cache_bytes: int | None = 4 << 30
    prefill_step_size: int | None = None
    prompt_cache_dir: str | os.PathLike[str] | None = None
    max_prompt_cache_dir_bytes: int = 4 << 30
    draft_model: str | os.PathLike[str] | None = None
    num_draft_tokens: int | None = None

    def __post_init__(self) -> None:
        # The loader's and the prompt-cache store's own checks (imported here: they import MLX).
        from ..backends.settings import check_cache_bounds
        from ..loading import validate_load_options

        validate_load_options(self.quantize, self.group_size, self.dtype, self.kv_bits)
        check_cache_bounds(self.max_prompt_caches, self.max_prompt_cache_bytes)
        step = self.prefill_step_size
        if step is not None and (not is_int(step) or step < 1):
            msg = f"prefill_step_size must be a positive integer or None, not {step!r}."
            raise InvalidParameterError(msg)
        limit = self.max_prompt_cache_dir_bytes
        if not is_int(limit) or limit < 0:
            msg = f"max_prompt_cache_dir_bytes must be an integer >= 0, not {limit!r}."
            raise InvalidParameterError(msg)
        n = self.num_draft_tokens
        if n is not None and (not is_int(n) or not 1 <= n <= MAX_DRAFT_TOKENS):
            msg = (
                f"num_draft_tokens must be an integer from 1 to {MAX_DRAFT_TOKENS}, or None (drafts "
                f"where they pay), not {n!r}."
            )
            raise InvalidParameterError(msg)


@dataclass(frozen=True, kw_only=True)
class LlamaCppOptions(LlamaServerOptions, _Checkpoint):
    """How :meth:`~langchain_starcoder.StarCoderEngine.load` runs a checkpoint in a ``llama-server``
    child process (the ``llama-cpp`` extra): ``load(model, options=LlamaCppOptions(threads=8))``, the
    same as ``load(model, backend="llama.cpp", llama_cpp={"threads": 8})``.

    The child listens on a free 127.0.0.1 port with a random API key, is driven by token ids like
    :meth:`~langchain_starcoder.StarCoderEngine.connect`, stops when the engine closes or the process
    exits, and starts again on the next call if it died. A folder is converted to GGUF once and kept
    in the cache; a ``.gguf`` file is served as it is (docs/scaling-out.md). By default a StarCoder2
    request holds at most its sliding window, which llama.cpp ignores: answers stay equal to the
    model's.

    Args:
        revision, gguf_file: As :class:`MLXOptions`'s: the hub revision, and the GGUF file to serve
            from the folder or hub repo ``model``.
        adapter_path: A LoRA adapter's folder (mlx-lm's), converted once to llama.cpp's GGUF adapter
            (cached by its digest) and run with ``--lora`` over the base GGUF; DoRA and full weights
            cannot run there (an error names ``export-adapter --fused``).
        threads, slots, context, outtype, inexact_past_window, server_args, startup_timeout,
            cache_dir: The managed server's settings, fields (and checks) of the base class
            :class:`langchain_starcoder.backends.managed_llama.LlamaCppOptions`, which documents them.
    """

    backend: ClassVar[str] = "llama.cpp"
    where: ClassVar[str] = 'the llama.cpp backend (backend="llama.cpp", LlamaCppOptions)'


@dataclass(frozen=True, kw_only=True)
class RemoteOptions:
    """How :meth:`~langchain_starcoder.StarCoderEngine.connect` reaches a model served by vLLM or a
    llama.cpp ``llama-server`` (docs/scaling-out.md):
    ``connect(base_url, model=name, options=RemoteOptions(timeout=120))``.

    Args:
        tokenizer: A checkpoint folder, hub id or local ``.gguf`` file to take the tokenizer (and
            config) from, when it is not ``model``; from the hub only tokenizer and config files are
            fetched, never weights, and of a GGUF file only its header is read.
        api_key: Sent as a bearer token; never logged or shown (nor in this object's repr).
        timeout: Seconds the server may go without sending a token: from the request to the first
            (connect, prefill) and between tokens; keep-alive comments do not count.
        deadline: Seconds one request may take in all, retries included, however the server keeps
            it going (None: no bound).
        max_retries: Retries, with backoff, of a connect error or a 503 before the first token.
        max_concurrency: HTTP streams in flight at once (the server batches them).
        inexact_past_window: llama.cpp's StarCoder2 ignores the sliding window, so on a llama.cpp
            server a StarCoder2 request holds at most the window (``context_window``), and answers
            equal the model's. True allows the server's whole context, inexactly past the window.
            vLLM applies the window: no limit there.
        adapter: The name of a LoRA adapter a vLLM server serves over ``model`` (``vllm serve M
            --enable-lora --lora-modules NAME=PEFT_DIR``, PEFT_DIR from ``langchain-starcoder
            export-adapter --peft``): every request runs with it (``model: NAME``). Checked at
            connect against ``/v1/models``; an adapter vLLM cannot apply is served fused instead
            (``export-adapter --fused OUT``, then ``vllm serve OUT``), connected to without it.
    """

    backend: ClassVar[str] = "remote"
    where: ClassVar[str] = "a model served elsewhere (StarCoderEngine.connect, RemoteOptions)"

    tokenizer: str | os.PathLike[str] | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 60.0
    deadline: float | None = None
    max_retries: int = 2
    max_concurrency: int = 16
    inexact_past_window: bool = False
    adapter: str | None = None

    def __post_init__(self) -> None:
        if self.adapter is not None and (not isinstance(self.adapter, str) or not self.adapter):
            msg = f"adapter must be the name a vLLM server serves a LoRA adapter under, not {self.adapter!r}."
            raise InvalidParameterError(msg)
        for name, seconds in (("timeout", self.timeout), ("deadline", self.deadline)):
            if seconds is None and name == "deadline":
                continue
            if (
                not isinstance(seconds, int | float)
                or isinstance(seconds, bool)
                or not 0 < seconds < math.inf
            ):
                msg = f"{name} must be a positive number of seconds, not {seconds!r}."
                raise InvalidParameterError(msg)
        for name, least in (("max_retries", 0), ("max_concurrency", 1)):
            value = getattr(self, name)
            if not is_int(value) or value < least:
                msg = f"{name} must be an integer >= {least}, not {value!r}."
                raise InvalidParameterError(msg)


#: What ``load`` runs a checkpoint on, by its ``backend=`` name.
LoadOptions = MLXOptions | LlamaCppOptions
_LOCAL: dict[str, type[MLXOptions] | type[LlamaCppOptions]] = {
    "mlx": MLXOptions,
    "llama.cpp": LlamaCppOptions,
}
_KINDS = (MLXOptions, LlamaCppOptions, RemoteOptions)


def load_options(
    options: LoadOptions | None = None,
    backend: str | None = None,
    llama_cpp: Any = None,
    **settings: Any,
) -> LoadOptions:
    """``options`` as given, or the options of ``load``'s keyword form: ``backend`` ("mlx" by
    default) and its options' fields as keywords, the llama.cpp server's also in ``llama_cpp`` (a
    dict of them, or its :class:`~langchain_starcoder.backends.managed_llama.LlamaCppOptions`)."""
    if options is not None:
        return _given(options, (MLXOptions, LlamaCppOptions), settings, backend=backend, llama_cpp=llama_cpp)
    if backend is None:
        backend = "mlx"
    if backend not in _LOCAL:
        msg = f'backend must be "mlx" or "llama.cpp", not {backend!r}.'
        raise InvalidParameterError(msg)
    if llama_cpp is not None:
        if backend != "llama.cpp":
            msg = 'llama_cpp= options apply to backend="llama.cpp".'
            raise InvalidParameterError(msg)
        server = _server_settings(llama_cpp)
        twice = sorted(server.keys() & settings.keys())
        if twice:
            msg = f"{twice} are given twice: as keywords and in llama_cpp=; give each once."
            raise InvalidParameterError(msg)
        settings = {**server, **settings}
    return _build(_LOCAL[backend], settings, f'backend="{backend}"')


def remote_options(options: RemoteOptions | None = None, **settings: Any) -> RemoteOptions:
    """``options`` as given, or the options of ``connect``'s keyword form (``timeout=120``...)."""
    if settings.get("adapter_path") is not None:
        msg = (
            "adapter_path is for a model loaded here; a server applies its own adapters: serve it with "
            "vLLM (langchain-starcoder export-adapter --model M --adapter DIR --peft PEFT_DIR, then vllm "
            "serve M --enable-lora --lora-modules NAME=PEFT_DIR) and connect with adapter=NAME, or serve "
            "the fused checkpoint (export-adapter --model M --adapter DIR --fused OUT) and connect to that."
        )
        raise InvalidParameterError(msg)
    if options is not None:
        return _given(options, (RemoteOptions,), settings)
    return _build(RemoteOptions, settings, "StarCoderEngine.connect")


def misplaced(kind: type, settings: Mapping[str, Any]) -> dict[str, type]:
    """The settings that are not fields of ``kind`` (given away from their defaults: at its default a
    setting is no choice), each with the options class that has the field. A setting no class has
    is a TypeError, as an unknown keyword is."""
    wrong = {}
    for name, value in settings.items():
        if name in _defaults(kind):
            continue
        taker = next((k for k in _KINDS if name in _defaults(k)), None)
        if taker is None:
            msg = (
                f"unexpected keyword argument {name!r}: not a setting of StarCoderEngine.load or "
                f"connect (the fields of {', '.join(k.__name__ for k in _KINDS)})."
            )
            raise TypeError(msg)
        if value != _defaults(taker)[name]:
            wrong[name] = taker
    return wrong


def _build(kind: type, settings: Mapping[str, Any], target: str) -> Any:
    """``kind`` of ``settings``; one that belongs to another kind is refused, naming it and ``target``."""
    wrong = misplaced(kind, settings)
    if wrong:
        groups = {taker: sorted(n for n, t in wrong.items() if t is taker) for taker in wrong.values()}
        apply = "; ".join(f"{names} apply to {taker.where}" for taker, names in groups.items())
        msg = f"{apply}, not to {target}."
        raise InvalidParameterError(msg)
    return kind(**{name: value for name, value in settings.items() if name in _defaults(kind)})


def _given(options: Any, kinds: tuple[type, ...], settings: Mapping[str, Any], **selectors: Any) -> Any:
    """Options given whole: of the right kind, with no keyword beside them (where would it go?)."""
    if not isinstance(options, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        which = f", which are for {options.where}" if isinstance(options, _KINDS) else ""
        msg = f"options must be {names}, not {type(options).__name__}{which}."
        raise InvalidParameterError(msg)
    backend = selectors.pop("backend", None)
    extra = sorted([*settings, *(k for k, v in selectors.items() if v is not None)])
    if extra or backend not in (None, options.backend):
        given = extra or [f'backend="{backend}"']
        msg = f"give options= or keywords, not both: {given} beside {type(options).__name__}; put them in it."
        raise InvalidParameterError(msg)
    return options


def _server_settings(llama_cpp: Any) -> dict[str, Any]:
    """The llama.cpp server's settings from ``llama_cpp=``: a dict, or options (those changed)."""
    if isinstance(llama_cpp, Mapping):
        return dict(llama_cpp)
    if not dataclasses.is_dataclass(llama_cpp) or isinstance(llama_cpp, type):
        msg = f"llama_cpp must be a dict or LlamaCppOptions, not {type(llama_cpp).__name__}."
        raise InvalidParameterError(msg)
    defaults = _defaults(type(llama_cpp))
    return {n: getattr(llama_cpp, n) for n in defaults if getattr(llama_cpp, n) != defaults[n]}


@functools.cache
def _defaults(kind: type) -> dict[str, Any]:
    """The fields of an options class and their defaults."""
    return {f.name: f.default for f in dataclasses.fields(kind)}
