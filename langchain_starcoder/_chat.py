"""Chat prompts: a checkpoint's chat template, with message contents kept as data.

The template's own text (role headers, ``<|endoftext|>`` between turns) is encoded with control tokens
parsed; each message's content is encoded as plain text, so a message that quotes ``<|endoftext|>``
cannot end or reshape the prompt. Shared by the LangChain and LlamaIndex chat classes.

Contents: the prompt is exactly the text the template renders, or the template is refused. Why refuse a
filter (``| trim``, ``| upper``, slicing) rather than render its output: only an unchanged content can be
cut out of the rendering exactly, and starcoder2-instruct's own template inserts contents unchanged.

Roles: only the roles the template knows (user, assistant, system and those it compares a role with).
Why refuse rather than encode a role as data: templates make control tokens out of roles (Phi-3's
``'<|' + role + '|>'``), so a role is template text, safe only when the template was written for it.

Tools: a template that reads ``tools`` renders their definitions itself (template text: a definition that
holds a control-token string is refused); for any other, :func:`with_instructions` puts the tools'
instructions in a system message, or at the top of the first user message where the template refuses
system messages (starcoder2-instruct's does).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .errors import InvalidParameterError

if TYPE_CHECKING:
    from ._tools import ToolPlan
    from .engine import StarCoderEngine

_MARK = re.compile("\ue000([0-9]+)\ue001")  # private-use characters: a placeholder per message
_STANDARD_ROLES = frozenset({"system", "user", "assistant"})
# A stand-in content that common filters change: edge whitespace (trim), mixed case (upper, lower),
# tabs and newlines (replace), and length (slicing). It makes refusing a filter independent of the messages.
_PROBE = " \n\tProbe <x> & 'Ünï' " + "0123456789" * 6 + "\n "


def resolve_chat_template(engine: StarCoderEngine, override: str | None) -> str | None:
    """``override`` if given, else the checkpoint's chat template, else None."""
    if override is not None:
        return override
    return engine.tokenizer.chat_template if engine.tokenizer.has_chat_template else None


def chat_prompt_ids(
    engine: StarCoderEngine,
    messages: Sequence[tuple[str, str]],
    template: str,
    *,
    check_size: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """Token ids of ``(role, content)`` messages rendered by ``template``, ready for generation.

    The ids are those of the rendered text, except that control-token strings inside contents
    stay plain text. Raises InvalidParameterError for a role the template does not know and for a
    template that alters contents (see the module's docs), and ContextLengthError for contents too
    long for the context window (``check_size=False`` to count the tokens of any chat). ``tools``
    (OpenAI's tool definitions) go to a template that :func:`reads_tools`.
    """
    if not messages:
        msg = "A chat needs at least one message."
        raise InvalidParameterError(msg)
    roles = [role for role, _ in messages]
    _check_roles(template, roles)
    if tools:
        _check_tools_text(engine, tools)
    # The prompt holds every content unchanged (or is refused below): too long is refused unrendered.
    if check_size:
        engine.check_prompt_size(sum(len(content) for _, content in messages))
    render = functools.partial(_render, engine, template, tools=tools or None)
    pieces = _MARK.split(render([(r, f"\ue000{i}\ue001") for i, r in enumerate(roles)]))
    if sorted(int(i) for i in pieces[1::2]) != list(range(len(messages))):
        msg = (
            "The chat template drops, repeats or alters message contents, so they cannot be kept "
            "apart from its control tokens; use a template that inserts each message's content once."
        )
        raise InvalidParameterError(msg)
    # The ids below hold the placeholder rendering with each content put back; that must be exactly
    # what the template makes of the messages (and of a probe, so a filter is refused whatever the text).
    for contents in ([_PROBE] * len(messages), [content for _, content in messages]):
        filled = "".join(contents[int(p)] if i % 2 else p for i, p in enumerate(pieces))
        if render(list(zip(roles, contents, strict=True))) != filled:
            msg = (
                "The chat template alters message contents (a filter such as `| trim` or `| upper`, "
                "slicing, or a branch on a content), so the prompt could not be exactly what it renders "
                "with contents kept as data; pass chat_template= a template that inserts each "
                "message['content'] unchanged."
            )
            raise InvalidParameterError(msg)
    # Control tokens come only from the template's text; contents are data (one encoder for both).
    segments = [(messages[int(p)][1], True) if i % 2 else (p, False) for i, p in enumerate(pieces)]
    return engine.encode_segments(segments, check_size=check_size)


def tool_chat_prompt_ids(
    engine: StarCoderEngine,
    messages: Sequence[tuple[str, str]],
    template: str,
    plan: ToolPlan | None,
    *,
    check_size: bool = True,
) -> list[int]:
    """:func:`chat_prompt_ids` with what a tool plan tells the model: the tools (listed by a template
    that :func:`reads_tools`, else in the instructions) and the format of a call."""
    if plan is None or plan.mode == "none":
        return chat_prompt_ids(engine, messages, template, check_size=check_size)
    in_template = reads_tools(template)
    listed = [t.openai() for t in plan.allowed] if in_template else None
    turns = with_instructions(engine, template, messages, plan.instructions(list_tools=not in_template))
    return chat_prompt_ids(engine, turns, template, check_size=check_size, tools=listed)


def template_roles(template: str) -> frozenset[str]:
    """The roles ``template`` accepts: user, assistant, system and those it compares a role with."""
    return _STANDARD_ROLES | _named_roles(template)


def reads_tools(template: str) -> bool:
    """Whether ``template`` renders tool definitions itself (it reads the ``tools`` variable)."""
    return "tools" in _names_read(template)


def with_instructions(
    engine: StarCoderEngine, template: str, messages: Sequence[tuple[str, str]], instructions: str
) -> list[tuple[str, str]]:
    """``messages`` with ``instructions`` (tools, a format) for the model: added to the leading system
    message, else as one, else (a template that refuses system messages) atop the first user message."""
    out = list(messages)
    if out and out[0][0] == "system":
        out[0] = ("system", f"{out[0][1]}\n\n{instructions}")
        return out
    if _accepts_system(engine, template):
        return [("system", instructions), *out]
    for i, (role, content) in enumerate(out):
        if role == "user":
            out[i] = (role, f"{instructions}\n\n{content}")
            return out
    return [("user", instructions), *out]


def _accepts_system(engine: StarCoderEngine, template: str) -> bool:
    try:
        _render(engine, template, [("system", "s"), ("user", "u")])
    except InvalidParameterError:
        return False
    return True


def _check_tools_text(engine: StarCoderEngine, tools: Sequence[Mapping[str, Any]]) -> None:
    """Tool definitions become template text: one that holds a control-token string is refused."""
    text = json.dumps(list(tools), ensure_ascii=False)
    if engine.encode(text, special_tokens=True) != engine.encode(text, special_tokens=False):
        msg = (
            "A tool's definition (name, description or parameters) holds a control-token string such as "
            "<|endoftext|>; the chat template would render it as a control token. Remove it from the tool."
        )
        raise InvalidParameterError(msg)


def _check_roles(template: str, roles: Sequence[str]) -> None:
    allowed = template_roles(template)
    for role in roles:
        if role not in allowed:
            msg = (
                f"The chat template does not know the role {role!r}. A role is rendered as the "
                "template's own text, where it can become control tokens, so only these roles are "
                f"accepted: {', '.join(repr(r) for r in sorted(allowed))}. Use one of them, or pass "
                "chat_template= a template that handles this role."
            )
            raise InvalidParameterError(msg)


@functools.lru_cache(maxsize=64)
def _parsed(template: str) -> Any:
    """The template's Jinja syntax tree, or None where it does not parse (rendering says why)."""
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # transformers adds a {% generation %} block tag to Jinja; its contents parse as plain Jinja.
    source = re.sub(r"{%-?\s*(end)?generation\s*-?%}", "", template)
    try:
        return ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
    except TemplateSyntaxError:
        return None


@functools.lru_cache(maxsize=64)
def _names_read(template: str) -> frozenset[str]:
    from jinja2 import nodes

    tree = _parsed(template)
    return frozenset() if tree is None else frozenset(n.name for n in tree.find_all(nodes.Name))


@functools.lru_cache(maxsize=64)
def _named_roles(template: str) -> frozenset[str]:
    """The strings the template compares a role with: ``message['role'] == 'tool'``, ``role in [...]``."""
    from jinja2 import nodes

    tree = _parsed(template)
    if tree is None:  # rendering will say what is wrong; until then, the standard roles only
        return frozenset()

    def is_role(node: nodes.Node) -> bool:
        return any(
            (isinstance(n, nodes.Getitem) and isinstance(n.arg, nodes.Const) and n.arg.value == "role")
            or (isinstance(n, nodes.Getattr) and n.attr == "role")
            or (isinstance(n, nodes.Name) and "role" in n.name)
            for n in (node, *node.find_all((nodes.Getitem, nodes.Getattr, nodes.Name)))
        )

    names: set[str] = set()
    for compare in tree.find_all(nodes.Compare):
        operands = [compare.expr, *(op.expr for op in compare.ops)]
        if any(is_role(o) for o in operands):
            for o in (o for o in operands if not is_role(o)):
                consts = [o] if isinstance(o, nodes.Const) else o.find_all(nodes.Const)
                names.update(c.value for c in consts if isinstance(c.value, str))
    return frozenset(names)


def _render(
    engine: StarCoderEngine,
    template: str,
    messages: Sequence[tuple[str, str]],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    try:
        return engine.tokenizer.apply_chat_template(
            [{"role": role, "content": content} for role, content in messages],
            chat_template=template,
            tokenize=False,
            add_generation_prompt=True,
            **({"tools": [dict(t) for t in tools]} if tools else {}),
        )
    except Exception as e:  # Jinja errors, e.g. a template that refuses system messages
        msg = f"The chat template could not format these messages: {e}"
        raise InvalidParameterError(msg) from e
