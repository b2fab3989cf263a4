"""The LlamaIndex ``StarCoder``'s tools and structured prediction (:class:`ToolsAndStructure`, a mixin):
chat messages with tool calls and results as chat turns, answers read back as ``ToolCallBlock``\\ s (and
OpenAI-style ``tool_calls`` in ``additional_kwargs``), and structured predictions under the engine's
JSON-schema constraint."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    MessageRole,
    ToolCallBlock,
)
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.llm import (
    LLMStructuredPredictEndEvent,
    LLMStructuredPredictStartEvent,
)
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.program.utils import process_streaming_objects
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.types import PydanticProgramMode
from pydantic import BaseModel

from ._tools import COMPACT, call_text, close_objects, result_text

Model = TypeVar("Model", bound=BaseModel)
dispatcher = get_dispatcher(__name__)

#: ``chat``'s keywords that carry tools (the rest are generation settings).
TOOL_KEYS = ("tools", "tool_choice", "parallel_tool_calls")


def turns(messages: Sequence[ChatMessage], roles: frozenset[str]) -> list[tuple[str, str]]:
    """``(role, content)`` turns for the chat template (which knows ``roles``): an assistant's calls
    (``ToolCallBlock``\\ s, or OpenAI's ``tool_calls`` in ``additional_kwargs``) as the text it writes for
    them; a tool's result in a "tool" turn, or a user turn where the template has none."""
    out = []
    for message in messages:
        role = message.role.value if isinstance(message.role, MessageRole) else str(message.role)
        content = message.content or ""
        if role == "tool":
            if "tool" not in roles:
                extra = message.additional_kwargs
                role, content = "user", result_text(content, extra.get("name"), extra.get("tool_call_id"))
        elif calls := _calls_of(message):
            content = f"{content}\n{call_text(calls)}" if content else call_text(calls)
        out.append((role, content))
    return out


def _calls_of(message: ChatMessage) -> list[tuple[str, Any]]:
    calls = [(b.tool_name, _arguments(b.tool_kwargs)) for b in message.blocks if isinstance(b, ToolCallBlock)]
    if calls:
        return calls
    for call in message.additional_kwargs.get("tool_calls") or []:  # OpenAI's shape, from another LLM
        function = call.get("function", {}) if isinstance(call, dict) else {}
        if function.get("name"):
            calls.append((function["name"], _arguments(function.get("arguments") or {})))
    return calls


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def tool_selections(response: ChatResponse, error_on_no_tool_call: bool) -> list[ToolSelection]:
    """The calls a response made; with ``error_on_no_tool_call``, none is an error that says why."""
    selections = [
        ToolSelection(tool_id=b.tool_call_id or "", tool_name=b.tool_name, tool_kwargs=b.tool_kwargs)
        for b in response.message.blocks
        if isinstance(b, ToolCallBlock)
    ]
    if not selections and error_on_no_tool_call:
        invalid = response.message.additional_kwargs.get("invalid_tool_calls")
        why = f": {invalid[0]['error']}" if invalid else ""
        msg = f"Expected at least one tool call, but got 0 tool calls{why}"
        raise ValueError(msg)
    return selections


# --- structured prediction ---------------------------------------------------------------------------


def schema_of(output_cls: type[BaseModel]) -> dict[str, Any]:
    """The constraint of a structured prediction: the model's JSON schema, its objects closed, compact."""
    return {**close_objects(output_cls.model_json_schema()), **COMPACT}


def answer_text(response: ChatResponse | CompletionResponse) -> str:
    return response.message.content or "" if isinstance(response, ChatResponse) else response.text


def structured_value(output_cls: type[Model], response: ChatResponse | CompletionResponse) -> Model:
    """The instance a finished answer makes; an answer cut before its JSON closed is an error, never a
    value (a repaired JSON would read as valid)."""
    finish = response.additional_kwargs.get("finish_reason")
    if finish != "stop":
        msg = (
            f"The answer ended before its JSON was complete (finish_reason {finish!r}: max_tokens or a "
            f"stop string), so it is no {output_cls.__name__}; raise max_tokens."
        )
        raise ValueError(msg)
    return output_cls.model_validate_json(answer_text(response))


def _predicted(output_cls: type[Model], response: ChatResponse | CompletionResponse) -> Model:
    """The instance of a structured prediction's response, announced as its end."""
    result = structured_value(output_cls, response)
    dispatcher.event(LLMStructuredPredictEndEvent(output=result))
    return result


def _streamed(output_cls: type[Model], response: Any, current: Any) -> tuple[Any, bool]:
    """What one streamed response gives, and whether it is the last: the whole instance once the
    answer is finished, else the partial one so far (``current``, the one before)."""
    if response.additional_kwargs.get("finish_reason") is not None:
        return structured_value(output_cls, response), True
    return process_streaming_objects(response, output_cls, cur_objects=current and [current]), False


class ToolsAndStructure:
    """``StarCoder``'s function calling (``chat_with_tools`` and the agents over it) and structured
    prediction. With the default program mode a structured answer is decoded under the output class's
    JSON schema (chat with a chat template, else completion); other modes run LlamaIndex's programs."""

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[Any],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        tool_choice: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """``chat``'s keywords for :meth:`chat_with_tools`: the tools in OpenAI's form and the choice
        ("required" with ``tool_required``, else "auto"; or ``tool_choice``: "none", a tool's name)."""
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(
                ChatMessage(role=MessageRole.USER, content=user_msg)
                if isinstance(user_msg, str)
                else user_msg
            )
        return {
            "messages": messages,
            "tools": [t.metadata.to_openai_tool() for t in tools] or None,
            "tool_choice": tool_choice
            if tool_choice is not None
            else ("required" if tool_required else "auto"),
            "parallel_tool_calls": allow_parallel_tool_calls,
            **kwargs,
        }

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        """The calls ``response`` made (its ``ToolCallBlock``\\ s). A call cut short by ``max_tokens``
        is never one: with ``error_on_no_tool_call`` the error says so."""
        return tool_selections(response, error_on_no_tool_call)

    def _structured_call(
        self,
        output_cls: type[Model],
        prompt: BasePromptTemplate,
        llm_kwargs: dict | None,
        prompt_args: dict,
        methods: tuple[Any, Any],
    ) -> Any:
        """What ``methods`` (chat's and complete's kind: sync, async, streaming) give for the prompt,
        decoded under ``output_cls``'s JSON schema: chat with a chat template, else completion."""
        (chat, complete), is_chat = methods, self.metadata.is_chat_model
        formatted = (
            self._get_messages(prompt, **prompt_args) if is_chat else self._get_prompt(prompt, **prompt_args)
        )
        kwargs = {**(llm_kwargs or {}), "json_schema": schema_of(output_cls)}
        return chat(formatted, **kwargs) if is_chat else complete(formatted, formatted=True, **kwargs)

    def structured_predict(
        self,
        output_cls: type[Model],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Model:
        """An ``output_cls`` instance, decoded under its JSON schema; an answer cut by ``max_tokens``
        before its JSON closed raises ValueError (it is never parsed as valid)."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return super().structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        dispatcher.event(
            LLMStructuredPredictStartEvent(output_cls=output_cls, template=prompt, template_args=prompt_args)
        )
        methods = (self.chat, self.complete)
        response = self._structured_call(output_cls, prompt, llm_kwargs, prompt_args, methods)
        return _predicted(output_cls, response)

    async def astructured_predict(
        self,
        output_cls: type[Model],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Model:
        """Async :meth:`structured_predict`."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return await super().astructured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        dispatcher.event(
            LLMStructuredPredictStartEvent(output_cls=output_cls, template=prompt, template_args=prompt_args)
        )
        methods = (self.achat, self.acomplete)
        response = await self._structured_call(output_cls, prompt, llm_kwargs, prompt_args, methods)
        return _predicted(output_cls, response)

    def _structured_stream_call(
        self,
        output_cls: type[Model],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Any:
        """Partial instances as the answer streams (LlamaIndex's flexible models), then the whole one."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return super()._structured_stream_call(output_cls, prompt, llm_kwargs, **prompt_args)
        methods = (self.stream_chat, self.stream_complete)
        responses = self._structured_call(output_cls, prompt, llm_kwargs, prompt_args, methods)

        def values() -> Any:
            current = None
            for response in responses:
                current, last = _streamed(output_cls, response, current)
                yield current
                if last:
                    return

        return values()

    async def _structured_astream_call(
        self,
        output_cls: type[Model],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Any:
        """Async :meth:`_structured_stream_call`."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return await super()._structured_astream_call(output_cls, prompt, llm_kwargs, **prompt_args)
        methods = (self.astream_chat, self.astream_complete)
        responses = await self._structured_call(output_cls, prompt, llm_kwargs, prompt_args, methods)

        async def values() -> Any:
            current = None
            async for response in responses:
                current, last = _streamed(output_cls, response, current)
                yield current
                if last:
                    return

        return values()
