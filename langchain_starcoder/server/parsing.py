"""Reading requests: the JSON body, typed fields, and OpenAI's and llama.cpp's fields as engine settings."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from ..engine import StarCoderEngine
from ..fim.request import ContextFile, FIMRequest
from ..types import is_int
from .errors import bad_request
from .limits import MAX_CONTEXT_FILES, check_count, check_stops, check_text_fits, read_limited


async def read_body(request: Request, max_bytes: int) -> dict[str, Any]:
    raw = await read_limited(request, max_bytes)
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"The request body is not valid JSON: {e}.") from e
    except RecursionError as e:
        raise bad_request("The request body is nested too deeply.") from e
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    return body


def field(body: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    """``body[key]`` checked against ``kind`` (JSON null counts as absent)."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise bad_request(f"{key} has the wrong type (bool).", key)
    if not isinstance(value, kind):
        raise bad_request(f"{key} has the wrong type ({type(value).__name__}).", key)
    return value


def include_usage(body: dict[str, Any]) -> bool:
    """OpenAI's ``stream_options.include_usage``: a last chunk with the usage."""
    return bool(field(body, "stream_options", dict, {}).get("include_usage"))


def text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise bad_request(f"{what} must be a string, not {type(value).__name__}.", what)
    return value


def is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(is_int(t) for t in value)


def text_ids(engine: StarCoderEngine, prompt: str, parse: bool, max_chars: int | None) -> list[int]:
    """A text prompt's ids; one that cannot fit the context window (``max_chars``) is refused first."""
    if not prompt or prompt.isspace():  # no copy of a long prompt
        msg = "The prompt is empty or only whitespace; give the model some text to continue."
        raise bad_request(msg, "prompt")
    check_text_fits(len(prompt), max_chars, engine.context_window, "prompt")
    return engine.encode(prompt, special_tokens=parse)


# --- OpenAI ----------------------------------------------------------------------------------------


def openai_settings(
    body: dict[str, Any], max_tokens: int, temperature: float, prompt_lookup: int | None = None
) -> dict[str, Any]:
    """Generation settings from OpenAI-style fields (null means the default); the engine validates them.
    ``prompt_lookup``: the server's ``prompt_lookup_num_tokens``, which a request's own field overrides."""
    settings: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature}
    for key in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "repetition_penalty"):
        if body.get(key) is not None:
            settings[key] = body[key]
    check_stops(settings.get("stop"))
    return _with_lookup(settings, body, prompt_lookup)


def _with_lookup(settings: dict[str, Any], body: dict[str, Any], prompt_lookup: int | None) -> dict[str, Any]:
    lookup = body.get("prompt_lookup_num_tokens", prompt_lookup)
    if lookup is not None:
        settings["prompt_lookup_num_tokens"] = lookup
    return settings


def refuse_unsupported(body: dict[str, Any]) -> None:
    """OpenAI options this server does not implement: refused when set to anything but their default."""
    if body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
        raise bad_request("Only n = 1 (and best_of = 1) is supported.", "n")
    if body.get("echo"):
        raise bad_request("echo is not supported.", "echo")
    if body.get("logprobs") not in (None, False, 0):
        raise bad_request("logprobs are not supported.", "logprobs")
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise bad_request(f"{key} is not supported; use repetition_penalty.", key)
    if body.get("logit_bias"):
        raise bad_request("logit_bias is not supported.", "logit_bias")


def message_content(message: Any) -> str:
    """A chat message's content: text, or a list of text parts (joined)."""
    if not isinstance(message, dict):
        raise bad_request("Each message must be an object with role and content.", "messages")
    content = message.get("content")
    if isinstance(content, list):
        parts = [p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None for p in content]
        if any(not isinstance(p, str) for p in parts):
            raise bad_request("Only text content parts are supported.", "messages")
        return "".join(parts)  # type: ignore[arg-type]
    return text(content, "content")


# --- llama.cpp -------------------------------------------------------------------------------------


def llama_settings(body: dict[str, Any], max_tokens: int, prompt_lookup: int | None = None) -> dict[str, Any]:
    """Engine settings from llama.cpp's request fields (greedy unless a temperature is given);
    ``prompt_lookup`` as in :func:`openai_settings`."""
    temperature = body.get("temperature")
    settings: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature or 0.0}
    for key in ("top_p", "top_k", "min_p", "seed"):
        if body.get(key) is not None:
            settings[key] = body[key]
    if body.get("stop"):
        settings["stop"] = body["stop"]
        check_stops(settings["stop"])
    penalty = body.get("repeat_penalty")
    if penalty is not None and penalty != 1.0:
        settings["repetition_penalty"] = penalty
    if settings.get("seed") in (-1, 0xFFFFFFFF):  # llama.cpp's "a random seed"
        del settings["seed"]
    return _with_lookup(settings, body, prompt_lookup)


def end_fields(body: dict[str, Any]) -> dict[str, Any]:
    """Where a middle ends: our ``end`` ("auto" by default, "line", "block", "none") and llama.cpp's
    ``n_indent`` (a later line indented less ends it), as FIMRequest fields."""
    end = field(body, "end", str, "auto")
    n_indent = field(body, "n_indent", int, 0)
    if n_indent < 0:
        raise bad_request(f"n_indent must be an integer >= 0 (0: off), not {n_indent}.", "n_indent")
    return {"end": end, "min_indent": n_indent}


def infill_request(body: dict[str, Any]) -> FIMRequest:
    """llama.cpp's /infill fields as a FIMRequest: ``prompt`` continues ``input_prefix`` (it is the
    text of the cursor's line before the cursor), ``input_extra`` files are repository context."""
    prefix = field(body, "input_prefix", str, "") + field(body, "prompt", str, "")
    suffix = field(body, "input_suffix", str, "")
    extra = body.get("input_extra") or []
    if not isinstance(extra, list):
        raise bad_request("input_extra must be a list of {filename, text} objects.", "input_extra")
    check_count(extra, MAX_CONTEXT_FILES, "chunks", "input_extra")
    files = []
    for i, item in enumerate(extra):
        if not isinstance(item, dict):
            raise bad_request(f"input_extra[{i}] must be an object with filename and text.", "input_extra")
        files.append(ContextFile(text(item.get("filename", ""), "filename"), text(item.get("text"), "text")))
    repo_name = body.get("repo_name")
    file_path = body.get("file_path")
    return FIMRequest(
        prefix,
        suffix,
        context_files=tuple(files),
        repo_name=None if repo_name is None else text(repo_name, "repo_name"),
        file_path=None if file_path is None else text(file_path, "file_path"),
        **end_fields(body),
    )
