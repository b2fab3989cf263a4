"""The errors a remote server's answers turn into."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ...errors import StarCoderError

if TYPE_CHECKING:
    import httpx


class ServerError(StarCoderError):
    """The server answered with an error, or something that is not its protocol."""


class ServerUnavailableError(ServerError, ConnectionError):
    """The server could not be reached (or stayed busy) after the retries."""


class ServerDisconnectedError(ServerError, ConnectionError):
    """The connection broke while the server answered (it closed, crashed or was killed)."""


class ServerTimeoutError(ServerError, TimeoutError):
    """The server sent no token for ``timeout`` seconds, or a request ran past its ``deadline``."""


def json_object(text: str, where: str) -> dict[str, Any]:
    """``text`` as the JSON object an answer must be; else a :class:`ServerError` naming ``where``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        msg = f"{where} answered something that is not a JSON object: {text[:200]!r}"
        raise ServerError(msg)
    return value


def http_error_text(base_url: str, response: httpx.Response, text: str) -> str:
    """What an answer with an error status (its body ``text``) says: the status, the path, the detail."""
    try:
        detail = error_message(json.loads(text))
    except json.JSONDecodeError:
        detail = text.strip()[:300] or response.reason_phrase
    return f"{base_url} answered {response.status_code} to {response.request.url.path}: {detail}"


def error_message(body: Any) -> str:
    """The human part of an error body: llama.cpp's and OpenAI's ``{"error": {"message": ...}}``."""
    error = body.get("error", body) if isinstance(body, dict) else body  # older vLLM: the body itself
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])
    return str(error)[:300]
