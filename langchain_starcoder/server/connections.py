"""Connection bounds for uvicorn: a deadline for each request to arrive whole, and a connection limit.

uvicorn bounds neither a connection that never completes its request headers (its keep-alive timer runs
only between requests, and any byte cancels it) nor how many such connections are open: its
``limit_concurrency`` answers 503 only once a request's headers are in, and counts the slow ones too.
So 2,100 connections that never finish their headers used up the server's file descriptors. Here a
request's headers and body must arrive within ``request_timeout`` seconds of the connection opening (or
of the previous answer), and at ``max_connections`` a new connection closes the one that has waited
longest for a request's headers (so a good client is served while bad ones hold connections), or gets
503 when every connection is serving a request. The listen backlog is small too: asyncio accepts a whole
backlog in one go, before any of these checks can run.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)

#: Open connections at most (lowered to half the process's open-file limit when that is lower).
DEFAULT_MAX_CONNECTIONS = 512
#: Seconds a request's headers and body may take to arrive.
DEFAULT_REQUEST_TIMEOUT = 20.0
#: Seconds an idle keep-alive connection stays open between requests (uvicorn's own default).
DEFAULT_KEEP_ALIVE_TIMEOUT = 5.0
#: Connections waiting to be accepted at most (uvicorn's default, 2048, lets one burst pass the limit).
ACCEPT_BACKLOG = 128

_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: 40\r\n\r\nEvery connection is serving a request.\r\n"
)


class BoundedConfig(uvicorn.Config):
    """uvicorn's config, serving with :class:`BoundedH11Protocol` under these bounds."""

    def __init__(
        self,
        app: Any,
        *,
        max_connections: int | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        keep_alive_timeout: float = DEFAULT_KEEP_ALIVE_TIMEOUT,
        **kwargs: Any,
    ):
        max_connections = default_max_connections() if max_connections is None else max_connections
        # asyncio accepts up to ``backlog`` connections at once, before any protocol sees one: a small
        # backlog keeps a burst from opening more files than the limit leaves (EMFILE stops accepting).
        kwargs.setdefault("backlog", min(ACCEPT_BACKLOG, max_connections))
        super().__init__(app, http=BoundedH11Protocol, timeout_keep_alive=keep_alive_timeout, **kwargs)  # type: ignore[arg-type]
        self.max_connections = max_connections
        self.request_timeout = request_timeout


def default_max_connections() -> int:
    """:data:`DEFAULT_MAX_CONNECTIONS`, or half the open-file limit when lower (macOS's is 256): the
    other half stays for the model's files and the process."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(1, min(DEFAULT_MAX_CONNECTIONS, soft // 2))


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request deadline and a connection limit (see the module docs)."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any):
        super().__init__(config, *args, **kwargs)
        self.max_connections: int | None = getattr(config, "max_connections", None)
        self.request_timeout: float = getattr(config, "request_timeout", DEFAULT_REQUEST_TIMEOUT)
        #: Since when this connection waits for a request's headers; None while one is being served.
        self.waiting_since: float | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._cycle_seen: Any = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        full = self.max_connections is not None and len(self.connections) > self.max_connections
        if full and not self._close_longest_waiting():
            logger.warning("Refused a connection: all %d are serving requests.", self.max_connections)
            transport.write(_REFUSED)
            transport.close()
            return
        self._wait_for_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._note_progress()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request
        if self.cycle is self._cycle_seen and not self.transport.is_closing():
            self._wait_for_request()
        self._note_progress()

    def _wait_for_request(self) -> None:
        self.waiting_since = self.loop.time()
        self._cancel_deadline()
        self._deadline = self.loop.call_later(self.request_timeout, self._request_too_slow)

    def _note_progress(self) -> None:
        cycle = self.cycle
        if cycle is not None and cycle is not self._cycle_seen:  # a request's headers are in
            self._cycle_seen = cycle
            self.waiting_since = None
        if self.waiting_since is None and cycle is not None and not cycle.more_body:
            self._cancel_deadline()  # the request arrived whole: answering it takes what it takes

    def _request_too_slow(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            logger.debug(
                "Closed a connection whose request did not arrive within %g s.", self.request_timeout
            )
            self.transport.close()

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _close_longest_waiting(self) -> bool:
        """Close the connection that has waited longest for request headers; False if none waits."""
        waiting = [
            c
            for c in self.connections
            if c is not self and isinstance(c, BoundedH11Protocol) and c.waiting_since is not None
        ]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda c: c.waiting_since or 0.0)
        oldest.waiting_since = None
        oldest.transport.close()
        return True
