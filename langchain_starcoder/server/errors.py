"""Errors the server answers: OpenAI's error body, and the status each engine error maps to."""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

from ..errors import ContextLengthError, InvalidParameterError, StarCoderError

logger = logging.getLogger(__name__)


class APIError(Exception):
    """A request the server answers with an error status and OpenAI's error body."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error", **extra: Any):
        super().__init__(message)
        self.status, self.kind, self.extra = status, kind, extra


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def error_response(e: APIError) -> JSONResponse:
    body = {"message": str(e), "type": e.kind, "param": e.extra.get("param"), "code": e.extra.get("code")}
    return JSONResponse({"error": body}, status_code=e.status)


def api_error(e: BaseException) -> APIError:
    """The status and body for an exception raised while serving a request."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, ClientDisconnect):  # the client left while its request was read: not a server error
        logger.debug("The client disconnected before its request was read.")
        return APIError(499, "The client disconnected.", kind="client_closed")
    if isinstance(e, ContextLengthError):
        return APIError(413, str(e), code="context_length_exceeded")
    if isinstance(e, InvalidParameterError):
        return APIError(400, str(e))
    if isinstance(e, StarCoderError):
        return APIError(500, str(e), kind="server_error")
    logger.exception("Unexpected error while serving a request")
    return APIError(500, f"Internal error: {type(e).__name__}", kind="server_error")
