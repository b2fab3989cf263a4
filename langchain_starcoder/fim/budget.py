"""The one rule for a FIM prompt's token budget: how many tokens the prompt may have in a model's
context window, given how many the middle may take.

Every surface (the engine, and through it the HTTP server and the Jupyter extension; and
:func:`~langchain_starcoder.fim.build_fim_prompt` given an engine) asks :func:`prompt_budget`; no
other code gives ``max_prompt_tokens`` a default.
"""

from __future__ import annotations

from ..errors import ContextLengthError


def prompt_budget(context_window: int, max_tokens: int, max_prompt_tokens: int | None) -> int:
    """The most tokens a FIM prompt may have in a model of ``context_window`` tokens that then
    writes up to ``max_tokens``: ``max_prompt_tokens`` when given, else all that ``max_tokens`` leaves.

    Raises:
        ContextLengthError: ``max_tokens`` leaves no room for a prompt, or ``max_prompt_tokens``
            and ``max_tokens`` together exceed the context window.
    """
    check_room(max_tokens, context_window)
    if max_prompt_tokens is None:
        return context_window - max_tokens
    if max_prompt_tokens + max_tokens > context_window:
        msg = (
            f"max_prompt_tokens={max_prompt_tokens} plus max_tokens={max_tokens} exceeds "
            f"the model's context window of {context_window}. Lower one of them."
        )
        raise ContextLengthError(msg)
    return max_prompt_tokens


def check_room(max_tokens: int, context_window: int) -> None:
    """Refuse a ``max_tokens`` that leaves no room for a prompt (checked before any lookup)."""
    if max_tokens >= context_window:
        msg = (
            f"max_tokens={max_tokens} leaves no room for a prompt in the model's "
            f"{context_window}-token context window. Lower max_tokens."
        )
        raise ContextLengthError(msg)


def too_small(context_window: int, max_tokens: int) -> ContextLengthError:
    """The error for a budget :func:`prompt_budget` derived that holds not even the end of the
    prefix after the layout's fixed parts, said in the caller's terms (``max_tokens``)."""
    room = context_window - max_tokens
    msg = (
        f"max_tokens={max_tokens} leaves {room} tokens of the model's {context_window}-"
        "token context for the prompt: not even the end of the prefix fits after the "
        "FIM layout's control tokens and names. Lower max_tokens."
    )
    return ContextLengthError(msg)
