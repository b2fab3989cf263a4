"""Checks of a request, each taking what it needs (the backend's sizes, the tokenizer): settings
against the model, prompts (text, token ids, a batch) and what fits in the context window."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from .._tokens import max_text_chars
from ..backends import Backend
from ..errors import ContextLengthError, InvalidParameterError
from ..fim.budget import check_room
from ..types import GenerationParams, is_int


def split_settings(
    settings: dict[str, Any], backend: Backend, eos_token_ids: frozenset[int]
) -> tuple[GenerationParams, bool]:
    """The generation settings (checked against the backend's model, every end id a stop id) and
    ``parse_special_tokens``, taken out of ``settings``."""
    parse = settings.pop("parse_special_tokens", True)
    if not isinstance(parse, bool):
        msg = f"parse_special_tokens must be True or False, not {parse!r}."
        raise InvalidParameterError(msg)
    params = GenerationParams.create(**settings)
    if params.top_k >= backend.vocab_size:
        msg = (
            f"top_k={params.top_k} is not below the vocabulary size ({backend.vocab_size}); "
            "use 0 to turn it off."
        )
        raise InvalidParameterError(msg)
    check_room(params.max_tokens, backend.context_window)
    check_in_vocab(params.stop_token_ids, backend.vocab_size, "stop_token_ids")
    stops = params.stop_token_ids | eos_token_ids
    return dataclasses.replace(params, stop_token_ids=stops), parse


def check_fits(ids: list[int], max_tokens: int, context_window: int) -> None:
    """A prompt of ``ids`` fits in the context window with its generation."""
    if len(ids) + max_tokens > context_window:
        msg = (
            f"The prompt has {len(ids)} tokens and max_tokens is {max_tokens}: together "
            f"{len(ids) + max_tokens}, more than the model's context window of "
            f"{context_window}. Shorten the prompt or lower max_tokens."
        )
        raise ContextLengthError(msg)


def check_text_prompt(prompt: str) -> None:
    if not prompt or prompt.isspace():  # no copy of a long prompt
        msg = "The prompt is empty or only whitespace; give the model some text to continue."
        raise InvalidParameterError(msg)


def check_prompt_size(tokenizer: Any, context_window: int, chars: int, max_tokens: int = 0) -> None:
    """:meth:`StarCoderEngine.check_prompt_size <langchain_starcoder.StarCoderEngine.check_prompt_size>`."""
    room = context_window - max_tokens
    limit = max_text_chars(tokenizer, room)
    if limit is None or chars <= limit:
        return
    longest = limit // room
    if max_tokens:
        msg = (
            f"The prompt has {chars:,} characters and max_tokens is {max_tokens}: the model's "
            f"{context_window}-token context window leaves {room} tokens for the prompt, which "
            f"hold at most {limit:,} characters (a token of this tokenizer stands for at most "
            f"{longest}). Shorten the prompt or lower max_tokens."
        )
    else:
        msg = (
            f"The prompt has {chars:,} characters: the model's {context_window}-token context "
            f"window holds at most {limit:,} (a token of this tokenizer stands for at most "
            f"{longest}). Shorten the prompt."
        )
    raise ContextLengthError(msg)


def prompt_ids(prompt: Any, vocab_size: int) -> list[int]:
    """A prompt that is not text: token ids, checked (bytes and other types are refused)."""
    if isinstance(prompt, bytes | bytearray | memoryview):
        msg = (
            f"The prompt is {type(prompt).__name__}, not text: decode it first "
            "(e.g. data.decode('utf-8')), or pass token ids as a list of integers."
        )
        raise InvalidParameterError(msg)
    if not isinstance(prompt, Sequence):
        msg = f"A prompt is text or a list of token ids, not {type(prompt).__name__}."
        raise InvalidParameterError(msg)
    return check_ids(prompt, vocab_size)


def check_ids(token_ids: Sequence[int], vocab_size: int) -> list[int]:
    if isinstance(token_ids, str) or not all(is_int(t) for t in token_ids):
        msg = "Token ids must be a sequence of integers."
        raise InvalidParameterError(msg)
    ids = [int(t) for t in token_ids]
    if not ids:
        msg = "The prompt is empty: give at least one token."
        raise InvalidParameterError(msg)
    check_in_vocab(ids, vocab_size, "Token ids")
    return ids


def check_in_vocab(ids: Iterable[int], vocab_size: int, what: str) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        msg = f"{what} {bad[:5]} are outside the vocabulary [0, {vocab_size})."
        raise InvalidParameterError(msg)


def check_batch(prompts: Any) -> Sequence[Any]:
    if isinstance(prompts, str | bytes) or not isinstance(prompts, Sequence) or not prompts:
        msg = "A batch is a non-empty list of prompts."
        raise InvalidParameterError(msg)
    return prompts
