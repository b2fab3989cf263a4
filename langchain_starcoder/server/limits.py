"""Request limits: the body size, read as a stream, a text bound checked before tokenizing, and how
many items a list field may hold.

A huge prompt must be refused in milliseconds, not after tokenizing all of it (a 40 MB prompt took
154 s and 16 GB before being refused for not fitting the context window). Under the body limit, many
tiny items cost work each (80,000 ``input_extra`` chunks in 3.3 MB held the server for 10 s), so each list
field has a count far above what an editor sends, refused (400) before any item is looked at.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any

from starlette.requests import Request

from .errors import APIError

#: The default limit on a request body: editors send kilobytes (a 16k-token prompt is ~64 KB of text).
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
#: ``input_extra`` chunks of one ``/infill`` (llama.vim and llama.vscode send at most 16 by default).
MAX_CONTEXT_FILES = 256
#: Stop strings of one request: every generated token is checked against each of them.
MAX_STOP_STRINGS = 32
#: Characters of one stop string (text that could start one is held back, and re-checked at each token).
MAX_STOP_CHARS = 256
#: Prompts of one ``/v1/completions`` request: each is a row of one batch.
MAX_PROMPTS = 64
#: Messages of one ``/v1/chat/completions`` request.
MAX_MESSAGES = 1024
#: ``response_fields`` of one ``/infill`` (llama.vim asks for 15).
MAX_RESPONSE_FIELDS = 64


def _too_large(max_bytes: int) -> APIError:
    msg = (
        f"The request body is larger than this server's limit of {max_bytes} bytes ({max_bytes / 2**20:g} "
        "MiB); send a shorter prompt, or start the server with a larger --max-body-mb."
    )
    return APIError(413, msg, code="request_too_large")


async def read_limited(request: Request, max_bytes: int) -> bytes:
    """The request body, refused (413) as soon as it passes ``max_bytes``: by its Content-Length before
    reading any of it, else while it streams in, so a huge body is never held whole (the HTTP server
    discards what the client still sends)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise _too_large(max_bytes)
    return bytes(body)


def check_text_fits(chars: int, max_chars: int | None, context_window: int, what: str) -> None:
    """Refuse (413) ``chars`` characters of text when more than ``max_chars``, the most that
    ``context_window`` tokens can hold, without tokenizing them."""
    if max_chars is None or chars <= max_chars:
        return
    msg = (
        f"The {what} has {chars} characters: more than the model's context window of {context_window} "
        f"tokens can hold (no token stands for more than {max_chars // context_window} characters). "
        f"Shorten the {what}."
    )
    raise APIError(413, msg, param=what, code="context_length_exceeded")


def check_count(items: Sized, most: int, what: str, param: str) -> None:
    """Refuse (400) the field ``param`` when it holds more than ``most`` items (``what``), before any
    of them is looked at."""
    if len(items) > most:
        msg = (
            f"{param} has {len(items)} {what}: more than the {most} this server takes in one request. "
            f"Send at most {most}."
        )
        raise APIError(400, msg, param=param, code="array_above_max_length")  # OpenAI's code


def check_ids_fit(count: int, context_window: int, what: str, unit: str) -> None:
    """Refuse (413) a ``what`` of ``count`` token ids (``unit``) that cannot fit ``context_window``
    tokens, before each id is checked."""
    if count > context_window:
        msg = (
            f"The {what} has {count} {unit}: more than the model's context window of {context_window} "
            f"tokens can hold. Shorten the {what}."
        )
        raise APIError(413, msg, param=what, code="context_length_exceeded")


def check_stops(stop: Any) -> None:
    """Refuse (400) more than :data:`MAX_STOP_STRINGS` stop strings, or one longer than
    :data:`MAX_STOP_CHARS`; their types are the engine's to check."""
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list):
        return
    check_count(stops, MAX_STOP_STRINGS, "stop strings", "stop")
    longest = max((len(s) for s in stops if isinstance(s, str)), default=0)
    if longest > MAX_STOP_CHARS:
        msg = (
            f"A stop string has {longest} characters: more than the {MAX_STOP_CHARS} this server takes. "
            "Use a shorter stop string."
        )
        raise APIError(400, msg, param="stop", code="string_above_max_length")
