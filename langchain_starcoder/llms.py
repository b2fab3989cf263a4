"""LangChain ``StarCoderLLM``: a StarCoder2 completion model running in-process on MLX."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseLLM, LangSmithParams, LanguageModelInput
from langchain_core.outputs import Generation, GenerationChunk, LLMResult
from langchain_core.prompt_values import PromptValue
from langchain_core.runnables import RunnableConfig
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .engine import Completion, CompletionChunk, GenerationParams, StarCoderEngine
from .errors import ContextLengthError, InvalidParameterError
from .fim import FIMPrompt, build_fim_prompt, trim_suffix_overlap
from .prompts import FIMPromptValue, FIMRequest, FIMText, to_context_files
from .registry import DEFAULT_MODEL, get_engine, peek_engine

if TYPE_CHECKING:
    from typing_extensions import Self


#: Generation settings a call may override, e.g. ``llm.invoke(prompt, max_tokens=32)``.
GENERATION_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed")
_CALL_KEYS = frozenset((*GENERATION_KEYS, "model"))


def merge_stops(*stops: Sequence[str] | str | None) -> list[str]:
    """The stop strings of the field and of the call, in that order, without duplicates."""
    merged: list[str] = []
    for group in stops:
        for stop in [group] if isinstance(group, str) else group or ():
            if stop not in merged:
                merged.append(stop)
    return merged


class StarCoderBase(BaseModel):
    """Fields and engine plumbing shared by :class:`StarCoderLLM` and ``ChatStarCoder``."""

    model_config = ConfigDict(
        extra="forbid", arbitrary_types_allowed=True, protected_namespaces=(), use_attribute_docstrings=True
    )

    model: str = DEFAULT_MODEL
    """Hugging Face hub id (``mlx-community/starcoder2-3b-4bit``) or a local checkpoint folder."""

    quantize: Literal[4, 8] | None = None
    """4 or 8 to quantize a full-precision checkpoint while loading; None loads it as it is."""

    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    """Compute dtype. "auto": float32 on the CPU, the checkpoint's dtype on a GPU."""

    kv_bits: Literal[4, 8] | None = None
    """4 or 8 to keep the KV cache quantized (smaller, slightly less exact)."""

    max_tokens: int = 256
    """The most tokens to generate per call."""

    temperature: float = 0.0
    """Sampling temperature; 0 is greedy (deterministic)."""

    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability adds up to ``top_p``."""

    top_k: int = 0
    """Sample among the ``top_k`` most likely tokens only; 0 turns it off."""

    min_p: float = 0.0
    """Drop tokens less likely than ``min_p`` times the most likely one; 0 turns it off."""

    repetition_penalty: float | None = None
    """Penalty (> 1 discourages) for tokens seen in the last 20 tokens; None turns it off."""

    stop: list[str] | None = None
    """Stop strings: the text ends before the first one that appears. A call's ``stop`` is added
    to these (both apply)."""

    seed: int | None = None
    """Seed of the sampler, for reproducible sampling (``temperature > 0``)."""

    streaming: bool = False
    """If True, ``invoke`` generates through the streaming path, so callbacks see every token."""

    given_engine: StarCoderEngine | None = Field(default=None, alias="engine", exclude=True, repr=False)
    """An already loaded :class:`StarCoderEngine` to use instead of loading ``model``
    (pass it as ``engine=``)."""

    @field_validator("model", mode="before")
    @classmethod
    def _model_path_to_str(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_to_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check_settings(self) -> Self:
        # Refuse bad settings at construction, before anything is loaded.
        GenerationParams.create(**self._default_generation(), stop=self.stop or ())
        engine = self.given_engine
        if engine is not None:
            if "model" not in self.model_fields_set:
                self.model = engine.name
            elif not _same_checkpoint(self.model, engine):
                msg = (
                    f"model={self.model!r} names another checkpoint than the engine given "
                    f"({engine.name}); pass only engine=, or a matching model=."
                )
                raise ValueError(msg)
            if "kv_bits" not in self.model_fields_set:
                self.kv_bits = engine.kv_bits
        return self

    # --- the engine --------------------------------------------------------------------------

    @property
    def engine(self) -> StarCoderEngine:
        """The engine that runs this model: the one given, or the shared one for these settings
        (loaded on first use; wrappers with the same model and load settings share it)."""
        return self._engine_for(None)

    def _engine_for(self, model: str | None) -> StarCoderEngine:
        if self.given_engine is not None and (model is None or model == self.model):
            return self.given_engine
        return get_engine(model or self.model, **self._load_settings())

    async def _aengine_for(self, model: str | None) -> StarCoderEngine:
        """:meth:`_engine_for` for async code: a first load runs in a thread, off the event loop."""
        if self.given_engine is not None and model in (None, self.model):
            return self.given_engine
        loaded = peek_engine(model or self.model, **self._load_settings())
        return loaded or await asyncio.to_thread(self._engine_for, model)

    def _load_settings(self) -> dict[str, Any]:
        return {"quantize": self.quantize, "dtype": self.dtype, "kv_bits": self.kv_bits}

    # --- settings ------------------------------------------------------------------------------

    def _default_generation(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in GENERATION_KEYS}

    def _call_settings(self, stop: Sequence[str] | None, kwargs: Mapping[str, Any]) -> tuple[str, dict]:
        """The model and the engine keywords for one call: fields, overridden by the call's kwargs."""
        unknown = sorted(set(kwargs) - _CALL_KEYS)
        if unknown:
            msg = (
                f"Unknown argument(s) {unknown} for {type(self).__name__}; a call accepts "
                f"stop and {sorted(_CALL_KEYS)}."
            )
            raise InvalidParameterError(msg)
        params = self._default_generation()
        params.update((k, v) for k, v in kwargs.items() if k in GENERATION_KEYS)
        params["stop"] = merge_stops(self.stop, stop)
        return kwargs.get("model") or self.model, params

    @property
    def _identifying_params(self) -> dict[str, Any]:
        """The model and every setting that changes the output (LangChain's cache key uses it)."""
        return {
            "model": self.model,
            "quantize": self.quantize,
            "dtype": self.dtype,
            "kv_bits": self.kv_bits,
            **self._default_generation(),
            # Not "stop": LangChain puts a call's stop under that key, next to these.
            "default_stop": self.stop,
        }

    def _ls_params(self, model_type: str, stop: Sequence[str] | None, kwargs: Mapping[str, Any]) -> dict:
        params: dict[str, Any] = {
            "ls_provider": "mlx",
            "ls_model_name": kwargs.get("model") or self.model,
            "ls_model_type": model_type,
            "ls_temperature": kwargs.get("temperature", self.temperature),
            "ls_max_tokens": kwargs.get("max_tokens", self.max_tokens),
        }
        stops = merge_stops(self.stop, stop)
        if stops:
            params["ls_stop"] = stops
        return params

    # --- tokens --------------------------------------------------------------------------------

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` from the model's own tokenizer (control tokens in it are parsed,
        as in a prompt). A FIM prompt from ``FIMPromptTemplate`` gives its exact FIM ids."""
        if getattr(self, "custom_get_token_ids", None) is not None:
            return self.custom_get_token_ids(text)  # type: ignore[attr-defined]
        if isinstance(text, FIMText):
            return list(_fim_prompt(self.engine, text.fim, self.max_tokens).token_ids)
        return self.engine.encode(text)


def _same_checkpoint(model: str, engine: StarCoderEngine) -> bool:
    path = Path(model).expanduser()
    if path.exists():
        return path.resolve() == Path(engine.path).resolve()
    return model == engine.name


def generation_info(completion: Completion | CompletionChunk) -> dict[str, Any]:
    """Why the generation ended and its token counts, as LangChain's ``generation_info``."""
    return {
        "finish_reason": completion.finish_reason,
        "prompt_tokens": completion.prompt_tokens,
        "cached_tokens": completion.cached_tokens,
        "completion_tokens": completion.completion_tokens,
        "stop_sequence": completion.stop_sequence,
    }


def _as_chunk(chunk: CompletionChunk) -> GenerationChunk:
    info = generation_info(chunk) if chunk.finish_reason is not None else None
    return GenerationChunk(text=chunk.text, generation_info=info)


def _token_usage(completions: Sequence[Completion]) -> dict[str, int]:
    prompt = sum(c.prompt_tokens for c in completions)
    completion = sum(c.completion_tokens for c in completions)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "cached_tokens": sum(c.cached_tokens for c in completions),
    }


MODEL_CONFIG = ConfigDict(
    extra="forbid", arbitrary_types_allowed=True, protected_namespaces=(), use_attribute_docstrings=True
)


class StarCoderLLM(StarCoderBase, BaseLLM):
    """StarCoder2 code completion, run locally on Apple MLX.

    Weights load on first use (not on construction) through a shared registry, so several
    chains over one checkpoint hold one copy. Prompts are raw text: control tokens written in
    them (``<fim_prefix>``...) are parsed. For fill-in-the-middle with user text kept as data,
    use :meth:`infill` or ``FIMPromptTemplate() | llm``.

    Setup:
        .. code-block:: bash

            pip install langchain-starcoder

    Key init args — completion params:
        max_tokens: int
            The most tokens to generate (default 256).
        temperature: float
            0 (default) is greedy; higher samples more freely.
        top_p: float, top_k: int, min_p: float, repetition_penalty: float | None
            Sampling filters and a repetition penalty.
        stop: list[str] | None
            Stop strings. A call's ``stop`` is merged with these: the text ends at the first
            stop string of either list.
        seed: int | None
            Makes sampling reproducible.

    Key init args — client params:
        model: str
            Hub id or local folder (default ``mlx-community/starcoder2-3b-4bit``).
        quantize: 4 | 8 | None
            Quantize a full-precision checkpoint while loading.
        dtype: str
            "auto", "float32", "float16" or "bfloat16".
        kv_bits: 4 | 8 | None
            Quantize the KV cache.
        engine: StarCoderEngine | None
            An already loaded engine to use.

    Instantiate:
        .. code-block:: python

            from langchain_starcoder import StarCoderLLM

            llm = StarCoderLLM(model="mlx-community/starcoder2-3b-4bit", max_tokens=64, stop=["\\n\\n"])

    Invoke:
        .. code-block:: python

            llm.invoke("def fibonacci(n):")

    Stream:
        .. code-block:: python

            for chunk in llm.stream("def quicksort(items):"):
                print(chunk, end="", flush=True)

    Batch:
        .. code-block:: python

            llm.batch(["def add(a, b):", "class Stack:"])  # one batched generation

    Async:
        .. code-block:: python

            await llm.ainvoke("def add(a, b):")
            async for chunk in llm.astream("class Stack:"):
                print(chunk, end="")
            await llm.abatch(["def add(a, b):", "class Stack:"])

    Fill in the middle:
        .. code-block:: python

            middle = llm.infill("def area(r):\\n    return ", "\\n\\nprint(area(2))")

    Token counts:
        .. code-block:: python

            llm.get_num_tokens("def add(a, b):")  # with the model's own tokenizer

    Each generation's ``generation_info`` holds ``finish_reason`` ("stop" or "length"),
    ``prompt_tokens``, ``cached_tokens`` (reused from the KV prompt cache), ``completion_tokens``
    and ``stop_sequence``.
    """

    # Set here too: LangChain's base classes would otherwise turn extra="forbid" back to "ignore".
    model_config = MODEL_CONFIG

    @classmethod
    def is_lc_serializable(cls) -> bool:
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        return ["langchain_starcoder", "llms"]

    @property
    def _llm_type(self) -> str:
        return "starcoder-mlx"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return LangSmithParams(**self._ls_params("llm", stop, kwargs))

    def _convert_input(self, model_input: LanguageModelInput) -> PromptValue:
        # A FIM prompt handed over as text (``FIMPromptTemplate().format(...)``) stays a FIM prompt.
        if isinstance(model_input, FIMText):
            return FIMPromptValue.from_request(model_input.fim)
        return super()._convert_input(model_input)

    # --- generation ------------------------------------------------------------------------------

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        model, params = self._call_settings(stop, kwargs)
        engine = self._engine_for(model)
        if self.streaming and len(prompts) == 1:
            chunks = list(self._stream(prompts[0], stop=stop, run_manager=run_manager, **kwargs))
            return self._result([_join_chunks(chunks)], model)
        plain, fim = _split(prompts)
        done: dict[int, Completion] = {}
        if fim:
            done.update(zip(fim, _infill_many(engine, list(fim.values()), params), strict=True))
        if plain:
            done.update(zip(plain, _generate_many(engine, list(plain.values()), params), strict=True))
        return self._result([done[i] for i in range(len(prompts))], model)

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        model, params = self._call_settings(stop, kwargs)
        engine = await self._aengine_for(model)
        if self.streaming and len(prompts) == 1:
            chunks = [
                c async for c in self._astream(prompts[0], stop=stop, run_manager=run_manager, **kwargs)
            ]
            return self._result([_join_chunks(chunks)], model)
        plain, fim = _split(prompts)
        jobs = []
        if fim:
            jobs.append(_ainfill_many(engine, list(fim.values()), params))
        if plain:
            jobs.append(_agenerate_many(engine, list(plain.values()), params))
        results = await asyncio.gather(*jobs)
        done = dict(zip([*fim, *plain], [c for group in results for c in group], strict=True))
        return self._result([done[i] for i in range(len(prompts))], model)

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        model, params = self._call_settings(stop, kwargs)
        engine = self._engine_for(model)
        if isinstance(prompt, FIMText):
            chunks = engine.stream_infill(**prompt.fim.infill_kwargs(), **params)
        else:
            chunks = engine.stream(str(prompt), **params)
        # Leaving the loop early closes the engine's stream, which cancels the request.
        with contextlib.closing(chunks):
            for piece in chunks:
                chunk = _as_chunk(piece)
                if run_manager is not None:
                    run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk

    async def _astream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[GenerationChunk]:
        model, params = self._call_settings(stop, kwargs)
        engine = await self._aengine_for(model)
        if isinstance(prompt, FIMText):
            chunks = engine.astream_infill(**prompt.fim.infill_kwargs(), **params)
        else:
            chunks = engine.astream(str(prompt), **params)
        async with contextlib.aclosing(chunks):
            async for piece in chunks:
                chunk = _as_chunk(piece)
                if run_manager is not None:
                    await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk

    def _result(self, completions: Sequence[Completion], model: str) -> LLMResult:
        return LLMResult(
            generations=[[Generation(text=c.text, generation_info=generation_info(c))] for c in completions],
            llm_output={"token_usage": _token_usage(completions), "model_name": model},
        )

    # --- fill in the middle ------------------------------------------------------------------------

    def infill(
        self,
        prefix: str,
        suffix: str = "",
        *,
        context_files: Sequence[Any] = (),
        repo_name: str | None = None,
        file_path: str | None = None,
        mode: str = "psm",
        max_prompt_tokens: int | None = None,
        trim_suffix_overlap: bool = True,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> str:
        """The code that fits between ``prefix`` and ``suffix`` (the middle only).

        The prefix, suffix, context files (``ContextFile``, ``(path, text)`` pairs or LangChain
        ``Document``s) and names are data: control-token strings in them stay plain text. It runs
        through :meth:`invoke`, so callbacks, tracing and the LLM cache apply; ``stop`` and the
        generation settings (``max_tokens``...) are keyword arguments as for ``invoke``.
        """
        value = _fim_value(
            prefix, suffix, context_files, repo_name, file_path, mode, max_prompt_tokens, trim_suffix_overlap
        )
        return self.invoke(value, config=config, **kwargs)

    async def ainfill(
        self,
        prefix: str,
        suffix: str = "",
        *,
        context_files: Sequence[Any] = (),
        repo_name: str | None = None,
        file_path: str | None = None,
        mode: str = "psm",
        max_prompt_tokens: int | None = None,
        trim_suffix_overlap: bool = True,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> str:
        """Async :meth:`infill` (through the engine's async API; the event loop stays free)."""
        value = _fim_value(
            prefix, suffix, context_files, repo_name, file_path, mode, max_prompt_tokens, trim_suffix_overlap
        )
        return await self.ainvoke(value, config=config, **kwargs)

    def stream_infill(
        self,
        prefix: str,
        suffix: str = "",
        *,
        context_files: Sequence[Any] = (),
        repo_name: str | None = None,
        file_path: str | None = None,
        mode: str = "psm",
        max_prompt_tokens: int | None = None,
        trim_suffix_overlap: bool = True,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> Iterator[str]:
        """:meth:`infill`, yielding the middle in pieces as it is generated."""
        value = _fim_value(
            prefix, suffix, context_files, repo_name, file_path, mode, max_prompt_tokens, trim_suffix_overlap
        )
        return self.stream(value, config=config, **kwargs)

    def astream_infill(
        self,
        prefix: str,
        suffix: str = "",
        *,
        context_files: Sequence[Any] = (),
        repo_name: str | None = None,
        file_path: str | None = None,
        mode: str = "psm",
        max_prompt_tokens: int | None = None,
        trim_suffix_overlap: bool = True,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[str]:
        """Async :meth:`stream_infill`."""
        value = _fim_value(
            prefix, suffix, context_files, repo_name, file_path, mode, max_prompt_tokens, trim_suffix_overlap
        )
        return self.astream(value, config=config, **kwargs)


def _fim_value(
    prefix: str,
    suffix: str,
    context_files: Sequence[Any],
    repo_name: str | None,
    file_path: str | None,
    mode: str,
    max_prompt_tokens: int | None,
    trim_suffix_overlap: bool,
) -> FIMPromptValue:
    request = FIMRequest(
        prefix=prefix,
        suffix=suffix,
        context_files=to_context_files(context_files),
        repo_name=repo_name,
        file_path=file_path,
        mode=mode,
        max_prompt_tokens=max_prompt_tokens,
        trim_suffix_overlap=trim_suffix_overlap,
    )
    return FIMPromptValue.from_request(request)


def _split(prompts: Sequence[str]) -> tuple[dict[int, str], dict[int, FIMRequest]]:
    """The raw prompts and the FIM requests, by their index in ``prompts``."""
    plain = {i: str(p) for i, p in enumerate(prompts) if not isinstance(p, FIMText)}
    fim = {i: p.fim for i, p in enumerate(prompts) if isinstance(p, FIMText)}
    return plain, fim


def _generate_many(engine: StarCoderEngine, prompts: list[str], params: dict) -> list[Completion]:
    if len(prompts) == 1:
        return [engine.generate(prompts[0], **params)]
    return engine.generate_batch(prompts, **params)


async def _agenerate_many(engine: StarCoderEngine, prompts: list[str], params: dict) -> list[Completion]:
    if len(prompts) == 1:
        return [await engine.agenerate(prompts[0], **params)]
    return await engine.agenerate_batch(prompts, **params)


def _fim_prompt(engine: StarCoderEngine, request: FIMRequest, max_tokens: int) -> FIMPrompt:
    """The FIM prompt ``engine.infill`` builds for ``request`` (same budget rule)."""
    budget = request.max_prompt_tokens
    if budget is not None and budget + max_tokens > engine.context_window:
        msg = (
            f"max_prompt_tokens={budget} plus max_tokens={max_tokens} exceeds the model's "
            f"context window of {engine.context_window}. Lower one of them."
        )
        raise ContextLengthError(msg)
    kwargs = {**request.prompt_kwargs(), "max_prompt_tokens": budget or engine.context_window - max_tokens}
    return build_fim_prompt(engine, **kwargs)


def _fim_batch(
    engine: StarCoderEngine, requests: Sequence[FIMRequest], params: dict
) -> tuple[list[list[int]], dict[str, Any]]:
    """The prompt ids and settings that run several infills as one batch, as ``engine.infill``
    builds them one at a time (same budget, FIM stop tokens)."""
    max_tokens = GenerationParams.create(**params).max_tokens
    prompts = [_fim_prompt(engine, request, max_tokens) for request in requests]
    stop_ids = {i for p in prompts for i in p.stop_token_ids}
    return [p.token_ids for p in prompts], {**params, "stop_token_ids": sorted(stop_ids)}


def _trimmed(completion: Completion, request: FIMRequest) -> Completion:
    if not request.trim_suffix_overlap:
        return completion
    return dataclasses.replace(completion, text=trim_suffix_overlap(completion.text, request.suffix))


def _infill_many(engine: StarCoderEngine, requests: list[FIMRequest], params: dict) -> list[Completion]:
    if len(requests) == 1:
        return [engine.infill(**requests[0].infill_kwargs(), **params)]
    ids, settings = _fim_batch(engine, requests, params)
    return [_trimmed(c, r) for c, r in zip(engine.generate_batch(ids, **settings), requests, strict=True)]


async def _ainfill_many(
    engine: StarCoderEngine, requests: list[FIMRequest], params: dict
) -> list[Completion]:
    if len(requests) == 1:
        return [await engine.ainfill(**requests[0].infill_kwargs(), **params)]
    ids, settings = _fim_batch(engine, requests, params)
    completions = await engine.agenerate_batch(ids, **settings)
    return [_trimmed(c, r) for c, r in zip(completions, requests, strict=True)]


def _join_chunks(chunks: Sequence[GenerationChunk]) -> Completion:
    """The completion that a streamed generation's chunks add up to."""
    info = next((c.generation_info for c in reversed(chunks) if c.generation_info), None) or {}
    return Completion(
        text="".join(c.text for c in chunks),
        token_ids=[],
        finish_reason=info.get("finish_reason", "stop"),
        prompt_tokens=info.get("prompt_tokens", 0),
        cached_tokens=info.get("cached_tokens", 0),
        completion_tokens=info.get("completion_tokens", 0),
        stop_sequence=info.get("stop_sequence"),
    )
