"""One map from an error to the HTTP status and message an editor's client gets, for the HTTP server and
the Jupyter extension alike.

A client's mistake (:class:`RequestError`, the package's ``InvalidParameterError`` and
``ContextLengthError``) is a 4xx saying what is wrong, a model not found a 404; the package's other errors
are written to be read (a 500 with their message). Any other exception is a bug or the
machine's trouble, and its text may hold anything (a path, a key, a user's code): the client gets a 500 that
says only that the server's log has it, under an id, and the log gets the traceback with that id.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ContextLengthError, InvalidParameterError, ModelNotFoundError, StarCoderError

logger = logging.getLogger(__name__)

#: OpenAI's error ``type`` of a client's mistake, and of the server's own failure.
INVALID_REQUEST, SERVER_ERROR = "invalid_request_error", "server_error"


class RequestError(ValueError):
    """A request refused with ``status`` and ``message`` (meant for the client), with ``kind`` (OpenAI's
    error ``type``) and ``fields`` for the body (the server's ``param`` and ``code``; Jupyter's ``code``
    and ``notice``)."""

    def __init__(self, message: str, status: int = 400, *, kind: str = INVALID_REQUEST, **fields: Any):
        super().__init__(message)
        self.status, self.kind, self.fields = status, kind, fields


@dataclass(frozen=True)
class Status:
    """What a client is answered for an error."""

    status: int
    message: str
    """Safe to send: a client's mistake, a package error's own words, or a generic line with an id."""
    kind: str = INVALID_REQUEST
    fields: Mapping[str, Any] = field(default_factory=dict)


def internal_error(
    error: BaseException, log: logging.Logger | logging.LoggerAdapter[Any] = logger, about: str = "a request"
) -> Status:
    """A 500 for an unexpected ``error``: its traceback goes to ``log`` under a new id, and the client
    gets that id and nothing of the error itself."""
    error_id = secrets.token_hex(6)
    log.error("Unexpected error %s while serving %s", error_id, about, exc_info=error)
    message = f"Internal error {error_id}: the server's log has what happened, under this id."
    return Status(500, message, SERVER_ERROR, {"error_id": error_id})


def status_of(
    error: BaseException, log: logging.Logger | logging.LoggerAdapter[Any] = logger, about: str = "a request"
) -> Status:
    """The status and client-safe message for ``error``, raised while serving ``about`` (for the log).
    A failure of the server's own is logged to ``log``: an unexpected error with its traceback
    (:func:`internal_error`), one of the package's with its message."""
    if isinstance(error, RequestError):
        return Status(error.status, str(error), error.kind, error.fields)
    if isinstance(error, ModelNotFoundError):
        return Status(404, str(error), INVALID_REQUEST, {"code": "model_not_found"})
    if isinstance(error, ContextLengthError):
        return Status(413, str(error), INVALID_REQUEST, {"code": "context_length_exceeded"})
    if isinstance(error, InvalidParameterError):
        return Status(400, str(error))
    if isinstance(error, StarCoderError):
        log.error("%s while serving %s: %s", type(error).__name__, about, error)
        return Status(500, str(error), SERVER_ERROR)
    return internal_error(error, log, about)
