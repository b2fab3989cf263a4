"""Tool calls and structured output as constrained decoding: what a request's tools make of generation
settings, what the prompt tells the model, and what the model wrote, read back as calls.

StarCoder2 was not trained for tool calling, so the format is ours and decoding enforces it: a call is
``{"name": <tool>, "arguments": {...}}`` with each tool's own argument schema. With ``tool_choice``
"required" (or a tool's name) the whole answer is the call, decoded under its JSON schema; with "auto"
a grammar lets the model either answer in text or write :data:`MARKER` and then the call. The same
settings reach a remote server (vLLM, llama.cpp), which enforces them itself.

A call is only ever reported once its JSON is complete: an answer cut by ``max_tokens`` (or a stop
string) inside a call is reported as an invalid call with its raw text, never as a call.

Shared by the LangChain and LlamaIndex chat classes and the server's OpenAI ``tools``. Pure: it imports
nothing from the package but its values and errors.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import InvalidParameterError

#: What the model writes before a call when it may also answer in text (``tool_choice="auto"``).
MARKER = "<tool_call>"

#: JSON without whitespace between its tokens, so that a model cannot pad a call or an answer (llguidance's
#: options; other engines ignore the key).
COMPACT = {"x-guidance": {"whitespace_flexible": False, "whitespace_pattern": None}}

ToolMode = Literal["none", "auto", "required"]


@dataclass(frozen=True)
class Tool:
    """One tool the model may call: its name, what it does, and the JSON schema of its arguments."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    @classmethod
    def from_openai(cls, spec: Any) -> Tool:
        """A tool from OpenAI's ``{"type": "function", "function": {name, description, parameters}}``
        (what LangChain's ``convert_to_openai_tool`` and LlamaIndex's ``to_openai_tool`` give)."""
        function = spec.get("function") if isinstance(spec, Mapping) else None
        if not isinstance(spec, Mapping) or spec.get("type", "function") != "function" or not function:
            msg = (
                'A tool must be {"type": "function", "function": {"name": ..., "parameters": {...}}}, '
                f"not {str(spec)[:200]}."
            )
            raise InvalidParameterError(msg)
        name = function.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            msg = f"A tool's name must be a non-empty string of at most 64 characters, not {name!r}."
            raise InvalidParameterError(msg)
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object":
            shown = str(parameters)[:200]
            msg = f"The parameters of tool {name!r} must be a JSON schema of an object, not {shown}."
            raise InvalidParameterError(msg)
        description = function.get("description") or ""
        if not isinstance(description, str):
            msg = f"The description of tool {name!r} must be a string."
            raise InvalidParameterError(msg)
        return cls(name, description, dict(parameters))

    def openai(self) -> dict[str, Any]:
        """OpenAI's form of the tool (what chat templates that read ``tools`` expect)."""
        function = {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolCall:
    """A complete call the model made: its arguments match the tool's schema."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class InvalidToolCall:
    """What the model wrote where a call was due but did not complete (``max_tokens`` or a stop string
    cut it), or that is not a call of one of the tools."""

    id: str
    text: str
    error: str


@dataclass(frozen=True)
class Reply:
    """An answer read back: its text, the calls it made, and the call it left incomplete, if any."""

    content: str
    calls: list[ToolCall]
    invalid: list[InvalidToolCall]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


# --- tool_choice -------------------------------------------------------------------------------------


class ToolPlan:
    """What a request's ``tools`` and ``tool_choice`` make: the generation settings that constrain the
    answer, the instructions the prompt gives, and the reading of the answer.

    ``tool_choice``: "auto" (None): text or a call; "none": text; "required", "any" or True: a call of
    any tool; a tool's name, ``{"type": "function", "function": {"name": ...}}`` or
    ``{"type": "tool", "name": ...}``: a call of that tool. ``parallel``: the call may be a JSON list of
    calls (one at least) instead of one.
    """

    def __init__(self, tools: Sequence[Tool], tool_choice: Any = None, *, parallel: bool = False) -> None:
        names = [t.name for t in tools]
        self.tools = tuple(tools)
        self.parallel = bool(parallel)
        self.mode, chosen = _resolve_choice(tool_choice, names)
        self.allowed = tuple(t for t in self.tools if chosen is None or t.name == chosen)
        if self.mode != "none" and not self.tools:
            msg = f"tool_choice={tool_choice!r} needs at least one tool."
            raise InvalidParameterError(msg)

    def settings(self) -> dict[str, Any]:
        """The generation settings that make the answer a call (or text, or either)."""
        if self.mode == "none":
            return {}
        if self.mode == "required":
            return {"json_schema": self.call_schema()}
        schema = json.dumps(self.call_schema(), ensure_ascii=False)
        # Text that does not begin with the marker, or the marker and a complete call (llguidance's Lark).
        grammar = (
            f'start: TEXT | "{MARKER}" call\ncall: %json {schema}\nTEXT: /(?s:.*)/ & ~/{MARKER}(?s:.*)/\n'
        )
        return {"grammar": grammar}

    def call_schema(self) -> dict[str, Any]:
        """The JSON schema of what the model writes as its call(s)."""
        defs: dict[str, Any] = {}
        options = []
        for tool in self.allowed:
            arguments, hoisted = _hoisted(close_objects(tool.parameters), f"{tool.name}.")
            defs.update(hoisted)
            options.append(
                {
                    "type": "object",
                    "properties": {"name": {"const": tool.name}, "arguments": arguments},
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
            )
        call = options[0] if len(options) == 1 else {"anyOf": options}
        schema = {"type": "array", "items": call, "minItems": 1} if self.parallel else dict(call)
        return {**schema, **({"$defs": defs} if defs else {}), **COMPACT}

    def instructions(self, list_tools: bool = True) -> str:
        """What the prompt tells the model about the tools (``list_tools=False``: the chat template
        lists them itself) and the format of a call."""
        listed = "\n".join(
            json.dumps(
                {"name": t.name, "description": t.description, "parameters": t.parameters}, ensure_ascii=False
            )
            for t in self.allowed
        )
        shape = '{"name": <tool name>, "arguments": <its arguments>}'
        call = f"a JSON list of calls, each {shape}" if self.parallel else f"one JSON object {shape}"
        if self.mode == "auto":
            how = f"To call a tool, answer with {MARKER} followed by {call}. Otherwise answer in text."
        else:
            how = f"Answer with {call}, and nothing else."
        if not list_tools:
            return how
        return f"You can call these tools (each with the JSON schema of its arguments):\n{listed}\n\n{how}"

    def reader(self) -> ReplyReader:
        return ReplyReader(self)

    def read(self, text: str) -> Reply:
        """A whole answer read back (what :class:`ReplyReader` makes of it in one piece)."""
        reader = self.reader()
        content, calls = reader.feed(text)
        rest, invalid = reader.end()
        return Reply(content + rest, calls, invalid)


def _resolve_choice(choice: Any, names: Sequence[str]) -> tuple[ToolMode, str | None]:
    if choice is None or choice == "auto":
        return "auto", None
    if choice == "none" or choice is False:
        return "none", None
    if choice in ("required", "any") or choice is True:
        return "required", None
    name = choice
    if isinstance(choice, Mapping):  # OpenAI's {"type": "function", "function": {...}}, Anthropic's {"name"}
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else choice.get("name")
    if isinstance(name, str) and name in names:
        return "required", name
    msg = (
        f"tool_choice must be 'auto', 'none', 'required' ('any'), or the name of one of the tools "
        f"{list(names)}, not {choice!r}."
    )
    raise InvalidParameterError(msg)


def plan_of(tools: Sequence[Any] | None, tool_choice: Any = None, parallel: Any = False) -> ToolPlan | None:
    """The plan of OpenAI-style ``tools`` and ``tool_choice`` (None without tools)."""
    if not tools:
        if tool_choice not in (None, "auto", "none"):
            msg = f"tool_choice={tool_choice!r} needs tools to choose from; give tools too."
            raise InvalidParameterError(msg)
        return None
    return ToolPlan([Tool.from_openai(t) for t in tools], tool_choice, parallel=bool(parallel))


#: The settings that constrain decoding: a tool plan's constraint replaces them all.
CONSTRAINTS = ("json_schema", "regex", "grammar")


def constrained(settings: Mapping[str, Any], plan: ToolPlan | None) -> dict[str, Any]:
    """``settings`` with the plan's constraint instead of any other (a plan without one leaves them)."""
    extra = plan.settings() if plan is not None else {}
    if not extra:
        return dict(settings)
    return {**{k: v for k, v in settings.items() if k not in CONSTRAINTS}, **extra}


# --- JSON schemas ----------------------------------------------------------------------------------


def close_objects(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` whose objects with ``properties`` take only those (``additionalProperties``
    false where it is not set), as OpenAI's strict mode does: a tool takes the arguments it declares, and
    a model cannot invent properties without end."""

    def close(out: dict[str, Any]) -> dict[str, Any]:
        if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
            out["additionalProperties"] = False
        return out

    return _each_object(copy.deepcopy(dict(schema)), close)


def _each_object(node: Any, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """``node`` with ``change`` applied to each object in it, inner ones first (a new object of the
    rewritten values is what ``change`` gets; lists are walked, other values kept)."""
    if isinstance(node, list):
        return [_each_object(item, change) for item in node]
    if not isinstance(node, dict):
        return node
    return change({key: _each_object(value, change) for key, value in node.items()})


def _hoisted(schema: dict[str, Any], prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``schema`` without its ``$defs``/``definitions``, and those under names that begin with
    ``prefix``: nested in a larger schema, its local references ("#/$defs/X") point to the new root's."""
    body = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}
    defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    whole = f"{prefix}self"

    def rewrite(out: dict[str, Any]) -> dict[str, Any]:
        ref = out.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            path = ref[1:].lstrip("/")
            for root in ("$defs/", "definitions/"):
                if path.startswith(root):
                    out["$ref"] = f"#/$defs/{prefix}{path[len(root) :]}"
                    break
            else:  # a pointer into the schema itself: to its copy among the definitions
                out["$ref"] = f"#/$defs/{whole}" + (f"/{path}" if path else "")
                needs_whole[0] = True
        return out

    needs_whole = [False]
    new_body = _each_object(body, rewrite)
    hoisted = {f"{prefix}{name}": _each_object(value, rewrite) for name, value in defs.items()}
    if needs_whole[0]:
        hoisted[whole] = new_body
    return new_body, hoisted


# --- reading an answer -------------------------------------------------------------------------------


class ReplyReader:
    """Reads an answer as it streams: text pieces are shown at once, and each call is given when its
    JSON closes. With "auto", text that may still become :data:`MARKER` is held back until it cannot.

    Each piece of text costs one pass over its characters (a call's braces and strings are tracked,
    never re-parsed).
    """

    def __init__(self, plan: ToolPlan) -> None:
        self._names = {t.name for t in plan.allowed}
        self._state = {"none": "text", "auto": "undecided", "required": "calls"}[plan.mode]
        self._held = ""  # "undecided": the text so far; "calls": the call being read
        self._calls_text = ""  # all the text of the calls, for the report of an incomplete one
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._call_depth: int | None = None  # 0: the answer is one call object; 1: a list of them
        self._closed = False  # the calls' JSON value has ended
        self._invalid: list[InvalidToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """The text to show now and the calls that ``text`` completes."""
        if self._state == "text":
            return text, []
        if self._state == "undecided":
            self._held += text
            if self._held.startswith(MARKER):
                rest, self._held = self._held[len(MARKER) :], ""
                self._state = "calls"
                return "", self._scan(rest)
            if MARKER.startswith(self._held):
                return "", []  # may still become the marker
            shown, self._held = self._held, ""
            self._state = "text"
            return shown, []
        return "", self._scan(text)

    def end(self) -> tuple[str, list[InvalidToolCall]]:
        """What is left at the end: held text, and what was not a complete call (reported invalid)."""
        if self._state == "undecided":
            shown, self._held = self._held, ""
            return shown, []
        if self._state == "calls" and not self._closed:
            if self._calls_text.strip():
                error = "The tool call is incomplete: the answer ended inside it (max_tokens, a stop string)."
            else:
                error = "The answer ended before its tool call began (max_tokens or a stop string)."
            self._invalid.append(InvalidToolCall(new_call_id(), self._calls_text, error))
        elif self._state == "calls" and self._held.strip():
            self._invalid.append(InvalidToolCall(new_call_id(), self._held, "Text follows the tool call(s)."))
        return "", self._invalid

    def _scan(self, text: str) -> list[ToolCall]:
        """Track JSON nesting over ``text``; each object that closes at the calls' depth is a call."""
        calls: list[ToolCall] = []
        self._calls_text += text
        for char in text:
            self._held += char
            if self._closed:
                continue
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                if self._call_depth is None:
                    self._call_depth = 0 if char == "{" else 1
                    if char == "[":
                        self._held = ""  # the list's bracket is not part of a call
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if char == "}" and self._depth == self._call_depth:
                    call = self._call(self._held.strip())
                    calls += [call] if call is not None else []
                    self._held = ""
                if self._depth <= 0:
                    self._closed = True
                    self._held = ""
            elif char == "," and self._call_depth == 1 and self._depth == 1:
                self._held = ""  # between two calls of the list
        return calls

    def _call(self, text: str) -> ToolCall | None:
        """The call ``text`` makes; anything else (only possible without the constraint, e.g. on a
        server that ignored it) is kept to be reported invalid."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            error = f"The tool call is not valid JSON: {e}."
            self._invalid.append(InvalidToolCall(new_call_id(), text, error))
            return None
        name = value.get("name") if isinstance(value, dict) else None
        arguments = value.get("arguments") if isinstance(value, dict) else None
        if name not in self._names or not isinstance(arguments, dict):
            error = f"Not a call of one of the tools {sorted(self._names)}."
            self._invalid.append(InvalidToolCall(new_call_id(), text, error))
            return None
        return ToolCall(new_call_id(), name, arguments)


# --- the history of a conversation with tools ----------------------------------------------------------


def call_text(calls: Iterable[tuple[str, Mapping[str, Any]]], parallel: bool = False) -> str:
    """The text of an assistant turn's calls (``(name, arguments)`` pairs) as the model writes them
    with "auto": the marker, then the call (or a list of them)."""
    objects = [{"name": name, "arguments": dict(arguments)} for name, arguments in calls]
    value: Any = objects if parallel or len(objects) > 1 else objects[0]
    return MARKER + json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def result_text(content: str, name: str | None, call_id: str | None) -> str:
    """A tool's result as a user turn's text, for a chat template without a "tool" role."""
    who = f"The tool {name}" if name else "The tool"
    call = f" (call {call_id})" if call_id else ""
    return f"{who}{call} returned:\n{content}"
