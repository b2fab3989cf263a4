"""Request limits: the body size, read as a stream, and a text bound checked before tokenizing.

A huge prompt must be refused in milliseconds, not after tokenizing all of it (a 40 MB prompt took
154 s and 16 GB before being refused for not fitting the context window).
"""

from __future__ import annotations

from starlette.requests import Request

from .errors import APIError

#: The default limit on a request body: editors send kilobytes (a 16k-token prompt is ~64 KB of text).
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


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
