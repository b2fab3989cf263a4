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
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .errors import InvalidParameterError

if TYPE_CHECKING:
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
    engine: StarCoderEngine, messages: Sequence[tuple[str, str]], template: str, *, check_size: bool = True
) -> list[int]:
    """Token ids of ``(role, content)`` messages rendered by ``template``, ready for generation.

    The ids are those of the rendered text, except that control-token strings inside contents
    stay plain text. Raises InvalidParameterError for a role the template does not know and for a
    template that alters contents (see the module's docs), and ContextLengthError for contents too
    long for the context window (``check_size=False`` to count the tokens of any chat).
    """
    if not messages:
        msg = "A chat needs at least one message."
        raise InvalidParameterError(msg)
    roles = [role for role, _ in messages]
    _check_roles(template, roles)
    # The prompt holds every content unchanged (or is refused below): too long is refused unrendered.
    if check_size:
        engine.check_prompt_size(sum(len(content) for _, content in messages))
    pieces = _MARK.split(_render(engine, template, [(r, f"\ue000{i}\ue001") for i, r in enumerate(roles)]))
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
        if _render(engine, template, list(zip(roles, contents, strict=True))) != filled:
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


def _check_roles(template: str, roles: Sequence[str]) -> None:
    allowed = _STANDARD_ROLES | _named_roles(template)
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
def _named_roles(template: str) -> frozenset[str]:
    """The strings the template compares a role with: ``message['role'] == 'tool'``, ``role in [...]``."""
    from jinja2 import TemplateSyntaxError, nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # transformers adds a {% generation %} block tag to Jinja; its contents parse as plain Jinja.
    source = re.sub(r"{%-?\s*(end)?generation\s*-?%}", "", template)
    try:
        tree = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
    except TemplateSyntaxError:  # rendering will say what is wrong; until then, the standard roles only
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


def _render(engine: StarCoderEngine, template: str, messages: Sequence[tuple[str, str]]) -> str:
    try:
        return engine.tokenizer.apply_chat_template(
            [{"role": role, "content": content} for role, content in messages],
            chat_template=template,
            tokenize=False,
            add_generation_prompt=True,
        )
    except Exception as e:  # Jinja errors, e.g. a template that refuses system messages
        msg = f"The chat template could not format these messages: {e}"
        raise InvalidParameterError(msg) from e
