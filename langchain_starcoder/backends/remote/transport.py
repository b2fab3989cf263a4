"""The HTTP side of a remote server: one client, each request's time bounds, retries before the
first token, bounded reading of lines and bodies, and every failure mapped to one clear error."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from .errors import (
    ServerDisconnectedError,
    ServerError,
    ServerTimeoutError,
    ServerUnavailableError,
    error_message,
    http_error_text,
    json_object,
)

_BACKOFF = 0.25  # seconds before the first retry; doubled for each next one
_MAX_LINE = 1 << 24  # bytes of one server-sent line, or of an answer's body, before it is refused


class _Retry(Exception):
    """A failure before the first token that is worth another try (connect error, 503)."""


class _Expired(Exception):
    """One of a request's time bounds ran out: its argument says which ("timeout" or "deadline")."""


class Clock:
    """One request's time bounds, checked at every read of its answer. ``timeout`` runs from the
    request and again from each token, whatever else the server sends (keep-alive comments, parts
    of a line); ``deadline``, when set, from the request's first try to its end."""

    def __init__(self, timeout: float, deadline: float | None) -> None:
        self.timeout = timeout
        self.started = self.progressed = time.monotonic()
        self.ends = None if deadline is None else self.started + deadline

    def progress(self) -> None:
        """A token came (or a new try starts): the silence bound starts again."""
        self.progressed = time.monotonic()

    def check(self) -> None:
        now = time.monotonic()
        if self.ends is not None and now >= self.ends:
            raise _Expired("deadline")
        if now - self.progressed >= self.timeout:
            raise _Expired("timeout")

    def left(self) -> float:
        return math.inf if self.ends is None else max(self.ends - time.monotonic(), 0.0)

    def limits(self) -> httpx.Timeout:
        """How long one network wait may last: the silence bound, cut to the time left."""
        wait = max(min(self.timeout, self.left()), 0.001)
        return httpx.Timeout(wait, connect=min(wait, 10.0))

    def which(self, error: BaseException) -> str:
        """The bound that ``error`` (ours, or an httpx timeout) stands for."""
        if isinstance(error, _Expired):
            return str(error.args[0])
        return "deadline" if self.ends is not None and self.left() < 0.01 else "timeout"


class Transport:
    """Requests to one server: ``get_json`` for a short answer, ``stream`` for a generation."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None,
        timeout: float,
        deadline: float | None,
        max_retries: int,
        max_concurrency: int,
    ) -> None:
        self.base_url = base_url
        self.timeout, self.deadline = timeout, deadline
        self.max_retries = max_retries
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=base_url,
            headers=headers,
            timeout=Clock(timeout, None).limits(),  # each request passes its own
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
        )

    def close(self) -> None:
        self._client.close()

    def get_json(self, path: str) -> dict[str, Any]:
        clock = Clock(self.timeout, self.deadline)
        for attempt in range(self.max_retries + 1):
            clock.progress()  # each try may wait the whole silence bound
            try:
                clock.check()
                with self._client.stream("GET", path, timeout=clock.limits()) as response:
                    text = self._body(response, clock)
                if response.status_code >= 400:  # 503: still loading the model
                    error = self._http_error(response, text)
                    raise _Retry(error) if response.status_code == 503 else error
                return self._json(text, path)
            except (httpx.ConnectError, httpx.ConnectTimeout, _Retry) as e:
                if attempt == self.max_retries:
                    raise self._unreachable(e) from None
                time.sleep(min(_BACKOFF * 2**attempt, clock.left()))
            except (httpx.TimeoutException, _Expired) as e:
                raise self._timeout(path, clock.which(e)) from None
            except httpx.TransportError as e:
                msg = f"The connection to {self.base_url} broke while reading {path} ({e!r})."
                raise ServerError(msg) from None
        raise AssertionError  # the loop returns or raises

    def stream(
        self,
        path: str,
        body: dict[str, Any],
        cancelled: threading.Event,
        relay: Callable[[httpx.Response, Clock], None],
    ) -> None:
        """POST ``body`` and hand the streamed answer to ``relay``, retrying before it starts."""
        clock = Clock(self.timeout, self.deadline)
        for attempt in range(self.max_retries + 1):
            if cancelled.is_set():
                return
            clock.progress()  # each try may wait the whole silence bound
            try:
                clock.check()
                with self._client.stream("POST", path, json=body, timeout=clock.limits()) as response:
                    if response.status_code >= 400:
                        error = self._http_error(response, self._body(response, clock))
                        raise _Retry(error) if response.status_code == 503 else error
                    relay(response, clock)  # leaving the block closes the stream
                return
            except (httpx.ConnectError, httpx.ConnectTimeout, _Retry) as e:
                if attempt == self.max_retries:
                    raise self._unreachable(e) from None
            except (httpx.TimeoutException, _Expired) as e:  # no answer in time (prefill or a hung server)
                raise self._timeout(path, clock.which(e), 0) from None
            except httpx.TransportError as e:
                msg = f"The connection to {self.base_url} broke before the first token ({e!r})."
                raise ServerDisconnectedError(msg) from None
            if cancelled.wait(min(_BACKOFF * 2**attempt, clock.left())):  # a cancel ends the wait
                return

    @contextlib.contextmanager
    def stream_errors(self, path: str, clock: Clock, count: Callable[[], int]) -> Iterator[None]:
        """A timeout or a broken connection mid-stream as one clear error (never retried)."""
        try:
            yield
        except (httpx.TimeoutException, _Expired) as e:
            raise self._timeout(path, clock.which(e), count()) from None
        except httpx.TransportError as e:
            msg = f"The connection to {self.base_url} broke after {count()} generated tokens ({e!r})."
            raise ServerDisconnectedError(msg) from None

    def events(self, response: httpx.Response, path: str, clock: Clock) -> Iterator[dict[str, Any]]:
        """The JSON objects of a server-sent-event stream (``data: {...}`` lines)."""
        for line in self._lines(response, clock):
            if not line.strip() or line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value.strip()
            if field == "error" or (field == "data" and value.startswith('{"error"')):
                msg = f"{self.base_url} failed mid-stream: {error_message(self._json(value, 'error'))}"
                raise ServerError(msg)
            if field != "data" or value == "[DONE]":
                continue
            yield self._json(value, path)

    # --- reading, bounded ----------------------------------------------------------------------

    def _lines(self, response: httpx.Response, clock: Clock) -> Iterator[str]:
        """The body's lines as they arrive, the clock checked at every read, each line bounded."""
        pending = bytearray()
        for chunk in self._chunks(response, clock):
            pending += chunk
            if b"\n" not in chunk:
                self._bounded(len(pending), response)
                continue
            *lines, rest = pending.split(b"\n")
            pending = bytearray(rest)
            for line in lines:
                yield line.decode("utf-8", "replace").removesuffix("\r")
        if pending:
            yield pending.decode("utf-8", "replace")

    def _body(self, response: httpx.Response, clock: Clock) -> str:
        """A whole (short) answer: a JSON object or an error's text."""
        data = bytearray()
        for chunk in self._chunks(response, clock):
            data += chunk
            self._bounded(len(data), response)
        return data.decode("utf-8", "replace")

    def _chunks(self, response: httpx.Response, clock: Clock) -> Iterator[bytes]:
        for chunk in response.iter_bytes():
            clock.check()
            yield chunk

    def _bounded(self, size: int, response: httpx.Response) -> None:
        if size > _MAX_LINE:
            msg = (
                f"{self.base_url}{response.request.url.path} sent over {_MAX_LINE} bytes in one line or "
                "answer: not a server-sent-event stream or a JSON answer."
            )
            raise ServerError(msg)

    # --- errors --------------------------------------------------------------------------------

    def _json(self, text: str, what: str) -> dict[str, Any]:
        return json_object(text, f"{self.base_url}{what}")

    def _http_error(self, response: httpx.Response, text: str) -> ServerError:
        return ServerError(http_error_text(self.base_url, response, text))

    def _unreachable(self, error: BaseException) -> ServerUnavailableError:
        why = f"stayed busy ({error})" if isinstance(error, _Retry) else f"could not be reached ({error!r})"
        msg = (
            f"{self.base_url} {why} after {self.max_retries + 1} tries (max_retries={self.max_retries}). "
            "Is the server running?"
        )
        return ServerUnavailableError(msg)

    def _timeout(self, path: str, which: str, count: int | None = None) -> ServerTimeoutError:
        """The error for a bound that ran out; ``count`` is None for an answer with no tokens."""
        after = "" if count is None else f" (after {count} generated tokens)"
        if which == "deadline":
            msg = (
                f"{self.base_url}{path} ran past its deadline of {self.deadline} s in all{after}; "
                "raise deadline= (None: no bound) to allow longer requests."
            )
        else:
            what = "nothing" if count is None else "no token"
            msg = (
                f"{self.base_url}{path} sent {what} for {self.timeout} s{after}; raise timeout= for long "
                "prompts on a slow server."
            )
        return ServerTimeoutError(msg)
