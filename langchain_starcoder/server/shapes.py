"""Response shapes: OpenAI's usage, llama.cpp's final answer and its ``response_fields``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..editor.supersede import CANCELLED
from ..fim.request import ContextFile
from ..types import Completion, usage

#: ``finish_reason`` of an /infill answer cut by ``t_max_predict_ms``.
TIME_LIMIT = "time_limit"
#: ``stop_type`` of a middle that ended where the code does (``end``); one ended by ``n_indent`` is
#: "limit", as llama.cpp reports it. A middle cut by ``n_predict`` is "limit" whatever it holds.
MIDDLE_END = "middle_end"


def usage_body(done: list[Completion]) -> dict[str, Any]:
    """OpenAI's usage, cached tokens under ``prompt_tokens_details`` as OpenAI puts them."""
    counts = usage(done)
    cached = counts.pop("cached_tokens")
    return {**counts, "prompt_tokens_details": {"cached_tokens": cached}}


def files_used(given: Sequence[ContextFile], kept: Sequence[ContextFile]) -> list[str]:
    """For each file given, "whole", "cut" or "dropped": how much of it the FIM prompt holds. ``kept``
    is the prompt's files, in order, each whole or its first lines."""
    used, rest = [], iter(kept)
    candidate = next(rest, None)
    for file in given:
        if candidate is not None and candidate.path == file.path and file.text.startswith(candidate.text):
            used.append("whole" if candidate.text == file.text else "cut")
            candidate = next(rest, None)
        else:
            used.append("dropped")
    return used


def final_answer(model: str, c: Completion, content: str, truncated: bool, n_predict: int) -> dict[str, Any]:
    """llama.cpp's final answer of /infill and /completion (``stop`` True, counts and timings)."""
    predicted = 0 if n_predict == 0 else c.completion_tokens
    evaluated = c.prompt_tokens - c.cached_tokens
    prompt_ms = None if c.prompt_seconds is None else c.prompt_seconds * 1000  # None: not known
    predicted_ms = c.generation_seconds * 1000
    cut = c.finish_reason == TIME_LIMIT
    cancelled = c.finish_reason == CANCELLED
    stop_type = "word" if c.stop_sequence else ("limit" if c.finish_reason == "length" or cut else "eos")
    if c.middle_end is not None and c.finish_reason == "stop":  # a whole middle, ended where the code is
        stop_type = MIDDLE_END if c.middle_end == "syntax" else "limit"
    stop_type = CANCELLED if cancelled else stop_type
    out = {
        "content": content,
        "id_slot": 0,
        "stop": True,
        "model": model,
        "tokens_predicted": predicted,
        "tokens_evaluated": c.prompt_tokens,
        "tokens_cached": c.cached_tokens,
        "truncated": truncated,
        "stop_type": stop_type,
        "stopping_word": c.stop_sequence or "",
        "has_new_line": "\n" in content,
        "timings": {
            "prompt_n": evaluated,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": None
            if prompt_ms is None
            else (prompt_ms / evaluated if evaluated else 0.0),
            "prompt_per_second": c.prompt_tps,
            "predicted_n": predicted,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted if predicted else 0.0,
            "predicted_per_second": predicted / c.generation_seconds if c.generation_seconds > 0 else 0.0,
        },
    }
    if cut or cancelled:  # how much of the prompt the cache served is not known for an answer cut short
        del out["tokens_cached"]
        out["timings"]["prompt_n"] = c.prompt_tokens
    if cancelled:  # no content: an editor keeps what it gets for its text (llama.vim skips an answer without)
        del out["content"], out["has_new_line"]
    return out


def pick_fields(response: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """llama.cpp's ``response_fields``: only these, nested ones under their flat path
    (``"timings/prompt_n"``), as llama.vim reads them."""
    if fields is None:
        return response
    out = {}
    for path in fields:
        value: Any = response
        for key in path.split("/"):
            value = value.get(key, _MISSING) if isinstance(value, dict) else _MISSING
        if value is not _MISSING:
            out[path] = value
    return out


_MISSING = object()
