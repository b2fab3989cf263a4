"""The server's constrained output over real HTTP: llama.cpp's grammar (GBNF) and json_schema on /completion
and /infill, OpenAI's response_format, tools and tool_choice on /v1/chat/completions (the official openai
client and langchain-openai's ChatOpenAI as clients), and a bad grammar or schema as a 400 before any
decoding. The chat checkpoint has random weights: the shape is enforced, the values are the model's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from adversarial_grammars import ref_chain, rule_chain
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from langchain_starcoder import StarCoderEngine
from langchain_starcoder import _registry as registry
from langchain_starcoder.server import create_app
from langchain_starcoder.testing.servers import ServerThread, free_port, wait_healthy

# Bounded, so that random weights finish inside max_tokens.
DIGITS = 'root ::= ("yes" | "no") " " [0-9] [0-9]?'
POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}},
    "required": ["x", "ok"],
    "additionalProperties": False,
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 99},
                "b": {"type": "integer", "minimum": 0, "maximum": 99},
            },
            "required": ["a", "b"],
        },
    },
}
ARGUMENTS = {**ADD["function"]["parameters"], "additionalProperties": False}
QUESTION = [{"role": "user", "content": "What is 1 + 2?"}]


@pytest.fixture(scope="module")
def chat_engine(chat_path) -> StarCoderEngine:
    return registry.get_engine(chat_path)


@pytest.fixture(scope="module")
def server(chat_engine: StarCoderEngine) -> Iterator[str]:
    running = ServerThread(create_app(chat_engine, model_name="chat"))
    yield running.url
    running.stop()


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=60)


def ask(client: openai.OpenAI, **request: Any) -> Any:
    """A greedy chat completion (this server samples by default, as OpenAI does)."""
    return client.chat.completions.create(model="chat", temperature=0, **{"messages": QUESTION, **request})


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url, json=body, timeout=60)


def events(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    reply = post(url, {**body, "stream": True})
    assert reply.status_code == 200, reply.text
    return [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]


# --- llama.cpp's /completion and /infill ------------------------------------------------------------------


def test_completion_follows_a_gbnf_grammar(server: str) -> None:
    body = {"prompt": "Answer: ", "n_predict": 16, "grammar": DIGITS}
    answer = post(f"{server}/completion", body).json()
    assert re.fullmatch(r"(yes|no) [0-9][0-9]?", answer["content"]) and answer["stop_type"] == "eos"
    streamed = events(f"{server}/completion", body)
    assert "".join(e["content"] for e in streamed) == answer["content"]


def test_completion_and_infill_follow_a_json_schema(server: str) -> None:
    answer = post(f"{server}/completion", {"prompt": "{", "n_predict": 200, "json_schema": POINT}).json()
    jsonschema.validate(json.loads(answer["content"]), POINT)
    infill = {"input_prefix": "point = ", "input_suffix": "\nprint(point)\n", "n_predict": 200}
    middle = post(f"{server}/infill", {**infill, "json_schema": POINT}).json()["content"]
    jsonschema.validate(json.loads(middle), POINT)
    middle = post(f"{server}/infill", {**infill, "grammar": DIGITS}).json()["content"]
    assert re.fullmatch(r"(yes|no) [0-9][0-9]?", middle)


def test_an_answer_cut_by_n_predict_says_so(server: str) -> None:
    answer = post(f"{server}/completion", {"prompt": "{", "n_predict": 3, "json_schema": POINT}).json()
    assert answer["stop_type"] == "limit" and answer["tokens_predicted"] == 3
    with pytest.raises(json.JSONDecodeError):
        json.loads(answer["content"])


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"grammar": "root ::= [a-z"}, "grammar"),
        ({"grammar": "start: undefined_rule"}, "grammar"),
        (
            {"json_schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}},
            "json_schema",
        ),
        ({"json_schema": "{not json"}, "json_schema"),
        ({"grammar": DIGITS, "json_schema": POINT}, "at most one"),
    ],
)
def test_a_bad_grammar_or_schema_is_a_400_before_decoding(server: str, extra: dict, says: str) -> None:
    for path, body in (("/completion", {"prompt": "x"}), ("/infill", {"input_prefix": "x = "})):
        for stream in (False, True):
            reply = post(f"{server}{path}", {**body, "n_predict": 4, "stream": stream, **extra})
            assert reply.status_code == 400, reply.text
            assert says in reply.json()["error"]["message"]
    # The server is still fine.
    assert post(f"{server}/completion", {"prompt": "x", "n_predict": 2}).status_code == 200


def test_no_grammar_or_schema_crashes_the_server(chat_path: Path, tmp_path: Path) -> None:
    """The review's chains of $refs and of rules overflowed llguidance's stack: the server died (SIGSEGV)
    and every client with it. A ``serve`` process here, so that a regression kills it, not pytest."""
    port = free_port()
    serve = [sys.executable, "-m", "langchain_starcoder", "serve", "--model", str(chat_path)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([*serve, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deep = {"type": "json_schema", "json_schema": {"name": "d", "schema": ref_chain(3000)}}
    refused = [
        ("/completion", {"prompt": "x", "json_schema": ref_chain(3000)}),
        ("/completion", {"prompt": "x", "grammar": rule_chain(12_000), "stream": True}),
        ("/infill", {"input_prefix": "x = ", "grammar": rule_chain(4000, gbnf=True)}),
        ("/v1/completions", {"prompt": "x", "structured_outputs": {"grammar": rule_chain(12_000)}}),
        ("/v1/completions", {"prompt": "x", "response_format": deep}),
        ("/v1/chat/completions", {"messages": QUESTION, "response_format": deep}),
    ]
    try:
        wait_healthy(proc, url)
        for path, body in refused:
            reply = post(f"{url}{path}", {"n_predict": 4, "max_tokens": 4, **body})
            assert reply.status_code == 400, (path, reply.text[:300])
            assert "too deep to compile safely" in reply.text or "GBNF rules" in reply.text, reply.text[:300]
        # The review's own inputs (2,000 links, 5,000 rules) compile; decoding them may meet a per-step
        # limit (the answer says so), never the stack.
        for body in ({"json_schema": ref_chain(2000)}, {"grammar": rule_chain(5000)}):
            assert post(f"{url}/completion", {"prompt": "x", "n_predict": 4, **body}).status_code in (
                200,
                400,
            )
        answer = post(f"{url}/completion", {"prompt": "{", "n_predict": 200, "json_schema": POINT}).json()
        jsonschema.validate(json.loads(answer["content"]), POINT)
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


# --- /v1/completions: the same constraints, in llama.cpp's, OpenAI's and vLLM's fields -----------------

CHOICES = ["yes", "no", "a.b (c)*"]  # (regex metacharacters: matched as text)


def _json_point(text: str) -> None:
    jsonschema.validate(json.loads(text), POINT)


def _compact_point(text: str) -> None:
    _json_point(text)
    assert text == json.dumps(json.loads(text), separators=(",", ":"))


def _matches(pattern: str) -> Any:
    def check(text: str) -> None:
        assert re.fullmatch(pattern, text), text

    return check


def _one_of(text: str) -> None:
    assert text in CHOICES, text


@pytest.mark.parametrize(
    ("constraint", "check"),
    [
        ({"grammar": DIGITS}, _matches(r"(yes|no) [0-9][0-9]?")),
        ({"json_schema": POINT}, _compact_point),  # (compact by default, on every path)
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": POINT}}},
            _compact_point,
        ),
        ({"structured_outputs": {"json": json.dumps(POINT)}}, _compact_point),
        ({"structured_outputs": {"json": POINT, "disable_any_whitespace": True}}, _compact_point),
        ({"structured_outputs": {"regex": r"(yes|no) [0-9]"}}, _matches(r"(yes|no) [0-9]")),
        ({"structured_outputs": {"grammar": DIGITS}}, _matches(r"(yes|no) [0-9][0-9]?")),
        ({"structured_outputs": {"choice": CHOICES}}, _one_of),
    ],
    ids=[
        "grammar",
        "json_schema",
        "response_format",
        "so-json",
        "so-compact",
        "so-regex",
        "so-grammar",
        "choice",
    ],
)
def test_v1_completions_follow_a_constraint(server: str, constraint: dict, check: Any) -> None:
    url = f"{server}/v1/completions"
    body = {"model": "chat", "prompt": "Answer: ", "max_tokens": 200, "temperature": 0, **constraint}
    [whole] = post(url, body).json()["choices"]
    assert whole["finish_reason"] == "stop", whole
    check(whole["text"])
    streamed = events(url, body)
    assert "".join(e["choices"][0]["text"] for e in streamed if e["choices"]) == whole["text"]
    # Sampled, several prompts (one batch), and a FIM middle (suffix) follow it too.
    sampled = post(url, {**body, "prompt": ["x = ", "def f():"], "temperature": 1.0, "seed": 3}).json()
    assert [c["finish_reason"] for c in sampled["choices"]] == ["stop", "stop"]
    for choice in sampled["choices"]:
        check(choice["text"])
    [middle] = post(url, {**body, "prompt": "point = ", "suffix": "\nprint(point)\n"}).json()["choices"]
    assert middle["finish_reason"] == "stop", middle
    check(middle["text"])


def test_v1_completions_cut_by_max_tokens_says_so(server: str) -> None:
    body = {"model": "chat", "prompt": "{", "max_tokens": 3, "json_schema": POINT}
    [choice] = post(f"{server}/v1/completions", body).json()["choices"]
    assert choice["finish_reason"] == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice["text"])


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (
            {"json_schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}},
            "json_schema",
        ),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}}, "json_schema"),
        ({"structured_outputs": {"json": {"type": "object", "required": 3}}}, "json_schema"),
        ({"structured_outputs": {"json": "{not json", "disable_any_whitespace": True}}, "invalid JSON"),
        ({"structured_outputs": {"regex": "(unclosed"}}, "regex"),
        ({"structured_outputs": {"grammar": "root ::= [a-z"}}, "grammar"),
        ({"structured_outputs": {"choice": []}}, "choice"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "does not take structural_tag"),
        ({"structured_outputs": {"json": POINT, "regex": "a"}}, "not several"),
        ({"grammar": DIGITS, "json_schema": POINT}, "at most one"),
        ({"grammar": DIGITS, "response_format": {"type": "json_object"}}, "at most one constraint"),
    ],
)
def test_v1_completions_refuse_a_bad_constraint_before_decoding(server: str, extra: dict, says: str) -> None:
    for stream in (False, True):
        body = {"model": "chat", "prompt": "x = ", "max_tokens": 4, "stream": stream, **extra}
        reply = post(f"{server}/v1/completions", body)
        assert reply.status_code == 400, reply.text
        assert says in reply.json()["error"]["message"], reply.text
    assert post(f"{server}/v1/completions", {"prompt": "x", "max_tokens": 2}).status_code == 200


# --- /v1/chat/completions ---------------------------------------------------------------------------------


def test_response_format_json_schema_and_json_object(client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "point", "schema": POINT, "strict": True}}
    answer = ask(client, max_tokens=200, response_format=fmt)
    assert answer.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(answer.choices[0].message.content), POINT)
    answer = ask(client, max_tokens=200, response_format={"type": "json_object"})
    value = json.loads(answer.choices[0].message.content) if answer.choices[0].finish_reason == "stop" else {}
    assert isinstance(value, dict)


def test_tools_give_tool_calls(client: openai.OpenAI) -> None:
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        answer = ask(client, max_tokens=64, tools=[ADD], tool_choice=choice)
        assert answer.choices[0].finish_reason == "tool_calls"
        message = answer.choices[0].message
        [call] = message.tool_calls
        assert call.type == "function" and call.function.name == "add" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), ARGUMENTS)
        assert message.content is None


def test_streamed_tool_calls_match(client: openai.OpenAI) -> None:
    whole = ask(client, max_tokens=64, tools=[ADD], tool_choice="required")
    stream = ask(client, max_tokens=64, tools=[ADD], tool_choice="required", stream=True)
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    calls = [call for d in deltas for call in d.tool_calls or []]
    assert [(c.index, c.function.name, c.function.arguments) for c in calls] == [
        (0, "add", whole.choices[0].message.tool_calls[0].function.arguments)
    ]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_a_call_cut_short_is_no_call(client: openai.OpenAI) -> None:
    answer = ask(client, max_tokens=5, tools=[ADD], tool_choice="required")
    choice = answer.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert choice.message.content.startswith('{"name":')  # what was written, as text


def test_a_conversation_with_calls_and_results(client: openai.OpenAI, chat_engine, backend_spy) -> None:
    messages = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    spy = backend_spy(chat_engine)
    ask(client, messages=messages, max_tokens=4, tools=[ADD])
    # The prompt holds the call as the model writes one, and the result under the tool's name.
    prompt = chat_engine.decode(spy.take()[0])
    assert '### Response\n<tool_call>{"name":"add","arguments":{"a":1,"b":2}}' in prompt
    assert "The tool add (call c1) returned:\n3" in prompt


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "name"),
        ({"tools": [ADD], "tool_choice": "sub"}, "tool_choice"),
        ({"tool_choice": "required"}, "needs tools"),
        ({"tools": [ADD], "tool_choice": "required", "response_format": {"type": "json_object"}}, "not both"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}}, "json_schema"),
        ({"tools": ["add"]}, "tool"),
    ],
)
def test_bad_tools_and_formats_are_400s(server: str, extra: dict, says: str) -> None:
    for stream in (False, True):
        reply = post(
            f"{server}/v1/chat/completions",
            {"messages": QUESTION, "max_tokens": 4, "stream": stream, **extra},
        )
        assert reply.status_code == 400, reply.text
        assert says in reply.json()["error"]["message"]


def test_langchain_openai_tools_and_structured_output(server: str) -> None:
    """langchain-openai's ChatOpenAI, pointed at this server, binds tools and gets structured output."""

    class Add(BaseModel):
        """Add two numbers."""

        a: int = Field(ge=0, le=99)
        b: int = Field(ge=0, le=99)

    chat = ChatOpenAI(base_url=f"{server}/v1", api_key="unused", model="chat", max_tokens=64, temperature=0)
    message = chat.bind_tools([Add], tool_choice="Add").invoke("What is 1 + 2?")
    [call] = message.tool_calls
    assert call["name"] == "Add" and Add.model_validate(call["args"])
    point = chat.with_structured_output(Add, method="json_schema").invoke("What is 1 + 2?")
    assert isinstance(point, Add)


def test_the_docs_tools_example_runs(server: str) -> None:
    """docs/server.md's tools example, against this server."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text()
    code = re.findall(r"```py\n(.*?)```", page, flags=re.S)[1].replace("http://127.0.0.1:8080", server)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("tool_calls [") and "(id='call_" in result.stdout  # (class names vary)
