"""The remote backend: a model on a serving engine, given token ids and streaming token ids back.

It ties the pieces together: the transport, the protocol the server speaks (chosen at connect from what
``/v1/models`` reports), and the backend contract (submit, cancel, close). One HTTP stream per
generation runs on a small thread pool; the server batches concurrent streams itself.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ...errors import EngineClosedError, InvalidParameterError, StarCoderError
from .. import Generation
from .errors import ServerError
from .llama_cpp import LlamaCpp
from .protocol import ServerProtocol
from .transport import Transport
from .validation import Validator
from .vllm import VLLM

#: ``owned_by`` in this package's own server's ``/v1/models`` (it runs StarCoder2's window exactly).
OUR_SERVER = "langchain-starcoder"


class ServerBackend:
    """What a backend over a server leaves to the server: its prompt cache (nothing is held here), and
    logits (a server does not return them); and closing once, under the lock its requests take."""

    name: str

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        """Close once (:meth:`_shut_down`); later calls do nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._shut_down()

    def _shut_down(self) -> None:
        raise NotImplementedError

    def logits(self, token_ids: Sequence[int]) -> Any:
        msg = f"{self.name} runs on a server, and a server's backend does not return logits."
        raise StarCoderError(msg)

    def clear_cache(self) -> None:
        """The server manages its prompt cache; nothing is held here."""

    @property
    def prompt_cache_bytes(self) -> int:
        return 0


class RemoteBackend(ServerBackend):
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
        sliding_window: StarCoder2's attention window. llama.cpp's StarCoder2 ignores it, so on a
            llama.cpp server a request may hold at most the window (exact answers), unless
            ``inexact_past_window`` is True.
        adapter: The name of a LoRA adapter a vLLM server serves over ``model`` (``--lora-modules``):
            requests name it as their ``model``. vLLM keys its prefix cache by the adapter, so no
            KV crosses between it and the base or another adapter.
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
        sliding_window: int | None = None,
        inexact_past_window: bool = False,
        adapter: str | None = None,
    ):
        super().__init__()
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
        self.adapter_name = adapter
        self.name = model
        self.max_retries = max_retries
        self.timeout, self.deadline = timeout, deadline
        self.sliding_window = sliding_window
        self._exact_window = sliding_window if sliding_window and not inexact_past_window else None
        self._transport = Transport(
            self.base_url,
            api_key=api_key,
            timeout=timeout,
            deadline=deadline,
            max_retries=max_retries,
            max_concurrency=max_concurrency,
        )
        self._check = Validator(self.base_url)
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="starcoder-remote")
        self._live: set[Generation] = set()
        try:
            self.vocab_size, self.context_window, self._protocol = self._check_server(
                vocab_size, context_length, token_bytes or {}
            )
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:  # the api key stays out of it
        return f"RemoteBackend(base_url={self.base_url!r}, model={self.model!r})"

    # --- connect -----------------------------------------------------------------------------------

    def _check_server(
        self, vocab_size: int | None, context_length: int | None, token_bytes: Mapping[bytes, int]
    ) -> tuple[int, int, ServerProtocol]:
        """The served model's vocabulary size and the context a request may use, checked against
        the tokenizer's checkpoint (``/v1/models`` and llama.cpp's ``/props``), and its protocol."""
        models = self._transport.get_json("/v1/models").get("data")
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
            max_model_len = self._check.number(card["max_model_len"], "max_model_len", low=1)
            self._check_vllm(max_model_len, context_length)
            vocab = vocab_size or len(set(token_bytes.values()))  # vLLM does not report it
            if self.adapter_name is not None:
                self._check_adapter(served, self.adapter_name)
            return vocab, max_model_len, VLLM(self._transport, vocab, self.adapter_name or self.model)
        if self.adapter_name is not None:
            msg = (
                f"adapter={self.adapter_name!r} names a LoRA adapter a vLLM server serves, but "
                f"{self.base_url} is not vLLM. Run the adapter with StarCoderEngine.load(M, "
                'backend="llama.cpp", adapter_path=DIR) (llama-server --lora), or serve the fused '
                "checkpoint (langchain-starcoder export-adapter --model M --adapter DIR --fused OUT) and "
                "connect to that without adapter."
            )
            raise InvalidParameterError(msg)
        props = self._transport.get_json("/props").get("default_generation_settings")
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
        n_vocab = self._check.number(meta["n_vocab"], "n_vocab", low=1)
        n_ctx = self._check.number(props["n_ctx"], "n_ctx", low=1)
        n_ctx_train = meta.get("n_ctx_train")
        n_ctx_train = None if n_ctx_train is None else self._check.number(n_ctx_train, "n_ctx_train", low=1)
        for what, server, ours in (
            ("vocabulary size", n_vocab, vocab_size),
            ("training context length", n_ctx_train, context_length),
        ):
            if ours is not None and server is not None and server != ours:
                msg = (
                    f"{self.base_url} serves {self.model!r} with a {what} of {server}, but the "
                    f"tokenizer's checkpoint has {ours}: they are not the same model."
                )
                raise ServerError(msg)
        # A request may use a slot's context (llama-server -c / -np), within the window llama.cpp ignores;
        # this package's own server speaks the same protocol and computes the window exactly.
        ours = card.get("owned_by") == OUR_SERVER
        exact = None if ours else self._exact_window
        context = n_ctx if exact is None else min(n_ctx, exact)
        return n_vocab, context, LlamaCpp(self._transport, n_vocab, token_bytes, salted=ours)

    def _check_adapter(self, served: Mapping[Any, dict[str, Any]], adapter: str) -> None:
        """``adapter`` must be listed by the vLLM server as an adapter of ``model`` (its ``parent``)."""
        card = served.get(adapter)
        if card is None:
            msg = (
                f"{self.base_url} serves {sorted(map(str, served))}, not the adapter {adapter!r}. Serve "
                "it with vLLM (langchain-starcoder export-adapter --model M --adapter DIR --peft PEFT_DIR, "
                f"then vllm serve M --enable-lora --lora-modules {adapter}=PEFT_DIR); where vLLM cannot "
                "apply it, serve the fused checkpoint (export-adapter --model M --adapter DIR --fused OUT, "
                "then vllm serve OUT) and connect to that without adapter."
            )
            raise ServerError(msg)
        parent = card.get("parent")
        if parent != self.model:
            what = "a model, not an adapter" if parent is None else f"an adapter of {parent!r}"
            msg = f"{adapter!r} on {self.base_url} is {what}; adapter must name an adapter of {self.model!r}."
            raise ServerError(msg)

    def _check_vllm(self, max_model_len: int, context_length: int | None) -> None:
        """vLLM reports the context a request may use (``max_model_len``) but not its vocabulary: a
        context longer than the checkpoint's is another model (or one stretched beyond its training)."""
        if context_length is not None and max_model_len > context_length:
            msg = (
                f"{self.base_url} serves {self.model!r} with a context of {max_model_len} tokens, but the "
                f"tokenizer's checkpoint has {context_length}: they are not the same model."
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

    def _shut_down(self) -> None:
        """Cancel what is running (its HTTP streams close) and free the connections."""
        with self._lock:  # closed: no generation is added any more
            live = list(self._live)
        for gen in live:
            gen.cancelled.set()
        self._pool.shutdown(wait=True)  # each stream sees its cancel at its next event
        self._transport.close()

    @property
    def json_whitespace(self) -> str | None:
        """The whitespace the server allows between JSON tokens (the front's verdict allows it too)."""
        return self._protocol.json_whitespace

    # --- one generation (on a pool thread) -----------------------------------------------------

    def _run(self, gen: Generation) -> None:
        protocol = self._protocol
        with protocol.request(gen) as body:
            relay = lambda response, clock: protocol.relay(gen, response, clock)  # noqa: E731
            self._transport.stream(protocol.path, body, gen.cancelled, relay)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf
