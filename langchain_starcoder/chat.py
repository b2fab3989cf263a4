"""Chat prompts: a checkpoint's chat template, with message contents kept as data.

The template's own text (role headers, ``<|endoftext|>`` between turns) is encoded with control tokens
parsed; each message's content is encoded as plain text, so a message that quotes ``<|endoftext|>``
cannot end or reshape the prompt. Shared by the LangChain and LlamaIndex chat classes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .errors import InvalidParameterError

if TYPE_CHECKING:
    from .engine import StarCoderEngine

_MARK = re.compile("\ue000([0-9]+)\ue001")  # private-use characters: a placeholder per message


def resolve_chat_template(engine: StarCoderEngine, override: str | None) -> str | None:
    """``override`` if given, else the checkpoint's chat template, else None."""
    if override is not None:
        return override
    return engine.tokenizer.chat_template if engine.tokenizer.has_chat_template else None


def chat_prompt_ids(engine: StarCoderEngine, messages: Sequence[tuple[str, str]], template: str) -> list[int]:
    """Token ids of ``(role, content)`` messages rendered by ``template``, ready for generation.

    The ids are those of the rendered text, except that control-token strings inside contents
    stay plain text.
    """
    if not messages:
        msg = "A chat needs at least one message."
        raise InvalidParameterError(msg)
    marked = [{"role": role, "content": f"\ue000{i}\ue001"} for i, (role, _) in enumerate(messages)]
    pieces = _MARK.split(_render(engine, template, marked))
    if sorted(int(i) for i in pieces[1::2]) != list(range(len(messages))):
        msg = (
            "The chat template drops, repeats or alters message contents, so they cannot be kept "
            "apart from its control tokens; use a template that inserts each message's content once."
        )
        raise InvalidParameterError(msg)
    # Control tokens come only from the template's text. Each run of text between them, template
    # text and contents alike, is encoded in one piece, as the model saw such text in training.
    controls = "|".join(re.escape(t) for t in sorted(engine.tokenizer.all_special_tokens, key=len)[::-1])
    ids: list[int] = []
    run: list[str] = []
    for i, piece in enumerate(pieces):
        parts = [messages[int(piece)][1]] if i % 2 else re.split(f"({controls})", piece)
        for j, part in enumerate(parts):
            if i % 2 == 0 and j % 2:
                ids += engine.encode("".join(run), special_tokens=False) if run else []
                ids.append(engine.token_id(part))
                run = []
            elif part:
                run.append(part)
    return ids + (engine.encode("".join(run), special_tokens=False) if run else [])


def _render(engine: StarCoderEngine, template: str, messages: list[dict[str, str]]) -> str:
    try:
        return engine.tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=True
        )
    except Exception as e:  # Jinja errors, e.g. a template that refuses system messages
        msg = f"The chat template could not format these messages: {e}"
        raise InvalidParameterError(msg) from e
