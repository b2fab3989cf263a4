"""LangChain ``ChatStarCoder``: StarCoder2 instruct checkpoints as a chat model, run on MLX."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ChatMessage, UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult, LLMResult
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import get_config_list

from .base import MODEL_CONFIG, RUN_ARGS, StarCoderSettings
from .chat import chat_prompt_ids, resolve_chat_template
from .engine import StarCoderEngine
from .errors import InvalidParameterError, UnsupportedModelError
from .types import Completion, CompletionChunk, counts

DEFAULT_CHAT_MODEL = "mlx-community/starcoder2-15b-instruct-v0.1-4bit"

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "tool"}


def _role(message: BaseMessage) -> str:
    if isinstance(message, ChatMessage):
        return message.role
    return _ROLES.get(message.type, message.type)


def _content(message: BaseMessage) -> str:
    """The text of a message; StarCoder2 reads text only."""
    if isinstance(message.content, list):
        for block in message.content:
            if not isinstance(block, str) and block.get("type") != "text":
                msg = f"ChatStarCoder reads text only; a message holds a {block.get('type')!r} block."
                raise InvalidParameterError(msg)
    return message.text


def _usage(completion: Completion | CompletionChunk) -> UsageMetadata:
    prompt = completion.prompt_tokens or 0
    output = completion.completion_tokens or 0
    return UsageMetadata(
        input_tokens=prompt,
        output_tokens=output,
        total_tokens=prompt + output,
        input_token_details={"cache_read": completion.cached_tokens or 0},
    )


# --- one engine batch for a LangChain batch ----------------------------------------------------------
# LangChain's chat ``batch`` runs one ``invoke`` per input, and ``generate`` one ``_generate`` per
# message list. So ``batch`` goes through ``generate`` when the inputs share one config, and
# ``generate`` first runs all its prompts as one engine batch; each ``_generate`` then takes its
# answer from ``_BATCHED`` (LangChain still does the callbacks, tracing and output per list).

_BATCHED: ContextVar[dict[tuple[int, ...], deque[Completion]] | None] = ContextVar(
    "starcoder_chat_batch", default=None
)


def _take_batched(ids: list[int]) -> Completion | None:
    answers = (_BATCHED.get() or {}).get(tuple(ids))
    return answers.popleft() if answers else None


def _by_prompt(prompts: list[list[int]], completions: Sequence[Completion]) -> dict:
    answers: dict[tuple[int, ...], deque[Completion]] = defaultdict(deque)
    for ids, completion in zip(prompts, completions, strict=True):
        answers[tuple(ids)].append(completion)
    return answers


_SHARED_CONFIG_KEYS = ("callbacks", "tags", "metadata", "run_name", "max_concurrency")


def _shared_config(
    inputs: list[Any], config: RunnableConfig | list[RunnableConfig] | None, return_exceptions: bool
) -> RunnableConfig | None:
    """The one config of a batch that can run as ``generate`` calls, else None."""
    if return_exceptions or len(inputs) < 2:
        return None
    configs = get_config_list(config, len(inputs))
    first = configs[0]
    if any(c.get("run_id") for c in configs):
        return None
    if any(c.get(k) != first.get(k) for c in configs[1:] for k in _SHARED_CONFIG_KEYS):
        return None
    return first


def _groups(inputs: list[Any], config: RunnableConfig) -> Iterator[list[Any]]:
    size = config.get("max_concurrency") or len(inputs)
    return (inputs[start : start + size] for start in range(0, len(inputs), size))


def _generate_args(config: RunnableConfig, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {key: config.get(key) for key in ("callbacks", "tags", "metadata", "run_name")} | kwargs


class ChatStarCoder(StarCoderSettings, BaseChatModel):
    """StarCoder2 instruct checkpoints (e.g. starcoder2-15b-instruct) as a LangChain chat model,
    run locally on Apple MLX.

    Messages go through the checkpoint's chat template (or ``chat_template=``); the template's
    own text is tokenized with control tokens, message contents as data, so a message that
    quotes ``<|endoftext|>`` cannot end the prompt. Weights load on first use, once, through the
    shared engine registry. StarCoder2 was not trained for tool calling or structured output,
    and reads text only.

    Setup:
        .. code-block:: bash

            pip install langchain-starcoder

    Key init args:
        model: str
            Hub id or local folder (default ``mlx-community/starcoder2-15b-instruct-v0.1-4bit``).
        chat_template: str | None
            A Jinja chat template, for checkpoints that lack one or to override it. It must insert
            each message's content unchanged (no ``| trim``); roles must be ones it knows.
        max_tokens, temperature, top_p, top_k, min_p, repetition_penalty, stop, seed, streaming,
        prompt_lookup_num_tokens, quantize, dtype, kv_bits, prompt_cache_dir, engine:
            As for :class:`~langchain_starcoder.StarCoderLLM` (message contents are always data).

    Instantiate:
        .. code-block:: python

            from langchain_starcoder import ChatStarCoder

            chat = ChatStarCoder(model="mlx-community/starcoder2-15b-instruct-v0.1-4bit", max_tokens=256)

    Invoke:
        .. code-block:: python

            messages = [("human", "Write a Python function that reverses a string.")]
            chat.invoke(messages)

    Stream:
        .. code-block:: python

            for chunk in chat.stream(messages):
                print(chunk.text, end="", flush=True)

    Batch:
        .. code-block:: python

            chat.batch([messages, [("human", "What does `yield` do?")]])  # one batched generation

    Async:
        .. code-block:: python

            await chat.ainvoke(messages)
            async for chunk in chat.astream(messages):
                print(chunk.text, end="")

    Streams end with a chunk that carries ``usage_metadata`` and ``chunk_position="last"`` (its
    text may be empty), as LangChain's chat models do.

    Token usage:
        .. code-block:: python

            chat.invoke(messages).usage_metadata
            # {'input_tokens': 25, 'output_tokens': 80, 'total_tokens': 105,
            #  'input_token_details': {'cache_read': 0}}

    Response metadata:
        .. code-block:: python

            chat.invoke(messages).response_metadata
            # {'model_name': ..., 'finish_reason': 'stop', 'prompt_tokens': 25, ...}
    """

    # Set here too: LangChain's base classes would otherwise turn extra="forbid" back to "ignore".
    model_config = MODEL_CONFIG

    model: str = DEFAULT_CHAT_MODEL
    """Hugging Face hub id or local folder of an instruct checkpoint."""

    chat_template: str | None = None
    """A Jinja chat template that replaces the checkpoint's own (required if it has none)."""

    _ls_model_type = "chat"

    @property
    def _llm_type(self) -> str:
        return "starcoder-mlx-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {**self._identifying_settings(), "chat_template": self.chat_template}

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        """Not available: StarCoder models were not trained for tool calling."""
        msg = (
            "StarCoder models have no tool calling (they were not trained for it), so ChatStarCoder "
            "cannot bind tools or give structured output. Ask for the format in the prompt instead."
        )
        raise NotImplementedError(msg)

    # --- prompts -----------------------------------------------------------------------------------

    def _prompt_ids(
        self, engine: StarCoderEngine, messages: Sequence[BaseMessage], *, check_size: bool = True
    ) -> list[int]:
        """The prompt for ``messages``: the template's text with control tokens, contents as data."""
        template = resolve_chat_template(engine, self.chat_template)
        if template is None:
            msg = (
                f"The checkpoint {engine.name} has no chat template, so ChatStarCoder cannot format "
                "messages. Set chat_template=... (a Jinja chat template) on ChatStarCoder, use an "
                "instruct checkpoint, or use StarCoderLLM for a base model."
            )
            raise UnsupportedModelError(msg)
        pairs = [(_role(m), _content(m)) for m in messages]
        return chat_prompt_ids(engine, pairs, template, check_size=check_size)

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` from the model's own tokenizer."""
        if self.custom_get_token_ids is not None:
            return self.custom_get_token_ids(text)
        return self.engine.encode(text, special_tokens=self.parse_special_tokens)

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """The length of the prompt these messages make, chat template included."""
        if tools:
            msg = "StarCoder models have no tool calling, so ChatStarCoder cannot count tool tokens."
            raise InvalidParameterError(msg)
        return len(self._prompt_ids(self.engine, messages, check_size=False))  # counts any length

    # --- generation ----------------------------------------------------------------------------------

    def _call(self, stop: Sequence[str] | None, kwargs: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        model, settings = super()._call(stop, kwargs)
        settings.pop("parse_special_tokens")  # contents are data, the template's text is control
        return model, settings

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        model, settings = self._call(stop, kwargs)
        engine = self._engine_for(model)
        ids = self._prompt_ids(engine, messages)
        completion = _take_batched(ids) or engine.generate(ids, **settings)
        return _chat_result(completion, model)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        model, settings = self._call(stop, kwargs)
        engine = await self._aengine_for(model)
        ids = await asyncio.to_thread(self._prompt_ids, engine, messages)
        completion = _take_batched(ids) or await engine.agenerate(ids, **settings)
        return _chat_result(completion, model)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        # BaseChatModel reports each chunk to the callbacks itself.
        model, settings = self._call(stop, kwargs)
        engine = self._engine_for(model)
        ids = self._prompt_ids(engine, messages)
        if (done := _take_batched(ids)) is not None:  # a batch that streams: answered already
            yield _chat_chunk(_whole(done), model)
            return
        chunks = engine.stream(ids, **settings)
        with contextlib.closing(chunks):
            for piece in chunks:
                yield _chat_chunk(piece, model)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        model, settings = self._call(stop, kwargs)
        engine = await self._aengine_for(model)
        ids = await asyncio.to_thread(self._prompt_ids, engine, messages)
        if (done := _take_batched(ids)) is not None:
            yield _chat_chunk(_whole(done), model)
            return
        chunks = engine.astream(ids, **settings)
        async with contextlib.aclosing(chunks):
            async for piece in chunks:
                yield _chat_chunk(piece, model)

    # --- batching (see _BATCHED) ---------------------------------------------------------------------

    def _batchable(self, count: int) -> bool:
        from langchain_core.globals import get_llm_cache

        uses_cache = self.cache is not False and (self.cache is not None or get_llm_cache() is not None)
        return count > 1 and not uses_cache

    def _batch_prompts(
        self, messages: list[list[BaseMessage]], kwargs: dict[str, Any]
    ) -> tuple[StarCoderEngine, list[list[int]], dict[str, Any]]:
        model, settings = self._call(kwargs.get("stop"), {k: v for k, v in kwargs.items() if k != "stop"})
        engine = self._engine_for(model)
        prompts = []
        for m in messages:
            # A list that cannot be formatted raises on its own turn, with its own run.
            with contextlib.suppress(Exception):
                prompts.append(self._prompt_ids(engine, m))
        return engine, prompts, settings

    def generate(self, messages: list[list[BaseMessage]], *args: Any, **kwargs: Any) -> LLMResult:
        if args or not self._batchable(len(messages)):
            return super().generate(messages, *args, **kwargs)
        engine, prompts, settings = self._batch_prompts(messages, _settings_of(kwargs))
        try:
            answers = _by_prompt(prompts, engine.generate_batch(prompts, **settings)) if prompts else {}
        except Exception:
            answers = {}  # one bad prompt: each list then runs (and fails) on its own
        token = _BATCHED.set(answers)
        try:
            return super().generate(messages, **kwargs)
        finally:
            _BATCHED.reset(token)

    async def agenerate(self, messages: list[list[BaseMessage]], *args: Any, **kwargs: Any) -> LLMResult:
        if args or not self._batchable(len(messages)):
            return await super().agenerate(messages, *args, **kwargs)
        engine, prompts, settings = await asyncio.to_thread(
            self._batch_prompts, messages, _settings_of(kwargs)
        )
        try:
            answers = (
                _by_prompt(prompts, await engine.agenerate_batch(prompts, **settings)) if prompts else {}
            )
        except Exception:
            answers = {}
        token = _BATCHED.set(answers)
        try:
            return await super().agenerate(messages, **kwargs)
        finally:
            _BATCHED.reset(token)

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:  # type: ignore[override]
        shared = _shared_config(inputs, config, return_exceptions)
        if shared is None:
            return super().batch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        args = _generate_args(shared, kwargs)
        return [
            m
            for group in _groups(inputs, shared)
            for m in _answers(self.generate(self._lists(group), **args))
        ]

    async def abatch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:  # type: ignore[override]
        shared = _shared_config(inputs, config, return_exceptions)
        if shared is None:
            return await super().abatch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        args = _generate_args(shared, kwargs)
        groups = _groups(inputs, shared)
        return [m for group in groups for m in _answers(await self.agenerate(self._lists(group), **args))]

    def _lists(self, inputs: list[LanguageModelInput]) -> list[list[BaseMessage]]:
        return [self._convert_input(i).to_messages() for i in inputs]


def _answers(result: LLMResult) -> list[AIMessage]:
    return [g[0].message for g in result.generations]  # type: ignore[attr-defined]


def _settings_of(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The generation keywords among ``generate``'s arguments (not callbacks, tags...)."""
    return {k: v for k, v in kwargs.items() if k not in RUN_ARGS}


def _chat_result(completion: Completion, model: str) -> ChatResult:
    message = AIMessage(
        content=completion.text,
        usage_metadata=_usage(completion),
        response_metadata={"model_name": model},
    )
    return ChatResult(
        generations=[ChatGeneration(message=message, generation_info=counts(completion))],
        llm_output={"model_name": model},
    )


def _whole(completion: Completion) -> CompletionChunk:
    """A finished completion as one last chunk (the two share their fields)."""
    return CompletionChunk(**vars(completion))


def _chat_chunk(piece: CompletionChunk, model: str) -> ChatGenerationChunk:
    if piece.finish_reason is None:
        return ChatGenerationChunk(message=AIMessageChunk(content=piece.text))
    message = AIMessageChunk(
        content=piece.text,
        usage_metadata=_usage(piece),
        response_metadata={"model_name": model},
        chunk_position="last",
    )
    return ChatGenerationChunk(message=message, generation_info=counts(piece))
