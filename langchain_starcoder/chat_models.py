"""LangChain ``ChatStarCoder``: StarCoder2 instruct checkpoints as a chat model, run on MLX."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult, LLMResult
from langchain_core.runnables import Runnable, RunnableConfig

from ._base import MODEL_CONFIG, StarCoderSettings
from ._chat import resolve_chat_template, template_roles, tool_chat_prompt_ids
from ._chat_batching import (
    BATCHED,
    by_prompt,
    generate_args,
    groups,
    messages_of,
    settings_of,
    shared_config,
    take_batched,
)
from ._chat_tools import (
    ChunkReader,
    StructuredMethod,
    openai_tools,
    reply_fields,
    split_plan,
    structured_output,
    turns,
)
from ._tools import Tool, ToolPlan, constrained
from .engine import StarCoderEngine
from .errors import UnsupportedModelError
from .types import Completion, CompletionChunk, counts

DEFAULT_CHAT_MODEL = "mlx-community/starcoder2-15b-instruct-v0.1-4bit"


def _usage(completion: Completion | CompletionChunk) -> UsageMetadata:
    prompt = completion.prompt_tokens or 0
    output = completion.completion_tokens or 0
    return UsageMetadata(
        input_tokens=prompt,
        output_tokens=output,
        total_tokens=prompt + output,
        input_token_details={"cache_read": completion.cached_tokens or 0},
    )


class ChatStarCoder(StarCoderSettings, BaseChatModel):
    """StarCoder2 instruct checkpoints (e.g. starcoder2-15b-instruct) as a LangChain chat model,
    run locally on Apple MLX.

    Messages go through the checkpoint's chat template (or ``chat_template=``); the template's
    own text is tokenized with control tokens, message contents as data, so a message that
    quotes ``<|endoftext|>`` cannot end the prompt. Weights load on first use, once, through the
    shared engine registry. StarCoder2 reads text only.

    Tool calls and structured output are constrained decoding: StarCoder2 was not trained for them, so
    the engine holds the answer to the shape (a call of one of the tools with arguments valid against
    its schema, or the schema's JSON). The shape is always right; how well the model fills it depends
    on the checkpoint. An answer cut by ``max_tokens`` inside a call comes back as an invalid tool call
    (``finish_reason`` "length"), never as a call.

    Setup:
        .. code-block:: bash

            pip install -e .  # in a checkout of this repository: the package is not on PyPI yet

    Key init args:
        model: str
            Hub id or local folder (default ``mlx-community/starcoder2-15b-instruct-v0.1-4bit``).
        chat_template: str | None
            A Jinja chat template, for checkpoints that lack one or to override it. It must insert
            each message's content unchanged (no ``| trim``); roles must be ones it knows.
        max_tokens, temperature, top_p, top_k, min_p, repetition_penalty, stop, seed, streaming,
        prompt_lookup_num_tokens, quantize, dtype, kv_bits, prompt_cache_dir, adapter_path, engine:
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

    Tool calling and structured output:
        .. code-block:: python

            from typing import Literal
            def get_weather(city: Literal["Paris", "London", "Tokyo"]) -> str:
                "The weather in a city."

            # A closed set ends within max_tokens on any weights (an unclosed free string: invalid call)
            chat.bind_tools([get_weather], tool_choice="any").invoke("Weather in Paris?").tool_calls
            # [{'name': 'get_weather', 'args': {'city': 'Paris'}, 'id': 'call_...', 'type': 'tool_call'}]

            class Answer(BaseModel):  # pydantic
                code: str
                explanation: str

            chat.with_structured_output(Answer).invoke("Reverse a string in Python.")
            # Answer(code='...', explanation='...')

    JSON schema, regex or grammar of any answer (``json_schema=``, ``regex=``, ``grammar=``, as fields or
    per call) constrain decoding the same way.
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

    def bind_tools(
        self,
        tools: Sequence[Any],
        *,
        tool_choice: Any = None,
        parallel_tool_calls: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """This model, calling ``tools`` (LangChain tools, Pydantic models, functions or OpenAI dicts).

        Args:
            tools: What the model may call; the prompt lists them, with their argument schemas.
            tool_choice: "auto" (or None): the model answers in text or calls a tool; "any" (or
                "required", True): it calls one of the tools; a tool's name: it calls that tool; "none":
                it answers in text. Decoding enforces the choice and each tool's argument schema.
            parallel_tool_calls: True lets one answer make several calls (a JSON list); by default
                an answer makes one call.
            kwargs: Other settings bound with the tools (``max_tokens``...).
        """
        formatted = openai_tools(tools)
        ToolPlan([Tool.from_openai(t) for t in formatted], tool_choice)  # a bad choice is refused now
        return self.bind(
            tools=formatted, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls, **kwargs
        )

    def with_structured_output(  # type: ignore[override]
        self,
        schema: Any = None,
        *,
        method: StructuredMethod = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, Any]:
        """This model answering in ``schema``'s shape (a Pydantic model, a TypedDict, a JSON schema or
        an OpenAI tool), parsed: a Pydantic model's instance, else a dict.

        Args:
            schema: The shape of the answer (optional with "json_mode": any JSON object).
            method: "json_schema" (default): decoding follows the schema's JSON schema;
                "function_calling": the answer is a call of a tool with the schema's arguments;
                "json_mode": a JSON object (held to the schema too, when one is given).
            include_raw: Return ``{"raw": AIMessage, "parsed": ..., "parsing_error": ...}`` instead.
            strict: Accepted for compatibility: the constraint is always strict. Objects take only the
                properties the schema names (``additionalProperties`` false where it is not set).
        """
        if kwargs:
            msg = f"Unknown argument(s) {sorted(kwargs)} for with_structured_output."
            raise ValueError(msg)
        return structured_output(self, schema, method, include_raw)

    # --- prompts -----------------------------------------------------------------------------------

    def _prompt_ids(
        self,
        engine: StarCoderEngine,
        messages: Sequence[BaseMessage],
        plan: ToolPlan | None = None,
        *,
        check_size: bool = True,
    ) -> list[int]:
        """The prompt for ``messages``: the template's text with control tokens, contents as data; with
        tools, what the plan tells the model about them."""
        template = resolve_chat_template(engine, self.chat_template)
        if template is None:
            msg = (
                f"The checkpoint {engine.name} has no chat template, so ChatStarCoder cannot format "
                "messages. Set chat_template=... (a Jinja chat template) on ChatStarCoder, use an "
                "instruct checkpoint, or use StarCoderLLM for a base model."
            )
            raise UnsupportedModelError(msg)
        pairs = turns(messages, template_roles(template))
        return tool_chat_prompt_ids(engine, pairs, template, plan, check_size=check_size)

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` from the model's own tokenizer."""
        if self.custom_get_token_ids is not None:
            return self.custom_get_token_ids(text)
        return self.engine.encode(text, special_tokens=self.parse_special_tokens)

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """The length of the prompt these messages make, chat template (and tools, as with
        ``tool_choice="auto"``) included."""
        plan, _ = split_plan({"tools": tools})
        return len(self._prompt_ids(self.engine, messages, plan, check_size=False))  # counts any length

    # --- generation ----------------------------------------------------------------------------------

    def _call(self, stop: Sequence[str] | None, kwargs: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        model, settings = super()._call(stop, kwargs)
        settings.pop("parse_special_tokens")  # contents are data, the template's text is control
        return model, settings

    def _request(
        self, stop: Sequence[str] | None, kwargs: Mapping[str, Any]
    ) -> tuple[str, dict[str, Any], ToolPlan | None]:
        """The model, the engine keywords and the tool plan (None without tools) of one call."""
        plan, rest = split_plan(kwargs)
        model, settings = self._call(stop, rest)
        return model, constrained(settings, plan), plan

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        model, settings, plan = self._request(stop, kwargs)
        engine = self._engine_for(model)
        ids = self._prompt_ids(engine, messages, plan)
        completion = take_batched(ids) or engine.generate(ids, **settings)
        return _chat_result(completion, model, plan)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        model, settings, plan = self._request(stop, kwargs)
        engine = await self._aengine_for(model)
        ids = await asyncio.to_thread(self._prompt_ids, engine, messages, plan)
        completion = take_batched(ids) or await engine.agenerate(ids, **settings)
        return _chat_result(completion, model, plan)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        # BaseChatModel reports each chunk to the callbacks itself.
        model, settings, plan = self._request(stop, kwargs)
        engine = self._engine_for(model)
        ids = self._prompt_ids(engine, messages, plan)
        reader = ChunkReader(plan) if plan is not None else None
        if (done := take_batched(ids)) is not None:  # a batch that streams: answered already
            yield _chat_chunk(_whole(done), model, reader)
            return
        chunks = engine.stream(ids, **settings)
        with contextlib.closing(chunks):
            for piece in chunks:
                if (chunk := _chat_chunk(piece, model, reader)) is not None:
                    yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        model, settings, plan = self._request(stop, kwargs)
        engine = await self._aengine_for(model)
        ids = await asyncio.to_thread(self._prompt_ids, engine, messages, plan)
        reader = ChunkReader(plan) if plan is not None else None
        if (done := take_batched(ids)) is not None:
            yield _chat_chunk(_whole(done), model, reader)
            return
        chunks = engine.astream(ids, **settings)
        async with contextlib.aclosing(chunks):
            async for piece in chunks:
                if (chunk := _chat_chunk(piece, model, reader)) is not None:
                    yield chunk

    # --- batching (see chat_batching) -----------------------------------------------------------------

    def _batchable(self, count: int) -> bool:
        from langchain_core.globals import get_llm_cache

        uses_cache = self.cache is not False and (self.cache is not None or get_llm_cache() is not None)
        return count > 1 and not uses_cache

    def _batch_prompts(
        self, messages: list[list[BaseMessage]], kwargs: dict[str, Any]
    ) -> tuple[StarCoderEngine, list[list[int]], dict[str, Any]]:
        model, settings, plan = self._request(
            kwargs.get("stop"), {k: v for k, v in kwargs.items() if k != "stop"}
        )
        engine = self._engine_for(model)
        prompts = []
        for m in messages:
            # A list that cannot be formatted raises on its own turn, with its own run.
            with contextlib.suppress(Exception):
                prompts.append(self._prompt_ids(engine, m, plan))
        return engine, prompts, settings

    def generate(self, messages: list[list[BaseMessage]], *args: Any, **kwargs: Any) -> LLMResult:
        if args or not self._batchable(len(messages)):
            return super().generate(messages, *args, **kwargs)
        engine, prompts, settings = self._batch_prompts(messages, settings_of(kwargs))
        try:
            answers = by_prompt(prompts, engine.generate_batch(prompts, **settings)) if prompts else {}
        except Exception:
            answers = {}  # one bad prompt: each list then runs (and fails) on its own
        token = BATCHED.set(answers)
        try:
            return super().generate(messages, **kwargs)
        finally:
            BATCHED.reset(token)

    async def agenerate(self, messages: list[list[BaseMessage]], *args: Any, **kwargs: Any) -> LLMResult:
        if args or not self._batchable(len(messages)):
            return await super().agenerate(messages, *args, **kwargs)
        engine, prompts, settings = await asyncio.to_thread(
            self._batch_prompts, messages, settings_of(kwargs)
        )
        try:
            answers = by_prompt(prompts, await engine.agenerate_batch(prompts, **settings)) if prompts else {}
        except Exception:
            answers = {}
        token = BATCHED.set(answers)
        try:
            return await super().agenerate(messages, **kwargs)
        finally:
            BATCHED.reset(token)

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:  # type: ignore[override]
        shared = shared_config(inputs, config, return_exceptions)
        if shared is None:
            return super().batch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        args = generate_args(shared, kwargs)
        return [
            m
            for group in groups(inputs, shared)
            for m in messages_of(self.generate(self._lists(group), **args))
        ]

    async def abatch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:  # type: ignore[override]
        shared = shared_config(inputs, config, return_exceptions)
        if shared is None:
            return await super().abatch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        args = generate_args(shared, kwargs)
        return [
            m
            for group in groups(inputs, shared)
            for m in messages_of(await self.agenerate(self._lists(group), **args))
        ]

    def _lists(self, inputs: list[LanguageModelInput]) -> list[list[BaseMessage]]:
        return [self._convert_input(i).to_messages() for i in inputs]


def _chat_result(completion: Completion, model: str, plan: ToolPlan | None) -> ChatResult:
    fields = reply_fields(plan.read(completion.text)) if plan is not None else {"content": completion.text}
    message = AIMessage(**fields, usage_metadata=_usage(completion), response_metadata={"model_name": model})
    return ChatResult(
        generations=[ChatGeneration(message=message, generation_info=counts(completion))],
        llm_output={"model_name": model},
    )


def _whole(completion: Completion) -> CompletionChunk:
    """A finished completion as one last chunk (the two share their fields)."""
    return CompletionChunk(**vars(completion))


def _chat_chunk(piece: CompletionChunk, model: str, reader: ChunkReader | None) -> ChatGenerationChunk | None:
    """The chunk of a streamed piece; None for a piece a tool plan holds back (until a call completes)."""
    last = piece.finish_reason is not None
    fields = reader.fields(piece.text, last) if reader is not None else {"content": piece.text}
    if not last:
        shows = reader is None or any(fields.values())  # (a plan holds text back until it knows)
        return ChatGenerationChunk(message=AIMessageChunk(**fields)) if shows else None
    message = AIMessageChunk(
        **fields, usage_metadata=_usage(piece), response_metadata={"model_name": model}, chunk_position="last"
    )
    return ChatGenerationChunk(message=message, generation_info=counts(piece))
