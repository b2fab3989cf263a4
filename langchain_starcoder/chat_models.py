"""LangChain ``ChatStarCoder``: StarCoder2 instruct checkpoints as a chat model, run on MLX."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    UsageMetadata,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult, LLMResult
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import get_config_list

from .chat import chat_prompt_ids, resolve_chat_template
from .engine import Completion, CompletionChunk, StarCoderEngine
from .errors import InvalidParameterError, UnsupportedModelError
from .llms import MODEL_CONFIG, StarCoderBase, generation_info

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


class _Batch:
    """The message lists of one ``generate`` call, generated together on the first ``_generate``.

    ``BaseChatModel.generate`` calls ``_generate`` once per message list; this lets those calls
    share one batched engine call while LangChain keeps doing callbacks, tracing and output.
    """

    def __init__(self, owner: ChatStarCoder, messages: Sequence[Sequence[BaseMessage]]):
        self.owner = owner
        self.messages = [list(m) for m in messages]
        self.results: dict[tuple[int, ...], deque[Completion]] | None = None
        self.lock = threading.Lock()
        self.task: asyncio.Future | None = None

    def _prompts(self, engine: StarCoderEngine) -> list[list[int]]:
        prompts = []
        for messages in self.messages:
            # A list that cannot be formatted raises on its own turn, with its own run.
            with contextlib.suppress(Exception):
                prompts.append(self.owner._prompt_ids(engine, messages))
        return prompts

    def _store(self, prompts: list[list[int]], completions: Sequence[Completion]) -> None:
        results: dict[tuple[int, ...], deque[Completion]] = defaultdict(deque)
        for ids, completion in zip(prompts, completions, strict=True):
            results[tuple(ids)].append(completion)
        self.results = results

    def _pop(self, ids: list[int]) -> Completion | None:
        queue = (self.results or {}).get(tuple(ids))
        return queue.popleft() if queue else None

    def take(self, engine: StarCoderEngine, ids: list[int], params: dict[str, Any]) -> Completion | None:
        with self.lock:
            if self.results is None:
                prompts = self._prompts(engine)
                try:
                    self._store(prompts, engine.generate_batch(prompts, **params) if prompts else [])
                except Exception:
                    self.results = {}  # one bad prompt: each list then runs (and fails) on its own
            return self._pop(ids)

    async def atake(
        self, engine: StarCoderEngine, ids: list[int], params: dict[str, Any]
    ) -> Completion | None:
        if self.task is None:
            prompts = self._prompts(engine)

            async def run() -> None:
                try:
                    self._store(prompts, await engine.agenerate_batch(prompts, **params) if prompts else [])
                except Exception:
                    self.results = {}

            self.task = asyncio.ensure_future(run())
        await asyncio.shield(self.task)
        return self._pop(ids)


_BATCH: ContextVar[_Batch | None] = ContextVar("starcoder_chat_batch", default=None)


class ChatStarCoder(StarCoderBase, BaseChatModel):
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

    Key init args — completion params:
        max_tokens: int
            The most tokens to generate (default 256).
        temperature: float
            0 (default) is greedy.
        top_p: float, top_k: int, min_p: float, repetition_penalty: float | None
            Sampling filters and a repetition penalty.
        stop: list[str] | None
            Stop strings, merged with a call's ``stop``.
        seed: int | None
            Makes sampling reproducible.

    Key init args — client params:
        model: str
            Hub id or local folder (default ``mlx-community/starcoder2-15b-instruct-v0.1-4bit``).
        chat_template: str | None
            A Jinja chat template, for checkpoints that lack one or to override it.
        quantize: 4 | 8 | None, dtype: str, kv_bits: 4 | 8 | None
            Load settings, as for ``StarCoderEngine.load``.
        engine: StarCoderEngine | None
            An already loaded engine to use.

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

    @classmethod
    def is_lc_serializable(cls) -> bool:
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        return ["langchain_starcoder", "chat_models"]

    @property
    def _llm_type(self) -> str:
        return "starcoder-mlx-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {**super()._identifying_params, "chat_template": self.chat_template}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return LangSmithParams(**self._ls_params("chat", stop, kwargs))

    # --- prompts -----------------------------------------------------------------------------------

    def _prompt_ids(self, engine: StarCoderEngine, messages: Sequence[BaseMessage]) -> list[int]:
        """The prompt for ``messages``: the template's text with control tokens, contents as data."""
        template = resolve_chat_template(engine, self.chat_template)
        if template is None:
            msg = (
                f"The checkpoint {engine.name} has no chat template, so ChatStarCoder cannot format "
                "messages. Set chat_template=... (a Jinja chat template) on ChatStarCoder, use an "
                "instruct checkpoint, or use StarCoderLLM for a base model."
            )
            raise UnsupportedModelError(msg)
        return chat_prompt_ids(engine, [(_role(m), _content(m)) for m in messages], template)

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` from the model's own tokenizer."""
        if self.custom_get_token_ids is not None:
            return self.custom_get_token_ids(text)
        return self.engine.encode(text)

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """The length of the prompt these messages make, chat template included."""
        if tools:
            msg = "ChatStarCoder has no tool calling, so it cannot count tool tokens."
            raise InvalidParameterError(msg)
        return len(self._prompt_ids(self.engine, messages))

    # --- generation ----------------------------------------------------------------------------------

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        model, params = self._call_settings(stop, kwargs)
        engine = self._engine_for(model)
        ids = self._prompt_ids(engine, messages)
        batch = _BATCH.get()
        completion = batch.take(engine, ids, params) if batch and batch.owner is self else None
        if completion is None:
            completion = engine.generate(ids, **params)
        return _chat_result(completion, model)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        model, params = self._call_settings(stop, kwargs)
        engine = await self._aengine_for(model)
        ids = self._prompt_ids(engine, messages)
        batch = _BATCH.get()
        completion = await batch.atake(engine, ids, params) if batch and batch.owner is self else None
        if completion is None:
            completion = await engine.agenerate(ids, **params)
        return _chat_result(completion, model)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        # BaseChatModel reports each chunk to the callbacks itself.
        model, params = self._call_settings(stop, kwargs)
        engine = self._engine_for(model)
        chunks = engine.stream(self._prompt_ids(engine, messages), **params)
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
        model, params = self._call_settings(stop, kwargs)
        engine = await self._aengine_for(model)
        chunks = engine.astream(self._prompt_ids(engine, messages), **params)
        async with contextlib.aclosing(chunks):
            async for piece in chunks:
                yield _chat_chunk(piece, model)

    # --- batching ----------------------------------------------------------------------------------
    # LangChain's chat batch runs one ``invoke`` per input. These overrides route a batch through
    # ``generate``, whose per-list ``_generate`` calls then share one batched engine call.

    def _batchable(self, count: int) -> bool:
        from langchain_core.globals import get_llm_cache

        uses_cache = self.cache is not False and (self.cache is not None or get_llm_cache() is not None)
        return count > 1 and not uses_cache

    def generate(self, messages: list[list[BaseMessage]], *args: Any, **kwargs: Any) -> LLMResult:
        if not self._batchable(len(messages)):
            return super().generate(messages, *args, **kwargs)
        token = _BATCH.set(_Batch(self, messages))
        try:
            return super().generate(messages, *args, **kwargs)
        finally:
            _BATCH.reset(token)

    async def agenerate(self, messages: list[list[BaseMessage]], *args: Any, **kwargs: Any) -> LLMResult:
        if not self._batchable(len(messages)):
            return await super().agenerate(messages, *args, **kwargs)
        token = _BATCH.set(_Batch(self, messages))
        try:
            return await super().agenerate(messages, *args, **kwargs)
        finally:
            _BATCH.reset(token)

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:  # type: ignore[override]
        shared = self._shared_config(inputs, config, return_exceptions)
        if shared is None:
            return super().batch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        return self._in_groups(inputs, shared, lambda group: self._generate_group(group, shared, kwargs))

    async def abatch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:  # type: ignore[override]
        shared = self._shared_config(inputs, config, return_exceptions)
        if shared is None:
            return await super().abatch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        out: list[AIMessage] = []
        size = shared.get("max_concurrency") or len(inputs)
        for start in range(0, len(inputs), size):
            group = inputs[start : start + size]
            result = await self.agenerate(
                [self._convert_input(i).to_messages() for i in group], **self._generate_args(shared, kwargs)
            )
            out += [g[0].message for g in result.generations]  # type: ignore[attr-defined]
        return out

    def _shared_config(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None,
        return_exceptions: bool,
    ) -> RunnableConfig | None:
        """The one config of a batch that can run as one ``generate`` call, else None."""
        if return_exceptions or len(inputs) < 2:
            return None
        configs = get_config_list(config, len(inputs))
        keys = ("callbacks", "tags", "metadata", "run_name", "max_concurrency")
        first = configs[0]
        if any(c.get("run_id") for c in configs):
            return None
        if any(c.get(k) != first.get(k) for c in configs[1:] for k in keys):
            return None
        return first

    def _in_groups(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig,
        run: Callable[[list[LanguageModelInput]], list[AIMessage]],
    ) -> list[AIMessage]:
        size = config.get("max_concurrency") or len(inputs)
        return [
            message for start in range(0, len(inputs), size) for message in run(inputs[start : start + size])
        ]

    @staticmethod
    def _generate_args(config: RunnableConfig, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {
            "callbacks": config.get("callbacks"),
            "tags": config.get("tags"),
            "metadata": config.get("metadata"),
            "run_name": config.get("run_name"),
            **kwargs,
        }

    def _generate_group(
        self, group: list[LanguageModelInput], config: RunnableConfig, kwargs: dict[str, Any]
    ) -> list[AIMessage]:
        result = self.generate(
            [self._convert_input(i).to_messages() for i in group], **self._generate_args(config, kwargs)
        )
        return [g[0].message for g in result.generations]  # type: ignore[attr-defined]


def _chat_result(completion: Completion, model: str) -> ChatResult:
    message = AIMessage(
        content=completion.text,
        usage_metadata=_usage(completion),
        response_metadata={"model_name": model},
    )
    return ChatResult(
        generations=[ChatGeneration(message=message, generation_info=generation_info(completion))],
        llm_output={"model_name": model},
    )


def _chat_chunk(piece: CompletionChunk, model: str) -> ChatGenerationChunk:
    if piece.finish_reason is None:
        return ChatGenerationChunk(message=AIMessageChunk(content=piece.text))
    message = AIMessageChunk(
        content=piece.text,
        usage_metadata=_usage(piece),
        response_metadata={"model_name": model},
        chunk_position="last",
    )
    return ChatGenerationChunk(message=message, generation_info=generation_info(piece))
