"""What every server protocol shares: a generation's stream read until it is cancelled, and each chunk's
token ids checked before they reach the sink. ``llama_cpp`` and ``vllm`` say the rest."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from ...types import GenerationParams
from .. import Generation
from .errors import ServerError
from .transport import Clock, Transport
from .validation import Validator


class ServerProtocol:
    """How one kind of server takes a generation: its ``path``, its request ``body``, and the ``relay``
    of its stream to the generation's sink."""

    path: str
    #: What a server that streams no token ids lacks (its error says so).
    needs: str
    #: The whitespace the server allows between JSON tokens under a ``json_schema`` (None: none, as ours).
    json_whitespace: str | None = None

    def __init__(self, transport: Transport, vocab_size: int) -> None:
        self.base_url = transport.base_url
        self._transport = transport
        self._check = Validator(transport.base_url)
        self._vocab_size = vocab_size

    def body(self, prompt: list[int], params: GenerationParams) -> dict[str, Any]:
        raise NotImplementedError

    @contextlib.contextmanager
    def request(self, gen: Generation) -> Iterator[dict[str, Any]]:
        """The body of ``gen``'s request, held while its stream runs (a protocol that tracks what the
        server's cache holds learns here that it ended)."""
        yield self.body(gen.prompt, gen.params)

    def relay(self, gen: Generation, response: httpx.Response, clock: Clock) -> None:
        raise NotImplementedError

    def _events(
        self, gen: Generation, response: httpx.Response, clock: Clock, count: Callable[[], int]
    ) -> Iterator[dict[str, Any]]:
        """The stream's events until ``gen`` is cancelled (the relay then returns, which closes the
        stream: the server stops generating). A timeout or a broken connection is one clear error
        that says how many tokens came (``count``)."""
        with self._transport.stream_errors(self.path, clock, count):
            for event in self._transport.events(response, self.path, clock):
                if gen.cancelled.is_set():
                    return
                yield event

    def _token_ids(self, ids: Any, event: dict[str, Any], clock: Clock) -> list[int]:
        """A chunk's token ids, each checked to be in the vocabulary; any restart the silence bound."""
        checked = self._check.token_ids(ids, self._vocab_size, event, self.needs)
        if checked:
            clock.progress()
        return checked

    def _end(self, gen: Generation, last_chunk: bool, count: int, cached: int | None) -> None:
        """The stream is over: a cancelled generation is left as it is (its stream was closed); one
        whose server never sent its last chunk is an error that says how many tokens came; else the
        sink finishes (``cached``: the prompt-cache hit the last chunk said, if any)."""
        if gen.cancelled.is_set():
            return
        if not last_chunk:
            msg = f"{self.base_url} ended its stream after {count} generated tokens without its last chunk."
            raise ServerError(msg)
        gen.sink.finish(cached)
