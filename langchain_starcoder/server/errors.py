"""Errors the server answers: OpenAI's error body, with the status and message of the editor's one map
(editor/statuses.py, which the Jupyter extension uses too)."""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

from ..editor.statuses import INVALID_REQUEST, RequestError, status_of

logger = logging.getLogger(__name__)


class APIError(RequestError):
    """A request the server answers with an error status and OpenAI's error body."""

    def __init__(self, status: int, message: str, *, kind: str = INVALID_REQUEST, **extra: Any):
        super().__init__(message, status, kind=kind, **extra)

    @property
    def extra(self) -> dict[str, Any]:
        """The body's ``param`` and ``code``, when set."""
        return self.fields


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def error_response(e: APIError) -> JSONResponse:
    body = {"message": str(e), "type": e.kind, "param": e.extra.get("param"), "code": e.extra.get("code")}
    return JSONResponse({"error": body}, status_code=e.status)


def api_error(e: BaseException) -> APIError:
    """The status and body for an exception raised while serving a request (an unexpected one's message
    is logged here, never answered)."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, ClientDisconnect):  # the client left while its request was read: not a server error
        logger.debug("The client disconnected before its request was read.")
        return APIError(499, "The client disconnected.", kind="client_closed")
    status = status_of(e, logger)
    return APIError(status.status, status.message, kind=status.kind, **status.fields)
