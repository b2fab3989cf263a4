"""The LlamaIndex StarCoder as a function-calling, structured-prediction LLM: tool calls and
structured answers decoded under the engine's constraint, on the tiny checkpoints (random weights: the
shape is enforced, the values are the model's; arguments are bounded so that a call ends in time)."""

from __future__ import annotations

import asyncio
import json

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from pydantic import BaseModel, Field

from langchain_starcoder import _registry as registry
from langchain_starcoder._tools import MARKER
from langchain_starcoder.llama_index import StarCoder


class AddArgs(BaseModel):
    a: int = Field(ge=0, le=99)
    b: int = Field(ge=0, le=99)


def add(a: int, b: int) -> int:
    """Add a and b."""
    return a + b


ADD = FunctionTool.from_defaults(fn=add, fn_schema=AddArgs)


class Point(BaseModel):
    x: int = Field(ge=0, le=99)
    y: int = Field(ge=0, le=99)


PROMPT = PromptTemplate("A point near {place}.")


@pytest.fixture(scope="module")
def chat_engine(chat_path):
    return registry.get_engine(chat_path)


@pytest.fixture
def llm(chat_engine) -> StarCoder:
    return StarCoder(engine=chat_engine, max_tokens=48)


def calls(response) -> list[tuple[str, dict]]:
    blocks = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
    return [(b.tool_name, b.tool_kwargs) for b in blocks]


def test_a_chat_checkpoint_is_a_function_calling_model(llm, tiny_engine) -> None:
    assert llm.metadata.is_function_calling_model is True
    assert StarCoder(engine=tiny_engine).metadata.is_function_calling_model is False  # no chat template


def test_a_required_tool_call_is_a_valid_call(llm) -> None:
    response = llm.chat_with_tools([ADD], user_msg="What is 1 + 2?", tool_required=True)
    assert response.additional_kwargs["finish_reason"] == "stop"
    [selection] = llm.get_tool_calls_from_response(response)
    assert selection.tool_name == "add" and selection.tool_id.startswith("call_")
    AddArgs.model_validate(selection.tool_kwargs)
    assert set(selection.tool_kwargs) == {"a", "b"}
    [openai] = response.message.additional_kwargs["tool_calls"]  # OpenAI's shape, for other readers
    assert (
        openai["id"] == selection.tool_id
        and json.loads(openai["function"]["arguments"]) == selection.tool_kwargs
    )
    # predict_and_call runs the tool on the call's arguments.
    output = llm.predict_and_call([ADD], user_msg="What is 1 + 2?", tool_required=True)
    assert output.response == str(selection.tool_kwargs["a"] + selection.tool_kwargs["b"])


def test_without_tool_required_the_model_may_answer_in_text(llm) -> None:
    response = llm.chat_with_tools([ADD], user_msg="What is 1 + 2?")
    assert response.additional_kwargs["constrained"] is True
    # Random weights answer in text here: no call, and no error when none is required.
    assert llm.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []
    assert not (response.message.content or "").startswith(MARKER)


def test_streamed_and_async_calls_match(llm) -> None:
    expected = calls(llm.chat_with_tools([ADD], user_msg="What is 1 + 2?", tool_required=True))
    responses = list(llm.stream_chat_with_tools([ADD], user_msg="What is 1 + 2?", tool_required=True))
    assert calls(responses[-1]) == expected
    # Nothing partial: the first response is the one whose call's JSON completed; the last adds the counts.
    assert [calls(r) for r in responses] == [expected, expected]
    assert responses[-1].additional_kwargs["finish_reason"] == "stop"

    async def run() -> tuple:
        one = await llm.achat_with_tools([ADD], user_msg="What is 1 + 2?", tool_required=True)
        stream = await llm.astream_chat_with_tools([ADD], user_msg="What is 1 + 2?", tool_required=True)
        last = [r async for r in stream][-1]
        return calls(one), calls(last)

    assert asyncio.run(run()) == (expected, expected)


def test_a_call_cut_short_is_no_call(chat_engine) -> None:
    short = StarCoder(engine=chat_engine, max_tokens=6)
    response = short.chat_with_tools([ADD], user_msg="What is 1 + 2?", tool_required=True)
    assert response.additional_kwargs["finish_reason"] == "length"
    with pytest.raises(ValueError, match="incomplete"):
        short.get_tool_calls_from_response(response)
    assert short.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []
    [invalid] = response.message.additional_kwargs["invalid_tool_calls"]
    assert invalid["text"].startswith('{"name":"')


def test_the_history_holds_calls_and_results(llm, chat_engine, backend_spy) -> None:
    history = [
        ChatMessage(role=MessageRole.USER, content="What is 1 + 2?"),
        ChatMessage(
            role=MessageRole.ASSISTANT,
            blocks=[ToolCallBlock(tool_call_id="c1", tool_name="add", tool_kwargs={"a": 1, "b": 2})],
        ),
        ChatMessage(
            role=MessageRole.TOOL, content="3", additional_kwargs={"tool_call_id": "c1", "name": "add"}
        ),
    ]
    spy = backend_spy(chat_engine)
    llm.chat_with_tools([ADD], chat_history=history)
    prompt = chat_engine.decode(spy.take()[0])
    assert "You can call these tools" in prompt and '"name": "add"' in prompt
    assert f'### Response\n{MARKER}{{"name":"add","arguments":{{"a":1,"b":2}}}}' in prompt
    assert "The tool add (call c1) returned:\n3" in prompt


def test_structured_predict_follows_the_schema(llm, chat_engine, tiny_engine) -> None:
    point = llm.structured_predict(Point, PROMPT, place="the origin")
    assert isinstance(point, Point)
    streamed = list(llm.stream_structured_predict(Point, PROMPT, place="the origin"))
    assert streamed[-1] == point and len(streamed) > 1
    structured = llm.as_structured_llm(Point)
    answer = structured.chat([ChatMessage(role="user", content="A point.")])
    assert isinstance(Point.model_validate_json(answer.message.content), Point)
    # A base checkpoint (no chat template) completes under the schema.
    base = StarCoder(engine=tiny_engine, max_tokens=48)
    assert isinstance(base.structured_predict(Point, PROMPT, place="the origin"), Point)


async def test_async_structured_predict_matches_sync(llm) -> None:
    expected = llm.structured_predict(Point, PROMPT, place="the origin")
    assert await llm.astructured_predict(Point, PROMPT, place="the origin") == expected
    stream = await llm.astream_structured_predict(Point, PROMPT, place="the origin")
    assert [p async for p in stream][-1] == expected


def test_a_structured_answer_cut_short_is_an_error(chat_engine) -> None:
    short = StarCoder(engine=chat_engine, max_tokens=4)
    with pytest.raises(ValueError, match="before its JSON was complete"):
        short.structured_predict(Point, PROMPT, place="the origin")
    with pytest.raises(ValueError, match="before its JSON was complete"):
        list(short.stream_structured_predict(Point, PROMPT, place="the origin"))
