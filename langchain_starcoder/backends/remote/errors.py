"""The errors a remote server's answers turn into."""

from __future__ import annotations

from ...errors import StarCoderError


class ServerError(StarCoderError):
    """The server answered with an error, or something that is not its protocol."""


class ServerUnavailableError(ServerError, ConnectionError):
    """The server could not be reached (or stayed busy) after the retries."""


class ServerDisconnectedError(ServerError, ConnectionError):
    """The connection broke while the server answered (it closed, crashed or was killed)."""


class ServerTimeoutError(ServerError, TimeoutError):
    """The server sent no token for ``timeout`` seconds, or a request ran past its ``deadline``."""
