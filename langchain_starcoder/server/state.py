"""The server's state: the engine (or its loading), the tenants (API keys), settings, and how a route answers
errors."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from .._tokens import max_text_chars
from ..editor import Document, EditorSessions
from ..engine import StarCoderEngine
from ..errors import StarCoderError
from ..fim.build import FIMPrompt
from ..fim.request import FIMRequest
from ..types import Completion, is_int
from .adapters import Served, ServedAdapters
from .batcher import Batcher
from .errors import APIError, api_error, error_response
from .tenants import Tenants, partition, request_salt

logger = logging.getLogger(__name__)


class ServerState:
    """The engine (or its loading) and the server's settings, shared by the handlers."""

    def __init__(
        self,
        engine: StarCoderEngine | Callable[[], StarCoderEngine],
        api_keys: Iterable[str] | None,
        parse_special_tokens: bool,
        model_name: str | None,
        batch_window_ms: float,
        max_body_bytes: int,
        repo: Any = None,
        prompt_lookup: int | None = None,
        supersede: bool = True,
        fim_mode: str = "psm",
        stable_prefix: bool = True,
        adapters: Mapping[str, str | os.PathLike[str]] | None = None,
    ):
        #: The adapters served beside the base, by name (adapters.py): made once the base is ready.
        self.adapters = ServedAdapters(adapters)
        self.batcher = Batcher(batch_window_ms / 1000) if batch_window_ms > 0 else None
        self.engine: StarCoderEngine | None = None
        self.load_error: BaseException | None = None
        self.loader = None if isinstance(engine, StarCoderEngine) else engine
        #: The API keys, each a tenant (none: one tenant, no key needed); tenants.py.
        self.tenants = Tenants(api_keys or ())
        self.parse_special_tokens = parse_special_tokens
        self.model_name = model_name
        self.created = int(time.time())
        self.max_body_bytes = max_body_bytes
        #: The RepoIndex whose context FIM requests with a ``file_path`` get (None: no repository context).
        self.repo = repo
        #: Requests' ``prompt_lookup_num_tokens`` unless they set their own (None: the engine's default).
        self.prompt_lookup = prompt_lookup
        #: The editors' documents (each partition's own): supersession, context order, stable prefix, and
        #: the FIM layout of /infill and /v1/completions with a suffix ("psm" or "spm"); editor/.
        self.sessions = EditorSessions(supersede=supersede, stable_prefix=stable_prefix, fim_mode=fim_mode)
        #: The most characters a text can have and still fit the context window (None: no bound).
        self.max_text_chars: int | None = None
        if isinstance(engine, StarCoderEngine):
            self._ready(engine)

    def _ready(self, engine: StarCoderEngine) -> None:
        self.max_text_chars = max_text_chars(engine.tokenizer, engine.context_window)
        self.adapters.build(engine, self.model_name or engine.name)
        self.engine = engine  # last: requests are served from here on

    def served(self) -> Served:
        """The base model, ready (503 while it loads)."""
        return Served(self.ready(), self.name)

    def by_model(self, body: dict[str, Any]) -> Served:
        """What an OpenAI request's ``model`` field runs: the base or one of the adapters (adapters.py)."""
        return self.adapters.by_model(self.served(), body)

    def by_lora(self, body: dict[str, Any]) -> Served:
        """What a llama.cpp request's ``lora`` field runs: the base or one of the adapters (adapters.py)."""
        return self.adapters.by_lora(self.served(), body)

    def with_repo_context(self, engine: StarCoderEngine, request: FIMRequest, max_tokens: Any) -> FIMRequest:
        """``request`` with the served repository's context for its ``file_path`` after the client's own
        files, in the budget they leave; as it is without ``--repo`` or ``file_path`` (a request with no
        file has nothing to relate the repository to). Blocking: call it in a thread."""
        if self.repo is None or not request.file_path or not is_int(max_tokens):
            return request  # a bad max_tokens is refused by the generation, in its own words
        return engine.add_repo_context(dataclasses.replace(request, repo=self.repo), max_tokens)

    def editor_request(
        self, engine: StarCoderEngine, request: FIMRequest, max_tokens: Any, document: Document | None
    ) -> tuple[FIMRequest, list[int], FIMPrompt | None]:
        """A FIM request of /infill or /v1/completions as it is run (:meth:`EditorSessions.prepare
        <langchain_starcoder.editor.EditorSessions.prepare>` with the repository's context): the request,
        the order of its files after :meth:`with_repo_context`, and its prompt when built there, else None.
        Blocking: call it in a thread."""

        def add_context(request: FIMRequest) -> FIMRequest:
            return self.with_repo_context(engine, request, max_tokens)

        prepared = self.sessions.prepare(engine, request, max_tokens, document, add_context)
        return prepared.request, prepared.order, prepared.prompt

    @property
    def name(self) -> str:
        return self.model_name or (self.engine.name if self.engine is not None else "starcoder")

    # --- lifecycle: load in a thread so /health answers 503 meanwhile -----------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        loading = None
        if self.loader is not None:
            loading = threading.Thread(target=self._load, args=(app,), name="starcoder-load", daemon=True)
            loading.start()
        try:
            yield
        finally:
            if loading is not None:
                await asyncio.to_thread(loading.join)
            self.adapters.close()  # the server made them
            if loading is not None and self.engine is not None:  # the server loaded the engine: it closes it
                self.engine.close()

    def _load(self, app: Starlette) -> None:
        """Load the engine and its served adapters; on failure keep the reason for the answers (500) and
        log it, or hand it to ``app.state.on_load_error(error)`` when set: how ``serve`` stops (uvicorn has
        no way for an app to end its server), saying the reason once, itself."""
        assert self.loader is not None
        engine = None
        try:
            engine = self.loader()
            self._ready(engine)
        except BaseException as e:
            if engine is not None:  # its adapters failed: the base is closed here, nothing serves it
                engine.close()
            self.load_error = e
            on_load_error = getattr(app.state, "on_load_error", None)
            if on_load_error is None:
                logger.error("Loading the model failed: %s", e, exc_info=not isinstance(e, StarCoderError))
            else:
                on_load_error(e)

    def ready(self) -> StarCoderEngine:
        if self.engine is not None:
            return self.engine
        if self.load_error is not None:
            # The package's errors say what to fix; another's text (any path, any secret) stays in the log.
            error = self.load_error
            why = error if isinstance(error, StarCoderError) else "the server's log says why."
            raise APIError(500, f"The model failed to load: {why}", kind="server_error")
        raise APIError(503, "The model is loading; try again shortly.", kind="unavailable_error")

    def route(
        self, handler: Callable[[ServerState, Request], Awaitable[Response]], *, auth: bool = True
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                if auth:
                    request.state.tenant = self.tenants.tenant_of(request)
                return await handler(self, request)
            except Exception as e:
                return error_response(api_error(e))

        return endpoint

    @staticmethod
    def partition(request: Request, body: dict[str, Any]) -> str | None:
        """The request's partition (its tenant and ``cache_salt``, tenants.py): the ``cache_salt`` of each
        engine call it makes and the partition of its documents. None: the engine's own cache (a server
        without keys, a request without a salt)."""
        return partition(request.state.tenant, request_salt(body))

    async def generate(self, engine: StarCoderEngine, prompt: Any, settings: dict[str, Any]) -> Completion:
        """One non-streamed generation: alone, or in a batch with others when batching is on. Seeded
        sampling runs alone: a seed reproduces an answer only there (a batch shares the random state)."""
        if self.batcher is None or _seeded_sampling(settings):
            return await engine.agenerate(prompt, **settings)
        return await self.batcher.generate(engine, prompt, settings)

    async def generate_all(
        self, engine: StarCoderEngine, prompts: list[Any], settings: dict[str, Any]
    ) -> list[Completion]:
        """Several prompts of one request: one batch, or one after another for seeded sampling."""
        if _seeded_sampling(settings):
            return [await engine.agenerate(prompt, **settings) for prompt in prompts]
        return await engine.agenerate_batch(prompts, **settings)


def _seeded_sampling(settings: dict[str, Any]) -> bool:
    return settings.get("seed") is not None and settings.get("temperature") != 0
