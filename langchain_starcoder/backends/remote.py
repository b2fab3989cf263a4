"""The remote backend: a serving engine given token ids, streaming token ids back.

Why one file: the two protocols below share the transport (client, pool, retries, cancel, errors) and
differ only in a request body and the reading of a stream.

The front keeps everything about text (tokenizer, FIM and chat prompts, budgets, stop strings,
detokenization, counts) and sends the server **token ids**, never text: a server re-tokenizes text
with special-token parsing on, so a ``<file_sep>`` inside a user's file would become a control token.

Two protocols, chosen at connect from what ``/v1/models`` reports:

- llama.cpp's ``llama-server``: its native ``/completion``, which takes a list of ids as ``prompt``
  and, with ``return_tokens``, streams each generated token's id (its ``/v1/completions`` streams
  text only). ``timings_per_token`` puts the prompt-cache hit (``cache_n``) on the first chunk.
- vLLM (and servers that speak its protocol): ``/v1/completions`` with the ids as ``prompt`` and
  ``return_token_ids``, which streams each chunk's new ids (and echoes the prompt's ids once);
  ``stream_options.include_usage`` brings the prompt-cache hit (``cached_tokens``, when the server
  runs with ``--enable-prompt-tokens-details``) in the last chunk.

One HTTP stream per generation runs on a small thread pool; the server batches concurrent streams
itself.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import httpx

from ..errors import EngineClosedError, InvalidParameterError, StarCoderError
from ..types import PENALTY_CONTEXT, GenerationParams
from . import Generation

_BACKOFF = 0.25  # seconds before the first retry; doubled for each next one
#: The most ids llama.cpp may hold back at once (its text ends inside a UTF-8 character: a few tokens,
#: more only for a run of stray lead bytes); a larger gap is refused (rebuilding costs gap * piece).
MAX_WITHHELD = 64
_MAX_LINE = 1 << 24  # bytes of one server-sent line, or of an answer's body, before it is refused
T = TypeVar("T", bytes, str)


class ServerError(StarCoderError):
    """The server answered with an error, or something that is not its protocol."""


class ServerUnavailableError(ServerError, ConnectionError):
    """The server could not be reached (or stayed busy) after the retries."""


class ServerTimeoutError(ServerError, TimeoutError):
    """The server sent no token for ``timeout`` seconds, or a request ran past its ``deadline``."""


class _Retry(Exception):
    """A failure before the first token that is worth another try (connect error, 503)."""


class _Expired(Exception):
    """One of a request's time bounds ran out: its argument says which ("timeout" or "deadline")."""


class _Clock:
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


class RemoteBackend:
    """A model served by llama.cpp's ``llama-server`` or vLLM, reached over HTTP with token ids.

    Args:
        base_url: The server's root, e.g. ``http://127.0.0.1:8080`` (a trailing ``/v1`` is dropped).
        model: The served model's name (``llama-server --alias``, ``vllm serve --served-model-name``),
            checked against ``/v1/models``.
        api_key: Sent as ``Authorization: Bearer ...``; never logged or shown.
        timeout: Seconds the server may go without sending a token: from the request to the first
            (connecting, prefilling) and between tokens. Keep-alive comments do not count.
        deadline: Seconds one request may take in all, retries included, however the server keeps
            it going; None: no bound. A server silent at the deadline is ended within ``timeout``.
        max_retries: Retries of a connect error or a 503 before the first token, with backoff.
        max_concurrency: Requests in flight at once; more wait in line.
        vocab_size, context_length: What the tokenizer's checkpoint says; a server whose model
            differs is refused at connect.
        token_bytes: The bytes of each (non-special) token -> its id, for a byte-level BPE
            vocabulary. llama.cpp does not stream a token whose text ends inside a UTF-8 character;
            the next chunk carries the whole character's text, from which its ids are rebuilt
            exactly. Where the model wrote invalid UTF-8 (llama-server sends U+FFFD) or ended inside
            a character, the ids are lost: tokens that show the same text stand in (same count).
    """

    path = None  # no local checkpoint folder

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        deadline: float | None = None,
        max_retries: int = 2,
        max_concurrency: int = 16,
        vocab_size: int | None = None,
        context_length: int | None = None,
        token_bytes: Mapping[bytes, int] | None = None,
    ):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            msg = f"base_url must be an http:// or https:// URL, not {base_url!r}."
            raise InvalidParameterError(msg)
        for name, seconds in (("timeout", timeout), ("deadline", deadline)):
            if not (seconds is None and name == "deadline") and not _positive(seconds):
                msg = f"{name} must be a positive number of seconds, not {seconds!r}."
                raise InvalidParameterError(msg)
        if not isinstance(max_retries, int) or max_retries < 0:
            msg = f"max_retries must be an integer >= 0, not {max_retries!r}."
            raise InvalidParameterError(msg)
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.name = model
        self.max_retries = max_retries
        self.timeout, self.deadline = timeout, deadline
        self._token_bytes = dict(token_bytes or {})
        self._id_bytes = {i: b for b, i in self._token_bytes.items()}
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=_Clock(timeout, None).limits(),  # each request passes its own
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
        )
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="starcoder-remote")
        self._live: set[Generation] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._vllm = False  # which protocol: set by the connect check
        try:
            self.vocab_size, self.context_window = self._check_server(vocab_size, context_length)
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:  # the api key stays out of it
        return f"RemoteBackend(base_url={self.base_url!r}, model={self.model!r})"

    # --- connect -----------------------------------------------------------------------------------

    def _check_server(self, vocab_size: int | None, context_length: int | None) -> tuple[int, int]:
        """The served model's vocabulary size and the context a request may use, checked against
        the tokenizer's checkpoint (``/v1/models`` and llama.cpp's ``/props``)."""
        models = self._get_json("/v1/models").get("data")
        if not isinstance(models, list):
            msg = f"{self.base_url}/v1/models lists no models ('data' is {str(models)[:100]!r})."
            raise ServerError(msg)
        served = {m.get("id"): m for m in models if isinstance(m, dict)}
        if self.model not in served:
            msg = (
                f"{self.base_url} serves {sorted(map(str, served))}, not {self.model!r}; pass one "
                "of those as model (llama-server: --alias NAME)."
            )
            raise ServerError(msg)
        card = served[self.model]
        meta = card.get("meta")
        if not isinstance(meta, dict) and card.get("max_model_len") is not None:
            max_model_len = self._number(card["max_model_len"], "max_model_len", low=1)
            return self._check_vllm(max_model_len, vocab_size, context_length)
        props = self._get_json("/props").get("default_generation_settings")
        if (
            not isinstance(meta, dict)
            or not isinstance(props, dict)
            or "n_vocab" not in meta
            or "n_ctx" not in props
        ):
            msg = (
                f"{self.base_url} does not report its context (max_model_len in /v1/models, or "
                "llama.cpp's /props): is it vLLM or llama.cpp's llama-server?"
            )
            raise ServerError(msg)
        n_vocab = self._number(meta["n_vocab"], "n_vocab", low=1)
        n_ctx = self._number(props["n_ctx"], "n_ctx", low=1)
        n_ctx_train = meta.get("n_ctx_train")
        n_ctx_train = None if n_ctx_train is None else self._number(n_ctx_train, "n_ctx_train", low=1)
        for what, server, ours in (("vocabulary size", n_vocab, vocab_size),
                                   ("training context length", n_ctx_train, context_length)):  # fmt: skip
            if ours is not None and server is not None and server != ours:
                msg = (
                    f"{self.base_url} serves {self.model!r} with a {what} of {server}, but the "
                    f"tokenizer's checkpoint has {ours}: they are not the same model."
                )
                raise ServerError(msg)
        return n_vocab, n_ctx  # a request may use a slot's context (llama-server -c / -np)

    def _check_vllm(
        self, max_model_len: int, vocab_size: int | None, context_length: int | None
    ) -> tuple[int, int]:
        """vLLM reports the context a request may use (``max_model_len``) but not its vocabulary: a
        context longer than the checkpoint's is another model (or one stretched beyond its training)."""
        if context_length is not None and max_model_len > context_length:
            msg = (
                f"{self.base_url} serves {self.model!r} with a context of {max_model_len} tokens, but the "
                f"tokenizer's checkpoint has {context_length}: they are not the same model."
            )
            raise ServerError(msg)
        self._vllm = True
        return vocab_size or len(self._id_bytes), max_model_len

    def _get_json(self, path: str) -> dict[str, Any]:
        clock = _Clock(self.timeout, self.deadline)
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

    def _number(
        self, value: Any, what: str, high: float | None = None, *, low: float = 0, real: bool = False
    ) -> Any:
        """A number the server sent, checked: an integer (``real``: any number, with a ``high``),
        never a bool, from ``low`` to ``high``; anything else is a ServerError that names it."""
        kinds = (int, float) if real else (int,)
        top = math.inf if high is None else high
        if isinstance(value, kinds) and not isinstance(value, bool) and low <= value <= top:
            return value
        bounds = f"from {low} to {high}" if high is not None else f">= {low}"
        msg = (
            f"{self.base_url} sent an impossible {what}: {repr(value)[:100]} (expected "
            f"{'a number' if real else 'an integer'} {bounds}); is it the server and model connected to?"
        )
        raise ServerError(msg)

    # --- the backend contract ------------------------------------------------------------------

    def submit(self, generations: Sequence[Generation]) -> Future[None]:
        gens = list(generations)
        done: Future[None] = Future()
        done.set_running_or_notify_cancel()
        left = [len(gens)]
        errors: list[BaseException] = []

        def run(gen: Generation) -> None:
            try:
                self._run(gen)
            except BaseException as e:
                errors.append(e)
            finally:
                with self._lock:
                    self._live.discard(gen)
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    done.set_exception(errors[0]) if errors else done.set_result(None)

        with self._lock:
            if self._closed:
                msg = f"The engine for {self.name} at {self.base_url} is closed; connect a new one."
                raise EngineClosedError(msg)
            self._live.update(gens)
            for gen in gens:  # one stream each: the server batches concurrent requests
                self._pool.submit(run, gen)
        return done

    def logits(self, token_ids: Sequence[int]) -> Any:
        msg = f"{self.base_url} serves {self.name}: a remote backend does not return logits."
        raise StarCoderError(msg)

    def clear_cache(self) -> None:
        """The server manages its prompt cache; nothing is held here."""

    @property
    def prompt_cache_bytes(self) -> int:
        return 0

    def close(self) -> None:
        """Cancel what is running (its HTTP streams close) and free the connections."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live = list(self._live)
        for gen in live:
            gen.cancelled.set()
        self._pool.shutdown(wait=True)  # each stream sees its cancel at its next event
        self._client.close()

    # --- one generation (on a pool thread) -----------------------------------------------------

    def _run(self, gen: Generation) -> None:
        if self._vllm:
            path, body = "/v1/completions", vllm_request_body(self.model, gen.prompt, gen.params)
        else:
            path, body = "/completion", request_body(gen.prompt, gen.params)
        clock = _Clock(self.timeout, self.deadline)
        for attempt in range(self.max_retries + 1):
            if gen.cancelled.is_set():
                return
            clock.progress()  # each try may wait the whole silence bound
            try:
                clock.check()
                with self._client.stream("POST", path, json=body, timeout=clock.limits()) as response:
                    if response.status_code >= 400:
                        error = self._http_error(response, self._body(response, clock))
                        raise _Retry(error) if response.status_code == 503 else error
                    # leaving the block closes the stream
                    relay = self._relay_vllm if self._vllm else self._relay
                    relay(gen, response, clock)
                return
            except (httpx.ConnectError, httpx.ConnectTimeout, _Retry) as e:
                if attempt == self.max_retries:
                    raise self._unreachable(e) from None
            except (httpx.TimeoutException, _Expired) as e:  # no answer in time (prefill or a hung server)
                raise self._timeout(path, clock.which(e), 0) from None
            except httpx.TransportError as e:
                msg = f"The connection to {self.base_url} broke before the first token ({e!r})."
                raise ServerError(msg) from None
            if gen.cancelled.wait(min(_BACKOFF * 2**attempt, clock.left())):  # a cancel ends the wait
                return

    def _relay(self, gen: Generation, response: httpx.Response, clock: _Clock) -> None:
        """Hand each streamed id to the sink until it, the server or the budget ends it."""
        started = False
        count = 0
        with self._stream_errors("/completion", clock, lambda: count):
            for event in self._events(response, "/completion", clock):
                if gen.cancelled.is_set():
                    return  # returning closes the HTTP stream: the server stops generating
                if not started:
                    gen.sink.start(
                        self._cached(event, gen.prompt), prompt_seconds=self._prompt_seconds(event, clock)
                    )
                    started = True
                ids = self._ids(
                    event.get("tokens"), event, "it needs a llama-server that supports return_tokens"
                )
                predicted = event.get("tokens_predicted")
                if predicted is not None:  # llama.cpp counts what it generated, held-back ids included
                    predicted = self._number(predicted, "tokens_predicted", gen.params.max_tokens)
                gap = predicted - count - len(ids) if predicted is not None else 0
                if gap > MAX_WITHHELD:
                    msg = (
                        f"{self.base_url} held back {gap} token ids at once; a character split across "
                        f"tokens accounts for at most {MAX_WITHHELD}."
                    )
                    raise ServerError(msg)
                if gap > 0 and ids:
                    ids = self._withheld(event, ids, gap) + ids
                elif gap > 0 and event.get("stop"):  # it ended inside a character: those ids never came
                    ids = self._stand_ins(gap)
                if ids:
                    clock.progress()
                for token in ids:
                    count += 1
                    if gen.sink.token(token) or count >= gen.params.max_tokens:
                        gen.sink.finish()
                        return
                if event.get("stop"):
                    break
            else:  # the body ended without the server's last chunk
                msg = (
                    f"{self.base_url} ended its stream after {count} generated tokens without its last chunk."
                )
                raise ServerError(msg)
        if not started:
            gen.sink.start(0, prompt_seconds=None)
        if not gen.cancelled.is_set():
            gen.sink.finish()

    def _relay_vllm(self, gen: Generation, response: httpx.Response, clock: _Clock) -> None:
        """Hand each streamed id to the sink; at the server's own end, read on to the usage chunk."""
        count, cached, started, ended = 0, None, False, False
        with self._stream_errors("/v1/completions", clock, lambda: count):
            for event in self._events(response, "/v1/completions", clock):
                if gen.cancelled.is_set():
                    return  # returning closes the HTTP stream: the server stops generating
                usage = event.get("usage")
                if isinstance(usage, dict):
                    cached = self._vllm_cached(usage, gen.prompt)
                for choice in self._choices(event):
                    if not started:
                        self._check_echo(choice, gen.prompt)
                        gen.sink.start(0, prompt_seconds=None)  # vLLM does not say how long the prompt took
                        started = True
                    ids = self._ids(
                        choice.get("token_ids"), event, "it needs vLLM >= 0.10.2 (return_token_ids)"
                    )
                    if ids:
                        clock.progress()
                    for token in ids[: gen.params.max_tokens - count]:
                        count += 1
                        if gen.sink.token(token):
                            gen.sink.finish()  # a stop of ours: leave now, the server stops with us
                            return
                    ended = ended or choice.get("finish_reason") is not None
        if not ended:
            msg = f"{self.base_url} ended its stream after {count} generated tokens without its last chunk."
            raise ServerError(msg)
        if not started:
            gen.sink.start(0, prompt_seconds=None)
        if not gen.cancelled.is_set():
            gen.sink.finish(cached)

    def _choices(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        choices = event.get("choices") or []
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            msg = f"{self.base_url} streamed a chunk whose 'choices' are not objects: {str(event)[:200]}"
            raise ServerError(msg)
        return choices

    def _ids(self, ids: Any, event: dict[str, Any], needs: str) -> list[int]:
        """A chunk's token ids, each checked to be in the vocabulary."""
        if not isinstance(ids, list):
            msg = f"{self.base_url} did not stream token ids (none in {str(event)[:200]}); {needs}."
            raise ServerError(msg)
        top = self.vocab_size - 1
        return [self._number(token, "token id", top) for token in ids]

    def _cached(self, event: dict[str, Any], prompt: list[int]) -> int:
        """llama.cpp's prompt-cache hit (``timings.cache_n``), at most the prompt."""
        timings = event.get("timings")
        cached = timings.get("cache_n") if isinstance(timings, dict) else None
        return 0 if cached is None else self._number(cached, "timings.cache_n", len(prompt))

    def _prompt_seconds(self, event: dict[str, Any], clock: _Clock) -> float | None:
        """llama.cpp's prefill time (``timings.prompt_ms``), at most the time since the request; None
        where the server does not say."""
        timings = event.get("timings")
        ms = timings.get("prompt_ms") if isinstance(timings, dict) else None
        if ms is None:
            return None
        elapsed_ms = (time.monotonic() - clock.started) * 1000
        return self._number(ms, "timings.prompt_ms", elapsed_ms, real=True) / 1000

    def _vllm_cached(self, usage: dict[str, Any], prompt: list[int]) -> int | None:
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return None if cached is None else self._number(cached, "cached_tokens", len(prompt))

    def _check_echo(self, choice: dict[str, Any], prompt: list[int]) -> None:
        """The server's echo of the prompt's ids must be the ids sent (never re-tokenized text)."""
        echoed = choice.get("prompt_token_ids")
        if echoed is not None and echoed != prompt:
            shown = len(echoed) if isinstance(echoed, list) else repr(echoed)[:50]
            msg = (
                f"{self.base_url} ran other prompt ids than were sent ({shown} for {len(prompt)}): "
                "it re-tokenized the prompt, so control-token safety would not hold."
            )
            raise ServerError(msg)

    @contextlib.contextmanager
    def _stream_errors(self, path: str, clock: _Clock, count: Callable[[], int]) -> Iterator[None]:
        """A timeout or a broken connection mid-stream as one clear error (never retried)."""
        try:
            yield
        except (httpx.TimeoutException, _Expired) as e:
            raise self._timeout(path, clock.which(e), count()) from None
        except httpx.TransportError as e:
            msg = f"The connection to {self.base_url} broke after {count()} generated tokens ({e!r})."
            raise ServerError(msg) from None

    @functools.cached_property
    def _by_text(self) -> dict[str, int]:
        """What a token shows (invalid bytes as U+FFFD) -> its id: built only if a stream needs it."""
        by_text: dict[str, int] = {}
        for i, b in sorted(self._id_bytes.items()):
            by_text.setdefault(b.decode("utf-8", "replace"), i)
        return by_text

    @functools.cached_property
    def _longest(self) -> int:
        """The longest token's bytes (no token shows more characters than it has bytes)."""
        return max(map(len, self._token_bytes), default=0)

    def _withheld(self, event: dict[str, Any], ids: list[int], missing: int) -> list[int]:
        """The ids of the ``missing`` tokens llama.cpp held back because their text ended inside a
        UTF-8 character: the chunk's ``content`` is their bytes followed by those of ``ids``."""
        text = event.get("content")
        tail = b"".join(self._id_bytes.get(i, b"") for i in ids)  # control tokens show no text
        data = text.encode("utf-8") if isinstance(text, str) else b""
        head = data[: len(data) - len(tail)] if data.endswith(tail) else None
        found = _split(head, missing, self._token_bytes, self._longest) if head is not None else None
        shown = tail.decode("utf-8", "replace")
        if found is None and isinstance(text, str) and text.endswith(shown) and "\ufffd" in text:
            # The model wrote invalid UTF-8, which llama-server sends as U+FFFD: the ids are lost.
            # Stand-ins: tokens that show the same text (U+FFFD included), else lone 0xFF bytes.
            shown_head = text[: len(text) - len(shown)]
            found = _split(shown_head, missing, self._by_text, self._longest) or self._stand_ins(missing)
        if found is None:
            msg = (
                f"{self.base_url} held back {missing} token ids (text ending inside a UTF-8 character) "
                "and they could not be rebuilt from the streamed text."
            )
            raise ServerError(msg)
        return found

    def _stand_ins(self, count: int) -> list[int]:
        if b"\xff" not in self._token_bytes:
            msg = (
                f"{self.base_url} ended inside a UTF-8 character without sending its last {count} token ids."
            )
            raise ServerError(msg)
        return [self._token_bytes[b"\xff"]] * count

    def _events(self, response: httpx.Response, path: str, clock: _Clock) -> Iterator[dict[str, Any]]:
        """The JSON objects of a server-sent-event stream (``data: {...}`` lines)."""
        for line in self._lines(response, clock):
            if not line.strip() or line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value.strip()
            if field == "error" or (field == "data" and value.startswith('{"error"')):
                msg = f"{self.base_url} failed mid-stream: {_message(self._json(value, 'error'))}"
                raise ServerError(msg)
            if field != "data" or value == "[DONE]":
                continue
            yield self._json(value, path)

    def _lines(self, response: httpx.Response, clock: _Clock) -> Iterator[str]:
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

    def _body(self, response: httpx.Response, clock: _Clock) -> str:
        """A whole (short) answer: a JSON object or an error's text."""
        data = bytearray()
        for chunk in self._chunks(response, clock):
            data += chunk
            self._bounded(len(data), response)
        return data.decode("utf-8", "replace")

    def _chunks(self, response: httpx.Response, clock: _Clock) -> Iterator[bytes]:
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
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, dict):
            msg = f"{self.base_url}{what} answered something that is not a JSON object: {text[:200]!r}"
            raise ServerError(msg)
        return value

    def _http_error(self, response: httpx.Response, text: str) -> ServerError:
        try:
            detail = _message(json.loads(text))
        except json.JSONDecodeError:
            detail = text.strip()[:300] or response.reason_phrase
        msg = f"{self.base_url} answered {response.status_code} to {response.request.url.path}: {detail}"
        return ServerError(msg)

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


def request_body(prompt: list[int], params: GenerationParams) -> dict[str, Any]:
    """llama.cpp's ``/completion`` request: the prompt as ids and our sampling settings, with its
    other samplers turned off. Stop strings stay with the front (they need our detokenizer)."""
    return {
        "prompt": prompt,
        "n_predict": params.max_tokens,
        "stream": True,
        "return_tokens": True,
        "timings_per_token": True,  # the prompt-cache hit comes with the first token
        "cache_prompt": True,  # reuse the slot's KV cache for a shared prefix
        "temperature": params.temperature,  # below GREEDY_BELOW already 0 (greedy)
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,  # llama.cpp's default is 0.05, ours 0: always sent
        "repeat_penalty": params.repetition_penalty or 1.0,
        "repeat_last_n": PENALTY_CONTEXT,
        "seed": -1 if params.seed is None else params.seed % 2**32,  # llama.cpp seeds are 32-bit
        "typical_p": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "dry_multiplier": 0.0,
        "xtc_probability": 0.0,
        "mirostat": 0,
    }


def vllm_request_body(model: str, prompt: list[int], params: GenerationParams) -> dict[str, Any]:
    """vLLM's ``/v1/completions`` request: the prompt as ids, ids streamed back, our sampling settings
    (vLLM's repetition penalty looks at the whole prompt and output, not the last 20 tokens)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": params.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "temperature": params.temperature,  # below GREEDY_BELOW already 0 (greedy)
        "top_p": params.top_p,
        "top_k": params.top_k or -1,  # -1: off, in every vLLM version
        "min_p": params.min_p,
        "repetition_penalty": params.repetition_penalty or 1.0,
        "stop_token_ids": sorted(params.stop_token_ids),
        "skip_special_tokens": False,
    }
    if params.seed is not None:
        body["seed"] = params.seed
    return body


def _split(data: T, count: int, pieces: Mapping[T, int], longest: int) -> list[int] | None:
    """``count`` token ids whose pieces (bytes, or shown text; none longer than ``longest``) make up
    ``data``, taking the longest piece first where there is a choice, or None. Dynamic programming
    over positions: ``ends[p]`` has bit ``c`` set when ``data[p:]`` is ``c`` pieces (O(len * longest))."""
    size = len(data)
    if size > count * longest:
        return None
    ends = [0] * (size + 1)
    ends[size] = 1  # the empty rest is 0 pieces
    mask = (1 << (count + 1)) - 1
    for p in range(size - 1, -1, -1):
        bits = 0
        for end in range(p + 1, min(size, p + longest) + 1):
            if ends[end] and data[p:end] in pieces:
                bits |= ends[end] << 1
        ends[p] = bits & mask
    if not ends[0] >> count & 1:
        return None
    ids, p = [], 0
    for left in range(count - 1, -1, -1):  # pieces still to take after this one
        end = next(
            e for e in range(min(size, p + longest), p, -1) if ends[e] >> left & 1 and data[p:e] in pieces
        )
        ids.append(pieces[data[p:end]])
        p = end
    return ids


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf


def _message(body: Any) -> str:
    """The human part of an error body: llama.cpp's and OpenAI's ``{"error": {"message": ...}}``."""
    error = body.get("error", body) if isinstance(body, dict) else body  # older vLLM: the body itself
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])
    return str(error)[:300]
