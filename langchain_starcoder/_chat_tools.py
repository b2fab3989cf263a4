"""ChatStarCoder's tools and structured output on LangChain's side: the tools a call binds as a
:class:`~langchain_starcoder._tools.ToolPlan`, messages with tool calls and results as chat turns, answers
read back as ``AIMessage`` tool calls (streamed as tool-call chunks), and ``with_structured_output``'s
runnables over the engine's JSON-schema constraint."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import Any, Literal

from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, ToolMessage
from langchain_core.messages.tool import invalid_tool_call, tool_call, tool_call_chunk
from langchain_core.output_parsers import (
    JsonOutputKeyToolsParser,
    JsonOutputParser,
    PydanticOutputParser,
    PydanticToolsParser,
)
from langchain_core.runnables import Runnable, RunnableGenerator, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass

from ._tools import (
    COMPACT,
    Reply,
    ReplyReader,
    ToolCall,
    ToolPlan,
    call_text,
    close_objects,
    plan_of,
    result_text,
)
from .errors import InvalidParameterError

#: A call's keywords that bind_tools sets (the rest are generation settings).
TOOL_KEYS = ("tools", "tool_choice", "parallel_tool_calls")
#: Content blocks that hold a call already in ``AIMessage.tool_calls`` (Anthropic's, LangChain's).
_CALL_BLOCKS = frozenset({"tool_use", "tool_call", "function_call"})

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "tool"}

StructuredMethod = Literal["json_schema", "function_calling", "json_mode"]


def openai_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """LangChain tools, Pydantic models, functions or dicts in OpenAI's form."""
    try:
        return [convert_to_openai_tool(t) for t in tools]
    except (TypeError, ValueError) as e:
        msg = f"A tool could not be read: {e}. Pass LangChain tools, Pydantic models, functions or dicts."
        raise InvalidParameterError(msg) from e


def split_plan(kwargs: Mapping[str, Any]) -> tuple[ToolPlan | None, dict[str, Any]]:
    """The tool plan of a call's keywords (None without tools) and the other keywords."""
    rest = {k: v for k, v in kwargs.items() if k not in TOOL_KEYS}
    tools = kwargs.get("tools")
    plan = plan_of(
        openai_tools(tools) if tools else None, kwargs.get("tool_choice"), kwargs.get("parallel_tool_calls")
    )
    return plan, rest


# --- messages in ----------------------------------------------------------------------------------


def turns(messages: Sequence[BaseMessage], roles: frozenset[str]) -> list[tuple[str, str]]:
    """``(role, content)`` turns for the chat template (which knows ``roles``): an assistant's calls as
    the text it writes for them, a tool's result in a "tool" turn, or a user turn where there is none."""
    out = []
    for message in messages:
        if isinstance(message, ToolMessage):
            content = _text(message)
            if "tool" in roles:
                out.append(("tool", content))
            else:
                out.append(("user", result_text(content, message.name, message.tool_call_id)))
            continue
        role = message.role if isinstance(message, ChatMessage) else _ROLES.get(message.type, message.type)
        content = _text(message)
        if isinstance(message, AIMessage) and message.tool_calls:
            calls = call_text((c["name"], c["args"]) for c in message.tool_calls)
            content = f"{content}\n{calls}" if content else calls
        out.append((role, content))
    return out


def _text(message: BaseMessage) -> str:
    """The text of a message; StarCoder2 reads text only (blocks of calls are in ``tool_calls``)."""
    if isinstance(message.content, list):
        for block in message.content:
            kind = None if isinstance(block, str) else block.get("type")
            if kind not in (None, "text", *_CALL_BLOCKS):
                msg = f"ChatStarCoder reads text only; a message holds a {kind!r} block."
                raise InvalidParameterError(msg)
    return message.text


# --- answers out ------------------------------------------------------------------------------------


def reply_fields(reply: Reply) -> dict[str, Any]:
    """An ``AIMessage``'s content, ``tool_calls`` and ``invalid_tool_calls`` for a reply."""
    return {
        "content": reply.content,
        "tool_calls": [tool_call(name=c.name, args=c.arguments, id=c.id) for c in reply.calls],
        "invalid_tool_calls": [
            invalid_tool_call(name=None, args=c.text, id=c.id, error=c.error) for c in reply.invalid
        ],
    }


class ChunkReader:
    """Streamed pieces as ``AIMessageChunk`` fields: text as content, each call as one tool-call chunk
    once its JSON is complete (a partial call would read as a valid one: LangChain completes JSON)."""

    def __init__(self, plan: ToolPlan) -> None:
        self._reader = ReplyReader(plan)
        self._index = 0

    def fields(self, text: str, last: bool) -> dict[str, Any]:
        content, calls = self._reader.feed(text)
        chunks = [self._chunk(c) for c in calls]
        if last:
            rest, invalid = self._reader.end()
            content += rest
            # An incomplete call's text as a JSON string: LangChain then reads it as an invalid call.
            for call in invalid:
                chunks.append(
                    tool_call_chunk(name=None, args=json.dumps(call.text), id=call.id, index=self._index)
                )
                self._index += 1
        return {"content": content, "tool_call_chunks": chunks}

    def _chunk(self, call: ToolCall) -> Any:
        args = json.dumps(call.arguments, ensure_ascii=False)
        chunk = tool_call_chunk(name=call.name, args=args, id=call.id, index=self._index)
        self._index += 1
        return chunk


# --- with_structured_output ----------------------------------------------------------------------------


def _complete(messages: Iterator[BaseMessage]) -> Iterator[BaseMessage]:
    """The answer's messages passed on as they stream; then an error if the constraint did not complete
    (LangChain's JSON parsers would otherwise close a cut answer's braces and read it as valid)."""
    last = None
    for last in messages:
        yield last
    _check_complete(last)


async def _acomplete(messages: AsyncIterator[BaseMessage]) -> AsyncIterator[BaseMessage]:
    last = None
    async for last in messages:
        yield last
    _check_complete(last)


def _check_complete(message: BaseMessage | None) -> None:
    info = message.response_metadata if message is not None else {}
    if info.get("constrained") and info.get("finish_reason") != "stop":
        msg = (
            f"The answer ended before its JSON was complete (finish_reason {info.get('finish_reason')!r}: "
            "max_tokens or a stop string); raise max_tokens."
        )
        raise OutputParserException(msg, llm_output=message.text if message is not None else "")


def structured_output(
    model: Any, schema: Any, method: StructuredMethod, include_raw: bool
) -> Runnable[LanguageModelInput, Any]:
    """``model`` answering in ``schema``'s shape, parsed (see ``ChatStarCoder.with_structured_output``)."""
    if schema is None and method != "json_mode":
        msg = f"with_structured_output(method={method!r}) needs a schema."
        raise ValueError(msg)
    is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
    if method == "function_calling":
        tool = convert_to_openai_tool(schema)
        name = tool["function"]["name"]
        fmt = {"kwargs": {"method": method}, "schema": tool}
        llm = model.bind_tools([schema], tool_choice=name, ls_structured_output_format=fmt)
        parser: Runnable = (
            PydanticToolsParser(tools=[schema], first_tool_only=True)
            if is_pydantic
            else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
        )
    elif method in ("json_schema", "json_mode"):
        json_schema = {"type": "object"} if schema is None else convert_to_json_schema(schema)
        # json_mode's answer is a JSON object; the engine can hold it to the schema too, so it does.
        fmt = {"kwargs": {"method": method}, "schema": json_schema if method == "json_schema" else schema}
        llm = model.bind(
            json_schema={**close_objects(json_schema), **COMPACT}, ls_structured_output_format=fmt
        )
        parser = PydanticOutputParser(pydantic_object=schema) if is_pydantic else JsonOutputParser()
    else:
        msg = f"method must be 'json_schema', 'function_calling' or 'json_mode', not {method!r}."
        raise ValueError(msg)
    parser = RunnableGenerator(_complete, _acomplete, name="complete_answer") | parser
    if not include_raw:
        return llm | parser
    parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
    none = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=llm) | parsed.with_fallbacks([none], exception_key="parsing_error")
