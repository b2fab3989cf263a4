"""LangChain ``StarCoderLLM``: a StarCoder2 completion model running in-process on MLX."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseLLM, LanguageModelInput
from langchain_core.outputs import Generation, GenerationChunk, LLMResult
from langchain_core.prompt_values import PromptValue
from langchain_core.runnables import RunnableConfig

from ._base import MODEL_CONFIG, RUN_ARGS, StarCoderSettings
from .engine import StarCoderEngine
from .fim.request import FIMRequest
from .prompts import FIMText, TemplateText, carried, fim_value
from .types import Completion, CompletionChunk, counts, join_chunks, usage

# LangChain's LLM cache keys an answer by the prompt's text and ``_identifying_params`` only: a
# call's own settings (``invoke(p, max_tokens=5)``) and what a carried prompt holds beyond its text
# (FIM budget and trim, which parts are data) would not count. ``generate`` puts them here for
# ``_identifying_params`` to add, so they are part of the key.
_CALL_KEY: ContextVar[str | None] = ContextVar("starcoder_call_key", default=None)


def _call_key(prompts: Sequence[str], kwargs: dict[str, Any]) -> str | None:
    parts = [f"{k}={kwargs[k]!r}" for k in sorted(kwargs) if k not in RUN_ARGS]
    parts += sorted({c.cache_key() for c in map(carried, prompts) if c is not None})
    return ";".join(parts) or None


class StarCoderLLM(StarCoderSettings, BaseLLM):
    """StarCoder2 code completion, run locally on Apple MLX.

    Weights load on first use (not on construction) through a shared registry, so several
    chains over one checkpoint hold one copy. A raw prompt string is parsed as hand-written:
    control tokens written in it (``<fim_prefix>``...) are control tokens. For text you did not
    write, use ``StarCoderPromptTemplate`` (its variables are data), ``parse_special_tokens=False``
    (the whole prompt is data), and for fill-in-the-middle :meth:`infill` or
    ``FIMPromptTemplate() | llm``.

    Setup:
        .. code-block:: bash

            pip install -e .  # in a checkout of this repository: the package is not on PyPI yet

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
        prompt_lookup_num_tokens: int | None
            Prompt-lookup speculative decoding (greedy): drafts copied from the prompt, verified in
            one pass, the same output. None: where it pays; 0: off. ``generation_info`` reports
            ``accepted_draft_tokens`` and ``draft_tokens``.
        streaming: bool
            If True, ``invoke`` and ``generate`` go through the streaming path, so callback
            handlers see every token (``on_llm_new_token``) while the answer is produced.
        parse_special_tokens: bool
            False encodes every prompt as data (control-token strings stay text).
        json_schema: dict | str | type[BaseModel] | None, regex: str | None, grammar: str | None
            Constrained decoding (one at most): every answer is JSON valid against the schema, a
            full match of the regex, or a sentence of the grammar (Lark or GBNF). Also per call
            (``llm.invoke(p, json_schema=...)``), and for FIM middles.

    Key init args — client params:
        model: str
            Hub id or local folder (default ``mlx-community/starcoder2-3b-4bit``).
        quantize: 4 | 8 | None
            Quantize a full-precision checkpoint while loading.
        dtype: str
            "auto", "float32", "float16" or "bfloat16".
        kv_bits: 4 | 8 | None
            Quantize the KV cache.
        prompt_cache_dir: str | None
            A folder that keeps long prompt caches across restarts (docs/prompt-cache.md).
        adapter_path: str | None
            A fine-tuning adapter's folder (``langchain-starcoder finetune``'s), applied on load.
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

    Structured output:
        .. code-block:: python

            point = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
            llm.invoke("# a point as JSON\n", json_schema=point)  # '{"x": 3}'
            llm.infill("total = ", "\nprint(total)", regex=r"[0-9]+")

    Streams yield text only (never an empty piece); the counts arrive with the callbacks' last
    chunk. Each generation's ``generation_info`` holds ``finish_reason`` ("stop" or "length"),
    ``prompt_tokens``, ``cached_tokens`` (reused from the KV prompt cache), ``completion_tokens``,
    ``stop_sequence`` and ``constrained``. Under a constraint "stop" means the answer matches it in
    full, and "length" that it was cut first (incomplete, not valid).
    """

    # Set here too: LangChain's base classes would otherwise turn extra="forbid" back to "ignore".
    model_config = MODEL_CONFIG

    @property
    def _llm_type(self) -> str:
        return "starcoder-mlx"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        """The model and every setting that changes the output (LangChain's cache key uses it)."""
        settings = self._identifying_settings()
        if (call := _CALL_KEY.get()) is not None:
            settings["call"] = call
        return settings

    def generate(self, prompts: list[str], *args: Any, **kwargs: Any) -> LLMResult:
        token = _CALL_KEY.set(_call_key(prompts, kwargs))
        try:
            return super().generate(prompts, *args, **kwargs)
        finally:
            _CALL_KEY.reset(token)

    async def agenerate(self, prompts: list[str], *args: Any, **kwargs: Any) -> LLMResult:
        token = _CALL_KEY.set(_call_key(prompts, kwargs))
        try:
            return await super().agenerate(prompts, *args, **kwargs)
        finally:
            _CALL_KEY.reset(token)

    def _convert_input(self, model_input: LanguageModelInput) -> PromptValue:
        # A prompt handed over as text (``FIMPromptTemplate().format(...)``) keeps its parts.
        prompt = carried(model_input) if isinstance(model_input, str) else None
        if prompt is not None:
            return prompt.prompt_value()
        return super()._convert_input(model_input)

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` from the model's own tokenizer, as a prompt is encoded (control
        tokens parsed unless ``parse_special_tokens=False``). A prompt from ``FIMPromptTemplate``
        or ``StarCoderPromptTemplate`` gives its exact ids."""
        if self.custom_get_token_ids is not None:
            return self.custom_get_token_ids(text)
        engine, prompt = self.engine, carried(text)
        if isinstance(prompt, FIMText):
            return list(engine.fim_prompt(prompt.fim, self.max_tokens).token_ids)
        if prompt is not None:
            return prompt.token_ids(engine, check_size=False)  # a count, at any length
        return engine.encode(str(text), special_tokens=self.parse_special_tokens)

    # --- generation ------------------------------------------------------------------------------

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        model, settings = self._call(stop, kwargs)
        if self.streaming and len(prompts) == 1:
            chunks = self._stream(prompts[0], stop=stop, run_manager=run_manager, **kwargs)
            return self._result([_join(chunks)], model)
        engine = self._engine_for(model)
        return self._result(engine.generate_batch(_engine_prompts(engine, prompts), **settings), model)

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        model, settings = self._call(stop, kwargs)
        if self.streaming and len(prompts) == 1:
            chunks = self._astream(prompts[0], stop=stop, run_manager=run_manager, **kwargs)
            return self._result([_join([c async for c in chunks])], model)
        engine = await self._aengine_for(model)
        ready = await asyncio.to_thread(_engine_prompts, engine, prompts)
        return self._result(await engine.agenerate_batch(ready, **settings), model)

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        model, settings = self._call(stop, kwargs)
        engine = self._engine_for(model)
        chunks = engine.stream(_engine_prompt(engine, prompt), **settings)
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
        model, settings = self._call(stop, kwargs)
        engine = await self._aengine_for(model)
        if isinstance(carried(prompt), TemplateText):  # its ids: in a thread
            chunks = engine.astream(await asyncio.to_thread(_engine_prompt, engine, prompt), **settings)
        else:
            chunks = engine.astream(_engine_prompt(engine, prompt), **settings)
        async with contextlib.aclosing(chunks):
            async for piece in chunks:
                chunk = _as_chunk(piece)
                if run_manager is not None:
                    await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk

    def stream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[str]:
        # The last chunk carries the counts for the callbacks; its text may be empty (an
        # end-of-text token has none), and an empty piece is no news to a reader.
        return (text for text in super().stream(input, config, stop=stop, **kwargs) if text)

    async def astream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[str]:
        async for text in super().astream(input, config, stop=stop, **kwargs):
            if text:
                yield text

    def _result(self, completions: Sequence[Completion], model: str) -> LLMResult:
        return LLMResult(
            generations=[[Generation(text=c.text, generation_info=counts(c))] for c in completions],
            llm_output={"token_usage": usage(completions), "model_name": model},
        )

    # --- fill in the middle ------------------------------------------------------------------------

    def infill(
        self,
        prefix: str | FIMRequest,
        suffix: str = "",
        *,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> str:
        """The code that fits between ``prefix`` and ``suffix`` (the middle only).

        Takes a :class:`~langchain_starcoder.fim.request.FIMRequest` or its fields (``context_files``
        may also hold ``(path, text)`` pairs or LangChain ``Document``s, ``repo_name``,
        ``file_path``, ``mode``, ``max_prompt_tokens``, ``trim_suffix_overlap``, ``end``: "auto"
        by default, decoding stops where the code says the middle is complete). The prefix,
        suffix, files and names are data: control-token strings in them stay plain text. It runs
        through :meth:`invoke`, so callbacks, tracing and the LLM cache apply; ``stop`` and the
        generation settings (``max_tokens``...) are keyword arguments as for ``invoke``.
        """
        value, kwargs = fim_value(prefix, suffix, kwargs)
        return self.invoke(value, config=config, **kwargs)

    async def ainfill(
        self,
        prefix: str | FIMRequest,
        suffix: str = "",
        *,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> str:
        """Async :meth:`infill` (through the engine's async API; the event loop stays free)."""
        value, kwargs = fim_value(prefix, suffix, kwargs)
        return await self.ainvoke(value, config=config, **kwargs)

    def stream_infill(
        self,
        prefix: str | FIMRequest,
        suffix: str = "",
        *,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> Iterator[str]:
        """:meth:`infill`, yielding the middle in pieces as it is generated."""
        value, kwargs = fim_value(prefix, suffix, kwargs)
        return self.stream(value, config=config, **kwargs)

    def astream_infill(
        self,
        prefix: str | FIMRequest,
        suffix: str = "",
        *,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[str]:
        """Async :meth:`stream_infill`."""
        value, kwargs = fim_value(prefix, suffix, kwargs)
        return self.astream(value, config=config, **kwargs)


def _engine_prompt(engine: StarCoderEngine, prompt: str) -> Any:
    """What the engine is given for a LangChain prompt: a FIM prompt's request, a template
    prompt's exact ids, else the text."""
    found = carried(prompt)
    if isinstance(found, FIMText):
        return found.fim
    if found is not None:
        return found.token_ids(engine)
    return str(prompt)


def _engine_prompts(engine: StarCoderEngine, prompts: Sequence[str]) -> list[Any]:
    return [_engine_prompt(engine, p) for p in prompts]


def _as_chunk(chunk: CompletionChunk) -> GenerationChunk:
    info = counts(chunk) if chunk.finish_reason is not None else None
    return GenerationChunk(text=chunk.text, generation_info=info)


def _join(chunks: Iterator[GenerationChunk] | list[GenerationChunk]) -> Completion:
    """The completion that a LangChain stream's chunks add up to."""
    return join_chunks(CompletionChunk(c.text, [], **(c.generation_info or {})) for c in chunks)
