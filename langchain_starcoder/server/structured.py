"""Constrained output: llama.cpp's ``grammar`` and ``json_schema`` (``/completion``, ``/infill``,
``/v1/completions``), OpenAI's ``response_format`` (``/v1/completions`` too), ``tools`` and ``tool_choice``
(``/v1/chat/completions``) and vLLM's ``structured_outputs`` (``/v1/completions``) as engine settings and a
tool plan, and answers with tool calls in OpenAI's shapes, whole or streamed.

A grammar or schema the engine cannot compile is a 400 before any decoding (the engine raises
``GrammarError``). OpenAI's ``parallel_tool_calls`` defaults to true; here an answer makes one call unless
it is set true (then the answer is a list of calls), because a model that must also decide when a list
ends is the less reliable one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .._tools import COMPACT, InvalidToolCall, ToolCall, ToolPlan, call_text, plan_of, result_text
from ..types import Completion, CompletionChunk
from .errors import bad_request
from .limits import check_count
from .parsing import field, message_content, text

#: Tools of one request (OpenAI's own limit).
MAX_TOOLS = 128
#: Choices of one ``structured_outputs`` choice.
MAX_CHOICES = 10_000


def llama_constraint(body: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's ``grammar`` (GBNF; Lark in llguidance's dialect also reads) or ``json_schema`` (``{}``
    is any JSON) as engine settings; an empty grammar is none, as in llama.cpp."""
    settings: dict[str, Any] = {}
    grammar = field(body, "grammar", str, "")
    if grammar:
        settings["grammar"] = grammar
    if body.get("json_schema") is not None:
        settings["json_schema"] = field(body, "json_schema", (dict, str))
    return settings


def response_format(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's ``response_format`` as engine settings: ``json_schema`` (its ``schema``), ``json_object``
    (any JSON object) or ``text`` (none)."""
    fmt = body.get("response_format")
    if fmt is None:
        return {}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_schema": {"type": "object"}}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            msg = 'response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}.'
            raise bad_request(msg, "response_format")
        return {"json_schema": schema}
    msg = 'response_format must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", ...}.'
    raise bad_request(msg, "response_format")


#: vLLM's ``structured_outputs`` fields that this server reads (each as the engine setting it becomes).
STRUCTURED_OUTPUTS = ("json", "regex", "grammar", "choice", "json_object", "disable_any_whitespace")


def completions_constraint(body: dict[str, Any]) -> dict[str, Any]:
    """A ``/v1/completions`` request's constraint as engine settings: llama.cpp's ``grammar`` or
    ``json_schema``, OpenAI's ``response_format`` or vLLM's ``structured_outputs``, one of them."""
    given = {
        name: settings
        for name, settings in (
            ("grammar", llama_constraint(body)),  # (the engine refuses grammar and json_schema together)
            ("response_format", response_format(body)),
            ("structured_outputs", structured_outputs(body)),
        )
        if settings
    }
    if len(given) > 1:
        names = " and ".join("grammar/json_schema" if n == "grammar" else n for n in given)
        raise bad_request(f"Give at most one constraint, not {names}.", next(iter(given)))
    return next(iter(given.values()), {})


def structured_outputs(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``structured_outputs`` (``json``, ``regex``, ``grammar``, ``choice`` or ``json_object``) as
    engine settings. JSON is compact here by default (no whitespace between tokens); a schema asks for
    whitespace with its own ``"x-guidance": {"whitespace_flexible": true}``, which vLLM's
    ``disable_any_whitespace`` overrides (compact again), as it does in vLLM."""
    spec = field(body, "structured_outputs", dict, {})
    where = "structured_outputs"
    unknown = sorted(set(spec) - set(STRUCTURED_OUTPUTS))
    if unknown:
        msg = f"{where} does not take {', '.join(unknown)} here; it takes {', '.join(STRUCTURED_OUTPUTS)}."
        raise bad_request(msg, where)
    kinds = [k for k in STRUCTURED_OUTPUTS[:-1] if spec.get(k) not in (None, False)]
    if len(kinds) > 1:
        raise bad_request(f"{where} takes one of {', '.join(kinds)}, not several.", where)
    if not kinds:
        return {}
    kind, value = kinds[0], spec[kinds[0]]
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise bad_request(f"{where} choice must be a non-empty list of strings.", where)
        check_count(value, MAX_CHOICES, "choices", where)
        return {"regex": "(?:" + "|".join(map(_literal_regex, value)) + ")"}
    if kind in ("regex", "grammar"):
        return {kind: text(value, f"{where} {kind}")}
    schema = {"type": "object"} if kind == "json_object" else value
    if spec.get("disable_any_whitespace"):  # llguidance's option in the schema, as our tool calls use it
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except (json.JSONDecodeError, RecursionError) as e:
                raise bad_request(f"{where} json is invalid JSON: {e}.", where) from None
        if not isinstance(schema, dict):
            raise bad_request(f"{where} json must be a JSON Schema object.", where)
        schema = {**schema, **COMPACT}
    return {"json_schema": schema}


def _literal_regex(choice: str) -> str:
    """``choice`` as a regex that matches it alone (ASCII but letters, digits and ``_`` escaped)."""
    escaped = (c if c.isalnum() or c == "_" or not c.isascii() else f"\\x{{{ord(c):02X}}}" for c in choice)
    return "".join(escaped)


def tool_plan(body: dict[str, Any]) -> ToolPlan | None:
    """The plan of a chat request's ``tools``, ``tool_choice`` and ``parallel_tool_calls`` (None without
    tools); errors in them are 400s that say what is wrong."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("tools must be a list of {type: function, function: {...}} objects.", "tools")
    if tools:
        check_count(tools, MAX_TOOLS, "tools", "tools")
    parallel = field(body, "parallel_tool_calls", bool, False)
    return plan_of(tools, body.get("tool_choice"), parallel)


def chat_turns(messages: Sequence[Any], roles: frozenset[str]) -> list[tuple[str, str]]:
    """OpenAI's messages as ``(role, content)`` turns for a template that knows ``roles``: an assistant's
    ``tool_calls`` as the text it writes for them, a tool's result in a "tool" turn, or a user turn
    (naming the tool) where the template has none."""
    names: dict[str, str] = {}  # call id -> tool name, for the results
    turns = []
    for message in messages:
        role = text(message.get("role") if isinstance(message, dict) else None, "role")
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls:
            content = message_content(message) if message.get("content") is not None else ""
            pairs = [_call(c, names) for c in calls] if isinstance(calls, list) else _bad_calls()
            content = f"{content}\n{call_text(pairs)}" if content else call_text(pairs)
        elif role == "tool":
            content = message_content(message)
            if "tool" not in roles:
                call_id = message.get("tool_call_id")
                role, content = "user", result_text(content, names.get(call_id), call_id)
        else:
            content = message_content(message)
        turns.append((role, content))
    return turns


def _call(call: Any, names: dict[str, str]) -> tuple[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        _bad_calls()
    arguments = function.get("arguments") or "{}"
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError as e:
        msg = f"The arguments of a tool call of {function['name']!r} are not JSON: {e}."
        raise bad_request(msg, "messages") from e
    if isinstance(call.get("id"), str):
        names[call["id"]] = function["name"]
    return function["name"], parsed


def _bad_calls() -> Any:
    msg = "An assistant message's tool_calls must be [{id, type: function, function: {name, arguments}}]."
    raise bad_request(msg, "messages")


class ChatAnswer:
    """An answer in OpenAI's chat shapes: with a tool plan, its calls as ``tool_calls`` (each when its JSON
    closes, when streamed) and ``finish_reason`` "tool_calls"; a call cut short stays text, never a call."""

    def __init__(self, plan: ToolPlan | None) -> None:
        self._reader = plan.reader() if plan is not None else None
        self._streamed = 0  # calls streamed so far

    def message(self, done: Completion) -> tuple[dict[str, Any], str]:
        """The whole answer's message and finish reason."""
        if self._reader is None:
            return {"role": "assistant", "content": done.text}, done.finish_reason
        content, calls = self._reader.feed(done.text)
        rest, invalid = self._reader.end()
        content += rest + _raw(invalid)
        message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
        if calls:
            message["tool_calls"] = [_openai(c) for c in calls]
        return message, _finish(done.finish_reason, calls)

    def deltas(self, chunk: CompletionChunk) -> tuple[list[dict[str, Any]], str | None]:
        """A streamed chunk's deltas (content, then calls) and, on the last, the finish reason."""
        last = chunk.finish_reason is not None
        if self._reader is None:
            return ([{"content": chunk.text}] if chunk.text or last else []), chunk.finish_reason
        content, calls = self._reader.feed(chunk.text)
        if last:
            rest, invalid = self._reader.end()
            content += rest + _raw(invalid)
        deltas = [{"content": content}] if content else []
        if calls:
            indexed = [{"index": self._streamed + i, **_openai(c)} for i, c in enumerate(calls)]
            deltas.append({"tool_calls": indexed})
            self._streamed += len(calls)
        if last and not deltas:
            deltas = [{}]
        return deltas, (_finish(chunk.finish_reason, self._streamed) if last else None)


def _openai(call: ToolCall) -> dict[str, Any]:
    function = {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}
    return {"id": call.id, "type": "function", "function": function}


def _raw(invalid: Sequence[InvalidToolCall]) -> str:
    return "".join(c.text for c in invalid)


def _finish(reason: str | None, calls: Any) -> str:
    return "tool_calls" if calls and reason == "stop" else reason or "stop"
