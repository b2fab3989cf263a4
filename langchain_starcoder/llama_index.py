"""LlamaIndex integration: ``StarCoder``, a LlamaIndex LLM over the shared StarCoder2 engine."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from llama_index.core.base.llms.generic_utils import messages_to_prompt as generic_messages_to_prompt
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import ConfigDict, Field, field_validator
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.llm import LLM

from . import registry
from .chat import chat_prompt_ids, resolve_chat_template
from .engine import Completion, CompletionChunk, GenerationParams, StarCoderEngine
from .errors import InvalidParameterError, UnsupportedModelError
from .fim import ContextFile
from .loading import validate_load_options
from .registry import DEFAULT_MODEL

dispatcher = get_dispatcher(__name__)


# Generation settings a call may override with keyword arguments.
_GENERATION_KEYS = (
    "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "stop", "seed",
)  # fmt: skip


class StarCoder(LLM):
    """StarCoder2 code models on Apple MLX, as a LlamaIndex LLM.

    Setup:
        .. code-block:: bash

            pip install langchain-starcoder

    Key init args — loading:
        model: str
            Hub id (default ``mlx-community/starcoder2-3b-4bit``) or a local checkpoint folder.
        quantize: int | None
            4 or 8 to quantize a full-precision checkpoint while loading.
        dtype: str
            "auto" (float32 on the CPU, the checkpoint's dtype on a GPU), "float32", "float16",
            "bfloat16".
        kv_bits: int | None
            4 or 8 to keep the KV cache quantized.
        engine: StarCoderEngine | None
            An engine you loaded yourself; by default the shared engine for these settings is
            loaded on first use (never on construction).

    Key init args — generation:
        max_tokens: int
            Most tokens to generate (default 256).
        temperature: float
            0 (the default) is greedy.
        stop: list[str] | None
            Strings that end the generation (not included in the text).
        top_p, top_k, min_p, repetition_penalty, seed:
            Sampling settings, as in :meth:`StarCoderEngine.generate`.

    Key init args — chat:
        chat_template: str | None
            A Jinja chat template instead of the checkpoint's. Without one (a base model), chat
            raises an error naming it; ``messages_to_prompt=`` (LlamaIndex's own hook) is used
            when given.

    Instantiate:
        .. code-block:: python

            from langchain_starcoder.llama_index import StarCoder

            llm = StarCoder(model="mlx-community/starcoder2-3b-4bit", max_tokens=64, stop=["\\ndef "])

    Invoke:
        .. code-block:: python

            response = llm.complete("def fibonacci(n):")
            print(response.text, response.additional_kwargs["completion_tokens"])

    Stream:
        .. code-block:: python

            for response in llm.stream_complete("def quicksort(items):"):
                print(response.delta, end="", flush=True)

    Async:
        .. code-block:: python

            response = await llm.acomplete("def add(a, b):")
            async for response in await llm.astream_complete("class Stack:"):
                print(response.delta, end="")

    Fill in the middle:
        .. code-block:: python

            from langchain_starcoder.fim import ContextFile

            response = llm.infill(
                "def area(r):\\n    return ",
                "\\n\\nprint(area(2))\\n",
                context_files=[ContextFile("geometry/consts.py", "PI = 3.14159\\n")],
                repo_name="geometry",
                file_path="geometry/area.py",
            )
            print(response.text)  # the middle only

            for response in llm.stream_infill("def mean(xs):\\n    ", "\\n"):
                print(response.delta, end="")

    Chat (instruct checkpoints with a chat template):
        .. code-block:: python

            from llama_index.core.llms import ChatMessage

            llm = StarCoder(model="path/to/starcoder2-15b-instruct")
            print(llm.chat([ChatMessage(role="user", content="Write a bubble sort.")]).message.content)

    In a query engine:
        .. code-block:: python

            from llama_index.retrievers.bm25 import BM25Retriever
            from llama_index.core.query_engine import RetrieverQueryEngine

            engine = RetrieverQueryEngine.from_args(
                BM25Retriever.from_defaults(nodes=nodes), llm=llm, streaming=True
            )
            engine.query("How is the cache trimmed?").print_response_stream()

    Responses carry ``prompt_tokens``, ``cached_tokens``, ``completion_tokens``,
    ``finish_reason`` and ``stop_sequence`` in ``additional_kwargs``, and the same plus the
    generated token ids, timings and an OpenAI-style ``usage`` dict in ``raw`` (LlamaIndex's
    ``TokenCountingHandler`` reads the real counts from it). Streamed responses carry them on the
    last response. Async methods never block the event loop: generation runs on the engine's
    worker thread.
    """

    # A misspelt setting (``max_token=``) is an error rather than silently ignored.
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    model: str = Field(default=DEFAULT_MODEL, description="Hub id or local checkpoint folder.")
    """Hub id or local checkpoint folder."""
    quantize: int | None = Field(default=None, description="4 or 8: quantize on load.")
    """4 or 8: quantize a full-precision checkpoint while loading."""
    dtype: str = Field(default="auto", description="Compute dtype.")
    """Compute dtype: "auto", "float32", "float16" or "bfloat16"."""
    kv_bits: int | None = Field(default=None, description="4 or 8: quantize the KV cache.")
    """4 or 8: keep the KV cache quantized."""
    max_tokens: int = Field(default=256, description="Most tokens to generate.")
    """Most tokens to generate per call."""
    temperature: float = Field(default=0.0, description="Sampling temperature; 0 is greedy.")
    """Sampling temperature; 0 is greedy."""
    top_p: float = Field(default=1.0, description="Nucleus sampling mass (1 turns it off).")
    """Nucleus sampling mass in (0, 1]; 1 turns it off."""
    top_k: int = Field(default=0, description="Keep the k most likely tokens (0 turns it off).")
    """Sample among the k most likely tokens; 0 turns it off."""
    min_p: float = Field(default=0.0, description="Minimum probability relative to the top token.")
    """Drop tokens less likely than ``min_p`` times the top token; 0 turns it off."""
    repetition_penalty: float | None = Field(default=None, description="Penalty for repeated tokens.")
    """Penalty (> 0, usually 1.1-1.3) for tokens seen in the last 20; None turns it off."""
    stop: list[str] | None = Field(default=None, description="Strings that end the generation.")
    """Strings that end the generation; the text ends before the first one. Per-call ``stop``
    strings are added to these."""
    seed: int | None = Field(default=None, description="Seed that makes sampling reproducible.")
    """Seed that makes sampling reproducible."""
    chat_template: str | None = Field(default=None, description="Jinja chat template override.")
    """A Jinja chat template to use instead of the checkpoint's (for chat on a checkpoint that
    lacks one, or to change its format)."""
    engine: StarCoderEngine | None = Field(default=None, exclude=True, description="Engine to use.")
    """An engine loaded by you; None loads the shared one for these settings on first use."""

    def __init__(self, **kwargs: Any) -> None:
        engine = kwargs.get("engine")
        if engine is not None and "model" not in kwargs:
            kwargs["model"] = engine.name
        super().__init__(**kwargs)
        # Refuse bad settings now, with the engine's errors, but load nothing yet.
        validate_load_options(self.quantize, 64, self.dtype, self.kv_bits)
        self._generation_params({})

    @field_validator("model", mode="before")
    @classmethod
    def _path_to_str(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @classmethod
    def class_name(cls) -> str:
        return "StarCoder"

    # --- the engine ------------------------------------------------------------------------------

    def get_engine(self) -> StarCoderEngine:
        """The engine this LLM runs on: the one given, or the shared one (loaded on first use).

        The shared one comes from the registry on every call, so after
        ``registry.release_engines()`` the next call loads the checkpoint again.
        """
        if self.engine is not None:
            return self.engine
        return registry.get_engine(self.model, **self._load_settings())

    def _load_settings(self) -> dict[str, Any]:
        return {"quantize": self.quantize, "dtype": self.dtype, "kv_bits": self.kv_bits}

    def _loaded_engine(self) -> StarCoderEngine | None:
        """The engine for these settings if it is loaded (its config and tokenizer), else None."""
        return self.engine or registry.peek_engine(self.model, **self._load_settings())

    async def aget_engine(self) -> StarCoderEngine:
        """:meth:`get_engine` for async code: a first load runs in a thread, off the event loop.

        LlamaIndex's own async paths (``apredict``, query engines) read :attr:`metadata` first,
        which loads on the loop; ``await llm.aget_engine()`` once beforehand avoids that.
        """
        if self._loaded_engine() is not None:
            return self.get_engine()  # the registry has it: a dictionary lookup
        return await asyncio.to_thread(self.get_engine)

    def to_payload(self) -> dict[str, Any]:
        """What callbacks and instrumentation events record: the metadata and the settings.

        Unlike the default it never loads the model (an async call's events must not block the
        event loop), so before the first load the checkpoint's own fields are left out.
        """
        engine = self._loaded_engine()
        if engine is not None:
            meta = self.metadata.model_dump()
        else:
            meta = {
                "model_name": self.model,
                "num_output": self.max_tokens,
                "is_function_calling_model": False,
            }
        settings = {key: getattr(self, key) for key in _GENERATION_KEYS}
        return {
            "class_name": self.class_name(),
            **meta,
            **settings,
            "quantize": self.quantize,
            "dtype": self.dtype,
            "kv_bits": self.kv_bits,
        }

    @property
    def metadata(self) -> LLMMetadata:
        """Context window and chat support of the real checkpoint (loads it on first use)."""
        engine = self.get_engine()
        return LLMMetadata(
            context_window=engine.context_window,
            num_output=self.max_tokens,
            is_chat_model=resolve_chat_template(engine, self.chat_template) is not None,
            is_function_calling_model=False,
            model_name=engine.name,
        )

    def _generation_params(self, overrides: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(overrides) - set(_GENERATION_KEYS))
        if unknown:
            msg = f"Unknown generation arguments {unknown}; StarCoder accepts {list(_GENERATION_KEYS)}."
            raise InvalidParameterError(msg)
        params = {key: getattr(self, key) for key in _GENERATION_KEYS}
        params.update(overrides)
        extra = overrides.get("stop")
        extra = [extra] if isinstance(extra, str) else list(extra or [])
        params["stop"] = [*(self.stop or []), *extra]
        GenerationParams.create(**params)  # raises InvalidParameterError before any work
        return params

    # --- completion --------------------------------------------------------------------------------

    def _prompt(self, prompt: str, formatted: bool) -> str:
        return prompt if formatted else self.completion_to_prompt(prompt)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Complete ``prompt``; keyword arguments override the generation settings for this call."""
        params = self._generation_params(kwargs)
        completion = self.get_engine().generate(self._prompt(prompt, formatted), **params)
        return _completion_response(completion)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        """Stream a completion: each response has the text so far and the new ``delta``."""
        params = self._generation_params(kwargs)
        chunks = self.get_engine().stream(self._prompt(prompt, formatted), **params)
        return _stream_completion(chunks)

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Async :meth:`complete`; the event loop stays free while the model runs."""
        params = self._generation_params(kwargs)
        engine = await self.aget_engine()
        completion = await engine.agenerate(self._prompt(prompt, formatted), **params)
        return _completion_response(completion)

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        """Async :meth:`stream_complete`; the event loop stays free while the model runs."""
        params = self._generation_params(kwargs)
        engine = await self.aget_engine()
        chunks = engine.astream(self._prompt(prompt, formatted), **params)
        return _astream_completion(chunks)

    # --- chat ----------------------------------------------------------------------------------------

    def _chat_prompt(self, engine: StarCoderEngine, messages: Sequence[ChatMessage]) -> str | list[int]:
        """The prompt for ``messages``: the chat template's control text as tokens, contents as data."""
        if self.chat_template is None and self.messages_to_prompt is not generic_messages_to_prompt:
            return self.messages_to_prompt(messages)
        template = resolve_chat_template(engine, self.chat_template)
        if template is None:
            msg = (
                f"The checkpoint {engine.name} has no chat template, so chat messages cannot be "
                "formatted. Set chat_template=... (a Jinja chat template) or messages_to_prompt=... "
                "on StarCoder, or use an instruct checkpoint; for a base model use complete()."
            )
            raise UnsupportedModelError(msg)
        roles = [m.role.value if isinstance(m.role, MessageRole) else str(m.role) for m in messages]
        return chat_prompt_ids(
            engine, list(zip(roles, [m.content or "" for m in messages], strict=True)), template
        )

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Answer ``messages`` through the checkpoint's chat template."""
        params = self._generation_params(kwargs)
        engine = self.get_engine()
        completion = engine.generate(self._chat_prompt(engine, messages), **params)
        return _chat_response(_completion_response(completion))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        """Stream the answer to ``messages``; each response has the message so far and ``delta``."""
        params = self._generation_params(kwargs)
        engine = self.get_engine()
        chunks = engine.stream(self._chat_prompt(engine, messages), **params)
        return _stream_completion(chunks, as_chat=True)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Async :meth:`chat`; the event loop stays free while the model runs."""
        params = self._generation_params(kwargs)
        engine = await self.aget_engine()
        completion = await engine.agenerate(self._chat_prompt(engine, messages), **params)
        return _chat_response(_completion_response(completion))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        """Async :meth:`stream_chat`; the event loop stays free while the model runs."""
        params = self._generation_params(kwargs)
        engine = await self.aget_engine()
        chunks = engine.astream(self._chat_prompt(engine, messages), **params)
        return _astream_completion(chunks, as_chat=True)

    # --- fill in the middle --------------------------------------------------------------------------
    # The public methods take ``prefix`` by keyword too; the callback decorators need it positional.

    @dispatcher.span
    def infill(
        self,
        prefix: str,
        suffix: str = "",
        *,
        context_files: Sequence[ContextFile] = (),
        repo_name: str | None = None,
        file_path: str | None = None,
        mode: str = "psm",
        max_prompt_tokens: int | None = None,
        trim_suffix_overlap: bool = True,
        **kwargs: Any,
    ) -> CompletionResponse:
        """Fill the hole between ``prefix`` and ``suffix``; the response text is the middle only.

        Arguments are those of :meth:`StarCoderEngine.infill`: ``context_files`` (other files of
        the repository, as ``ContextFile(path, text)``), ``repo_name`` and ``file_path``
        (StarCoder2's repository layout), ``mode`` ("psm" or "spm"), ``max_prompt_tokens`` (the
        budget the prompt is cut to), ``trim_suffix_overlap`` (drop an end of the middle that
        repeats the suffix); keyword arguments override the generation settings. File text is
        data: a literal ``<file_sep>`` in a file cannot reshape the prompt. The response carries
        the counts as :meth:`complete`'s does; callbacks see ``prefix`` as the prompt.
        """
        fim = dict(
            context_files=context_files, repo_name=repo_name, file_path=file_path, mode=mode,
            max_prompt_tokens=max_prompt_tokens, trim_suffix_overlap=trim_suffix_overlap,
        )  # fmt: skip
        return self._infill(prefix, suffix, **fim, **kwargs)

    @llm_completion_callback()
    def _infill(self, prefix: str, suffix: str, **kwargs: Any) -> CompletionResponse:
        fim, params = self._split_infill_args(kwargs)
        completion = self.get_engine().infill(prefix, suffix, **fim, **params)
        return _completion_response(completion)

    @dispatcher.span
    def stream_infill(
        self,
        prefix: str,
        suffix: str = "",
        *,
        context_files: Sequence[ContextFile] = (),
        repo_name: str | None = None,
        file_path: str | None = None,
        mode: str = "psm",
        max_prompt_tokens: int | None = None,
        trim_suffix_overlap: bool = True,
        **kwargs: Any,
    ) -> CompletionResponseGen:
        """Stream :meth:`infill`: each response has the middle so far and the new ``delta``."""
        fim = dict(
            context_files=context_files, repo_name=repo_name, file_path=file_path, mode=mode,
            max_prompt_tokens=max_prompt_tokens, trim_suffix_overlap=trim_suffix_overlap,
        )  # fmt: skip
        return self._stream_infill(prefix, suffix, **fim, **kwargs)

    @llm_completion_callback()
    def _stream_infill(self, prefix: str, suffix: str, **kwargs: Any) -> CompletionResponseGen:
        fim, params = self._split_infill_args(kwargs)
        return _stream_completion(self.get_engine().stream_infill(prefix, suffix, **fim, **params))

    @dispatcher.span
    async def ainfill(
        self,
        prefix: str,
        suffix: str = "",
        *,
        context_files: Sequence[ContextFile] = (),
        repo_name: str | None = None,
        file_path: str | None = None,
        mode: str = "psm",
        max_prompt_tokens: int | None = None,
        trim_suffix_overlap: bool = True,
        **kwargs: Any,
    ) -> CompletionResponse:
        """Async :meth:`infill`; the event loop stays free while the model runs."""
        fim = dict(
            context_files=context_files, repo_name=repo_name, file_path=file_path, mode=mode,
            max_prompt_tokens=max_prompt_tokens, trim_suffix_overlap=trim_suffix_overlap,
        )  # fmt: skip
        return await self._ainfill(prefix, suffix, **fim, **kwargs)

    @llm_completion_callback()
    async def _ainfill(self, prefix: str, suffix: str, **kwargs: Any) -> CompletionResponse:
        fim, params = self._split_infill_args(kwargs)
        engine = await self.aget_engine()
        completion = await engine.ainfill(prefix, suffix, **fim, **params)
        return _completion_response(completion)

    @dispatcher.span
    async def astream_infill(
        self,
        prefix: str,
        suffix: str = "",
        *,
        context_files: Sequence[ContextFile] = (),
        repo_name: str | None = None,
        file_path: str | None = None,
        mode: str = "psm",
        max_prompt_tokens: int | None = None,
        trim_suffix_overlap: bool = True,
        **kwargs: Any,
    ) -> CompletionResponseAsyncGen:
        """Async :meth:`stream_infill` (``async for r in await llm.astream_infill(...)``)."""
        fim = dict(
            context_files=context_files, repo_name=repo_name, file_path=file_path, mode=mode,
            max_prompt_tokens=max_prompt_tokens, trim_suffix_overlap=trim_suffix_overlap,
        )  # fmt: skip
        return await self._astream_infill(prefix, suffix, **fim, **kwargs)

    @llm_completion_callback()
    async def _astream_infill(self, prefix: str, suffix: str, **kwargs: Any) -> CompletionResponseAsyncGen:
        fim, params = self._split_infill_args(kwargs)
        engine = await self.aget_engine()
        chunks = engine.astream_infill(prefix, suffix, **fim, **params)
        return _astream_completion(chunks)

    def _split_infill_args(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        fim_keys = (
            "context_files", "repo_name", "file_path", "mode", "max_prompt_tokens", "trim_suffix_overlap",
        )  # fmt: skip
        fim = {k: kwargs.pop(k) for k in fim_keys}
        return fim, self._generation_params(kwargs)


# --- engine results -> LlamaIndex responses -------------------------------------------------------


def _extras(completion: Completion) -> tuple[dict[str, Any], dict[str, Any]]:
    """``additional_kwargs`` and ``raw`` of a response."""
    counts = {
        "prompt_tokens": completion.prompt_tokens,
        "cached_tokens": completion.cached_tokens,
        "completion_tokens": completion.completion_tokens,
        "finish_reason": completion.finish_reason,
        "stop_sequence": completion.stop_sequence,
    }
    usage = {
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
        "cached_tokens": completion.cached_tokens,
    }
    raw = {
        **counts,
        "token_ids": list(completion.token_ids),
        "prompt_seconds": completion.prompt_seconds,
        "generation_seconds": completion.generation_seconds,
        "prompt_tps": completion.prompt_tps,
        "generation_tps": completion.generation_tps,
        "usage": usage,  # the shape LlamaIndex's TokenCountingHandler reads
    }
    return counts, raw


def _completion_response(completion: Completion, *, delta: str | None = None) -> CompletionResponse:
    counts, raw = _extras(completion)
    return CompletionResponse(text=completion.text, delta=delta, additional_kwargs=counts, raw=raw)


class _Accumulator:
    """Turns engine chunks into cumulative responses; the last one carries the counts."""

    def __init__(self) -> None:
        self.text = ""
        self.ids: list[int] = []

    def add(self, chunk: CompletionChunk) -> CompletionResponse | None:
        self.text += chunk.text
        self.ids += chunk.token_ids
        if chunk.finish_reason is None:
            # Skip empty pieces (text held back while it may be a stop string's start).
            return CompletionResponse(text=self.text, delta=chunk.text) if chunk.text else None
        completion = Completion(
            text=self.text,
            token_ids=self.ids,
            finish_reason=chunk.finish_reason,
            prompt_tokens=chunk.prompt_tokens or 0,
            cached_tokens=chunk.cached_tokens or 0,
            completion_tokens=chunk.completion_tokens or 0,
            stop_sequence=chunk.stop_sequence,
            prompt_seconds=chunk.prompt_seconds or 0.0,
            generation_seconds=chunk.generation_seconds or 0.0,
        )
        return _completion_response(completion, delta=chunk.text)


def _stream_completion(chunks: Iterator[CompletionChunk], as_chat: bool = False) -> Iterator[Any]:
    acc = _Accumulator()
    try:
        for chunk in chunks:
            if (response := acc.add(chunk)) is not None:
                yield _chat_response(response) if as_chat else response
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()  # a consumer that stops early cancels the generation


async def _astream_completion(
    chunks: AsyncIterator[CompletionChunk], as_chat: bool = False
) -> AsyncIterator[Any]:
    acc = _Accumulator()
    try:
        async for chunk in chunks:
            if (response := acc.add(chunk)) is not None:
                yield _chat_response(response) if as_chat else response
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()  # a consumer that stops early cancels the generation


def _chat_response(response: CompletionResponse) -> ChatResponse:
    return ChatResponse(
        message=ChatMessage(role=MessageRole.ASSISTANT, content=response.text),
        delta=response.delta,
        raw=response.raw,
        additional_kwargs=response.additional_kwargs,
    )
