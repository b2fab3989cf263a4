"""An HTTP server over one engine: OpenAI-compatible completions and chat, and llama.cpp's ``/infill``.

One file: a Starlette app whose handlers translate request shapes into engine calls and back.

Endpoints:

- ``POST /v1/completions``: OpenAI's legacy completions. ``prompt`` is text, a list of token ids, or a
  list of either (run as one batch, not streamed). With ``suffix`` the middle between ``prompt`` and
  ``suffix`` is generated, as :meth:`StarCoderEngine.infill` does (FIM control tokens, suffix-overlap
  trim). A text prompt is data by default: control-token strings in it (``<fim_prefix>``,
  ``<|endoftext|>``) stay text. A server started with ``parse_special_tokens=True`` parses them, for
  clients that hand-write StarCoder prompts. Token-id prompts are taken as given.
- ``POST /v1/chat/completions``: for checkpoints with a chat template; message contents are data.
- ``POST /infill``: llama.cpp's request and response shape (llama.vim, llama.vscode). ``input_extra``
  files become StarCoder2's repository context with their real names; ``prompt`` (the text of the
  cursor's line before the cursor, as llama.vim sends it) is appended to ``input_prefix``.
- ``GET /health``, ``GET /v1/models``, ``POST /tokenize``, ``POST /detokenize``.
- llama.cpp's ``POST /completion`` (token-id prompts, streamed with ids) and ``GET /props``: so
  ``StarCoderEngine.connect("http://host:8080", model=...)`` drives this server like a llama-server.

Errors are OpenAI-shaped JSON (``{"error": {"message", "type", "param", "code"}}``): 400 for bad input,
401 without the API key when one is set, 413 when the prompt plus ``max_tokens`` pass the context
window, 503 while the model loads. Generation runs through the engine's async API, so the event loop
never blocks; a client that disconnects mid-stream cancels its generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

try:
    from sse_starlette import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
except ImportError as e:  # an optional extra: say how to get it
    msg = f"The server needs the 'server' extra ({e.name} is missing): pip install -e \".[server]\"."
    raise ImportError(msg, name=e.name) from e

from .chat import chat_prompt_ids, resolve_chat_template
from .engine import StarCoderEngine
from .errors import ContextLengthError, InvalidParameterError, StarCoderError
from .fim import fim_stop_token_ids
from .types import Completion, CompletionChunk, ContextFile, FIMRequest, is_int, join_chunks, usage

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: OpenAI's defaults for the legacy completions endpoint (``max_tokens`` 16, ``temperature`` 1).
OPENAI_MAX_TOKENS = 16
#: ``/infill`` without ``n_predict`` (or with llama.cpp's -1, "until done"): this many tokens at most.
INFILL_MAX_TOKENS = 256


class APIError(Exception):
    """A request the server answers with an error status and OpenAI's error body."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error", **extra: Any):
        super().__init__(message)
        self.status, self.kind, self.extra = status, kind, extra


def _bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def _error_response(e: APIError) -> JSONResponse:
    body = {"message": str(e), "type": e.kind, "param": e.extra.get("param"), "code": e.extra.get("code")}
    return JSONResponse({"error": body}, status_code=e.status)


def _api_error(e: BaseException) -> APIError:
    """The status and body for an exception raised while serving a request."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, ContextLengthError):
        return APIError(413, str(e), code="context_length_exceeded")
    if isinstance(e, InvalidParameterError):
        return APIError(400, str(e))
    if isinstance(e, StarCoderError):
        return APIError(500, str(e), kind="server_error")
    logger.exception("Unexpected error while serving a request")
    return APIError(500, f"Internal error: {type(e).__name__}", kind="server_error")


# --- reading requests ----------------------------------------------------------------------------------


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _bad(f"The request body is not valid JSON: {e}.") from e
    except RecursionError as e:
        raise _bad("The request body is nested too deeply.") from e
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.")
    return body


def _get(body: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    """``body[key]`` checked against ``kind`` (JSON null counts as absent)."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise _bad(f"{key} has the wrong type (bool).", key)
    if not isinstance(value, kind):
        raise _bad(f"{key} has the wrong type ({type(value).__name__}).", key)
    return value


def _include_usage(body: dict[str, Any]) -> bool:
    """OpenAI's ``stream_options.include_usage``: a last chunk with the usage."""
    return bool(_get(body, "stream_options", dict, {}).get("include_usage"))


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _bad(f"{what} must be a string, not {type(value).__name__}.", what)
    return value


def _settings(body: dict[str, Any], max_tokens: int, temperature: float) -> dict[str, Any]:
    """Generation settings from OpenAI-style fields (null means the default); the engine validates them."""
    settings: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature}
    for key in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "repetition_penalty"):
        if body.get(key) is not None:
            settings[key] = body[key]
    return settings


def _refuse_unsupported(body: dict[str, Any]) -> None:
    """OpenAI options this server does not implement: refused when set to anything but their default."""
    if body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
        raise _bad("Only n = 1 (and best_of = 1) is supported.", "n")
    if body.get("echo"):
        raise _bad("echo is not supported.", "echo")
    if body.get("logprobs") not in (None, False, 0):
        raise _bad("logprobs are not supported.", "logprobs")
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise _bad(f"{key} is not supported; use repetition_penalty.", key)
    if body.get("logit_bias"):
        raise _bad("logit_bias is not supported.", "logit_bias")


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(is_int(t) for t in value)


def _usage(done: list[Completion]) -> dict[str, Any]:
    """OpenAI's usage, cached tokens under ``prompt_tokens_details`` as OpenAI puts them."""
    counts = usage(done)
    cached = counts.pop("cached_tokens")
    return {**counts, "prompt_tokens_details": {"cached_tokens": cached}}


# --- the app -------------------------------------------------------------------------------------------


class _Server:
    """The handlers, the engine (or its loading) and the server's settings."""

    def __init__(
        self,
        engine: StarCoderEngine | Callable[[], StarCoderEngine],
        api_key: str | None,
        parse_special_tokens: bool,
        model_name: str | None,
        batch_window_ms: float,
    ):
        self.batcher = _Batcher(batch_window_ms / 1000) if batch_window_ms > 0 else None
        self.engine: StarCoderEngine | None = None
        self.load_error: BaseException | None = None
        self.loader: Callable[[], StarCoderEngine] | None = None
        if isinstance(engine, StarCoderEngine):
            self.engine = engine
        else:
            self.loader = engine
        self.api_key = api_key.encode() if api_key else None
        self.parse_special_tokens = parse_special_tokens
        self.model_name = model_name
        self.created = int(time.time())

    @property
    def name(self) -> str:
        return self.model_name or (self.engine.name if self.engine is not None else "starcoder")

    # --- lifecycle: load in a thread so /health answers 503 meanwhile -----------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        loading = None
        if self.loader is not None:
            loading = threading.Thread(target=self._load, name="starcoder-load", daemon=True)
            loading.start()
        try:
            yield
        finally:
            if loading is not None:  # the server loaded the engine, so it closes it
                await asyncio.to_thread(loading.join)
                if self.engine is not None:
                    self.engine.close()

    def _load(self) -> None:
        assert self.loader is not None
        try:
            self.engine = self.loader()
        except BaseException as e:
            logger.error("Loading the model failed: %s", e)
            self.load_error = e

    def ready(self) -> StarCoderEngine:
        if self.engine is not None:
            return self.engine
        if self.load_error is not None:
            msg = f"The model failed to load: {self.load_error}"
            raise APIError(500, msg, kind="server_error")
        raise APIError(503, "The model is loading; try again shortly.", kind="unavailable_error")

    def route(self, handler: Callable[[Request], Awaitable[Response]], *, auth: bool = True) -> Callable:
        async def endpoint(request: Request) -> Response:
            try:
                if auth:
                    self._check_key(request)
                return await handler(request)
            except Exception as e:
                return _error_response(_api_error(e))

        return endpoint

    def _check_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        # Constant-time comparison; the key itself never reaches a log or a message.
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), self.api_key):
            raise APIError(
                401, "A valid API key is needed (Authorization: Bearer KEY).", kind="authentication_error"
            )

    async def generate(self, engine: StarCoderEngine, prompt: Any, settings: dict[str, Any]) -> Completion:
        """One non-streamed generation: alone, or in a batch with others when batching is on."""
        if self.batcher is None:
            return await engine.agenerate(prompt, **settings)
        return await self.batcher.generate(engine, prompt, settings)

    # --- health, models, tokens -------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        self.ready()
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        engine = self.ready()
        model = {
            "id": self.name,
            "object": "model",
            "created": self.created,
            "owned_by": "langchain-starcoder",
            "context_window": engine.context_window,
            # llama.cpp's fields, which StarCoderEngine.connect checks against its tokenizer.
            "meta": {"n_vocab": engine.vocab_size, "n_ctx_train": engine.context_window},
        }
        return JSONResponse({"object": "list", "data": [model]})

    async def props(self, request: Request) -> Response:
        """llama.cpp's ``/props``: the context a request may fill (StarCoderEngine.connect reads it)."""
        engine = self.ready()
        return JSONResponse({"default_generation_settings": {"n_ctx": engine.context_window}})

    async def completion(self, request: Request) -> Response:
        """llama.cpp's ``/completion`` for token-id prompts, streamed with each chunk's ids: what
        ``StarCoderEngine.connect`` speaks. The client keeps its stop strings; this engine ends at
        end-of-text only."""
        engine = self.ready()
        body = await _body(request)
        ids = body.get("prompt")
        if not _is_ids(ids):
            raise _bad("/completion takes the prompt as a list of token ids.", "prompt")
        if not _get(body, "stream", bool, False) or not _get(body, "return_tokens", bool, False):
            raise _bad("/completion answers stream=true with return_tokens=true only.", "stream")
        settings = _llama_settings(body, _get(body, "n_predict", int, INFILL_MAX_TOKENS))
        stream = engine.astream(ids, **settings)
        predicted = 0

        def events(c: CompletionChunk) -> list[dict[str, Any]]:
            nonlocal predicted
            predicted += len(c.token_ids)
            event = {"content": c.text, "tokens": c.token_ids, "tokens_predicted": predicted}
            event["stop"] = c.finish_reason is not None
            if c.finish_reason is not None:
                event["timings"] = {"cache_n": c.cached_tokens or 0, "prompt_n": c.prompt_tokens}
            return [event]

        return await _sse(request, stream, events, done_marker=False)

    async def tokenize(self, request: Request) -> Response:
        engine = self.ready()
        body = await _body(request)
        content = _text(body.get("content"), "content")
        parse = _get(body, "parse_special", bool, self.parse_special_tokens)
        ids = await asyncio.to_thread(engine.encode, content, special_tokens=parse)
        return JSONResponse({"tokens": ids})

    async def detokenize(self, request: Request) -> Response:
        engine = self.ready()
        body = await _body(request)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(is_int(t) for t in ids):
            raise _bad("tokens must be a list of token ids (integers).", "tokens")
        bad = [t for t in ids if not 0 <= t < engine.vocab_size]
        if bad:
            raise _bad(f"Token ids {bad[:5]} are outside the vocabulary [0, {engine.vocab_size}).", "tokens")
        return JSONResponse({"content": await asyncio.to_thread(engine.decode, ids)})

    # --- /v1/completions --------------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        engine = self.ready()
        body = await _body(request)
        _refuse_unsupported(body)
        settings = _settings(body, OPENAI_MAX_TOKENS, 1.0)
        prompts = await asyncio.to_thread(self._completion_prompts, engine, body)  # tokenizes: off the loop
        middle = engine.token_id("<fim_middle>")
        if any(isinstance(p, list) and middle in p for p in prompts):
            # A FIM prompt written by the client (parsed or as ids): end the middle as infill does.
            settings["stop_token_ids"] = fim_stop_token_ids(engine)
        stream = _get(body, "stream", bool, False)
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(choices: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
            return {"id": cid, "object": "text_completion", "created": created, "model": self.name,
                    "choices": choices, **more}  # fmt: skip

        def choice(index: int, text: str, finish: str | None) -> dict[str, Any]:
            return {"text": text, "index": index, "logprobs": None, "finish_reason": finish}

        if not stream:
            if len(prompts) == 1:
                done = [await _unless_gone(request, self.generate(engine, prompts[0], settings))]
            else:  # several prompts: one batch
                done = await _unless_gone(request, engine.agenerate_batch(prompts, **settings))
            choices = [choice(i, c.text, c.finish_reason) for i, c in enumerate(done)]
            return JSONResponse(chunk(choices, usage=_usage(done)))
        if len(prompts) > 1:
            raise _bad("Streaming takes one prompt; send a list of prompts without stream.", "prompt")
        include_usage = _include_usage(body)

        def events(c: CompletionChunk) -> list[dict[str, Any]]:
            out = [chunk([choice(0, c.text, c.finish_reason)])] if c.text or c.finish_reason else []
            if c.finish_reason is not None and include_usage:
                out.append(chunk([], usage=_usage([join_chunks([c])])))
            return out

        return await _sse(request, engine.astream(prompts[0], **settings), events, done_marker=True)

    def _completion_prompts(self, engine: StarCoderEngine, body: dict[str, Any]) -> list[Any]:
        """The prompts of a completions request: text, ids, or FIM requests when ``suffix`` is given."""
        prompt = body.get("prompt")
        if isinstance(prompt, str) or _is_ids(prompt):
            items = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_ids(p) for p in prompt):
            items = list(prompt)
        else:
            raise _bad("prompt must be text, a list of token ids, or a non-empty list of either.", "prompt")
        suffix = body.get("suffix")
        if suffix is None:
            # Text is data unless this server parses it (see create_app); either way it goes on as ids.
            parse = self.parse_special_tokens
            return [_text_ids(engine, p, parse) if isinstance(p, str) else p for p in items]
        suffix = _text(suffix, "suffix")
        if not all(isinstance(p, str) for p in items):
            raise _bad("suffix (fill in the middle) needs a text prompt, not token ids.", "suffix")
        return [FIMRequest(p, suffix) for p in items]

    # --- /v1/chat/completions -----------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        engine = self.ready()
        body = await _body(request)
        _refuse_unsupported(body)
        template = resolve_chat_template(engine, None)
        if template is None:
            raise _bad("This checkpoint has no chat template; use /v1/completions.")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("messages must be a non-empty list.", "messages")
        pairs = [
            (_text(m.get("role") if isinstance(m, dict) else None, "role"), _content(m)) for m in messages
        ]
        if body.get("max_completion_tokens") is not None:
            body = {**body, "max_tokens": body["max_completion_tokens"]}
        settings = _settings(body, 256, 1.0)
        ids = await asyncio.to_thread(chat_prompt_ids, engine, pairs, template)
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(kind: str, choices: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
            return {"id": cid, "object": kind, "created": created, "model": self.name,
                    "choices": choices, **more}  # fmt: skip

        if not _get(body, "stream", bool, False):
            done = await _unless_gone(request, self.generate(engine, ids, settings))
            message = {"role": "assistant", "content": done.text}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": done.finish_reason}
            return JSONResponse(chunk("chat.completion", [choice], usage=_usage([done])))
        include_usage = _include_usage(body)
        first = [True]

        def events(c: CompletionChunk) -> list[dict[str, Any]]:
            out = []
            if c.text or c.finish_reason:
                delta = {"content": c.text} | ({"role": "assistant"} if first[0] else {})
                first[0] = False
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": c.finish_reason}
                out.append(chunk("chat.completion.chunk", [choice]))
            if c.finish_reason is not None and include_usage:
                out.append(chunk("chat.completion.chunk", [], usage=_usage([join_chunks([c])])))
            return out

        return await _sse(request, engine.astream(ids, **settings), events, done_marker=True)

    # --- /infill (llama.cpp) ------------------------------------------------------------------------

    async def infill(self, request: Request) -> Response:
        engine = self.ready()
        body = await _body(request)
        fim_request = _infill_request(body)
        n_predict = _get(body, "n_predict", int, -1)
        warm_up = n_predict == 0  # llama.vim's "cache this context" request: prefill, answer nothing
        max_tokens = 1 if warm_up else (INFILL_MAX_TOKENS if n_predict < 0 else n_predict)
        settings = _llama_settings(body, max_tokens)
        limit_ms = _get(body, "t_max_predict_ms", (int, float), 0)
        fields = body.get("response_fields")
        if fields is not None and not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
            raise _bad("response_fields must be a list of strings.", "response_fields")
        prompt = await asyncio.to_thread(engine.fim_prompt, fim_request, max_tokens)
        truncated = prompt.prefix_chars_kept < len(fim_request.prefix) or prompt.suffix_chars_kept < len(
            fim_request.suffix
        ) or len(prompt.files_kept) < len(fim_request.context_files)  # fmt: skip
        stream = _time_limited(engine.astream(fim_request, **settings), limit_ms, len(prompt.token_ids))

        def final(c: Completion, content: str) -> dict[str, Any]:
            out = _infill_response(self.name, c, content, truncated, n_predict)
            return _pick_fields(out, fields)

        if not _get(body, "stream", bool, False):
            done = await _unless_gone(request, _join(stream))
            return JSONResponse(final(done, "" if warm_up else done.text))

        def events(c: CompletionChunk) -> list[dict[str, Any]]:
            if c.finish_reason is not None:
                tail = [{"content": c.text, "stop": False, "id_slot": 0}] if c.text and not warm_up else []
                return [*tail, final(join_chunks([c]), "")]
            if not c.text or warm_up:
                return []
            return [{"content": c.text, "stop": False, "id_slot": 0}]

        return await _sse(request, stream, events, done_marker=False)


def _llama_settings(body: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """Engine settings from llama.cpp's request fields (greedy unless a temperature is given)."""
    temperature = body.get("temperature")
    settings: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature or 0.0}
    for key in ("top_p", "top_k", "min_p", "seed"):
        if body.get(key) is not None:
            settings[key] = body[key]
    if body.get("stop"):
        settings["stop"] = body["stop"]
    penalty = body.get("repeat_penalty")
    if penalty is not None and penalty != 1.0:
        settings["repetition_penalty"] = penalty
    if settings.get("seed") in (-1, 0xFFFFFFFF):  # llama.cpp's "a random seed"
        del settings["seed"]
    return settings


class _Batcher:
    """Non-streamed requests with the same settings that arrive within ``window`` seconds of the first
    run as one engine batch (each as it would alone when greedy). Off by default: a batch does not reuse
    the prompt cache, which is what a single editor gains most from."""

    def __init__(self, window: float):
        self.window = window
        self.groups: dict[str, list[tuple[Any, asyncio.Future[Completion]]]] = {}
        self.running: set[asyncio.Task[None]] = set()  # referenced until done

    async def generate(self, engine: StarCoderEngine, prompt: Any, settings: dict[str, Any]) -> Completion:
        loop = asyncio.get_running_loop()
        key = repr(sorted(settings.items()))
        future: asyncio.Future[Completion] = loop.create_future()
        if key not in self.groups:
            self.groups[key] = []
            loop.call_later(self.window, self._start, engine, key, settings)
        self.groups[key].append((prompt, future))
        return await future  # a client that leaves cancels its future; its row's result is dropped

    def _start(self, engine: StarCoderEngine, key: str, settings: dict[str, Any]) -> None:
        task = asyncio.ensure_future(self._run(engine, self.groups.pop(key), settings))
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def _run(
        self, engine: StarCoderEngine, group: list[tuple[Any, asyncio.Future[Completion]]], settings: dict
    ) -> None:
        group = [(prompt, future) for prompt, future in group if not future.done()]
        if len(group) > 1:
            try:
                done = await engine.agenerate_batch([prompt for prompt, _ in group], **settings)
            except InvalidParameterError:
                pass  # one bad prompt fails the batch: below, each runs alone for its own answer or error
            except Exception as e:  # the engine failed: every caller hears it
                for _, future in group:
                    if not future.done():
                        future.set_exception(e)
                return
            else:
                for (_, future), completion in zip(group, done, strict=True):
                    if not future.done():
                        future.set_result(completion)
                return
        for prompt, future in group:
            if future.done():
                continue
            try:
                future.set_result(await engine.agenerate(prompt, **settings))
            except Exception as e:
                if not future.done():
                    future.set_exception(e)


#: ``finish_reason`` of an /infill answer cut by ``t_max_predict_ms``.
TIME_LIMIT = "time_limit"


async def _time_limited(
    stream: AsyncIterator[CompletionChunk], limit_ms: float, prompt_tokens: int
) -> AsyncIterator[CompletionChunk]:
    """llama.cpp's ``t_max_predict_ms``: once this long has passed since the first text and a newline
    has been generated, end the answer there (editors ask for it: a line now beats a block later).

    The cut answer's last chunk is made here: its prompt count is the built prompt's, its cached
    count unknown (None), its times measured here.
    """
    started = time.perf_counter()
    first: float | None = None
    generated, newline = 0, False
    try:
        async for chunk in stream:
            yield chunk
            if chunk.finish_reason is not None or limit_ms <= 0:
                continue
            now = time.perf_counter()
            first = now if first is None else first
            generated += len(chunk.token_ids)
            newline = newline or "\n" in chunk.text
            if newline and (now - first) * 1000 >= limit_ms:
                yield CompletionChunk(
                    "", [], finish_reason=TIME_LIMIT, prompt_tokens=prompt_tokens, cached_tokens=None,
                    completion_tokens=generated, prompt_seconds=first - started,
                    generation_seconds=now - first,
                )  # fmt: skip
                return
    finally:
        await stream.aclose()  # type: ignore[attr-defined]  # a cut (or dropped) answer stops generating


async def _join(stream: AsyncIterator[CompletionChunk]) -> Completion:
    return join_chunks([chunk async for chunk in stream])


def _text_ids(engine: StarCoderEngine, text: str, parse: bool) -> list[int]:
    if not text.strip():
        raise _bad("The prompt is empty or only whitespace; give the model some text to continue.", "prompt")
    return engine.encode(text, special_tokens=parse)


def _content(message: Any) -> str:
    """A chat message's content: text, or a list of text parts (joined)."""
    if not isinstance(message, dict):
        raise _bad("Each message must be an object with role and content.", "messages")
    content = message.get("content")
    if isinstance(content, list):
        parts = [p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None for p in content]
        if any(not isinstance(p, str) for p in parts):
            raise _bad("Only text content parts are supported.", "messages")
        return "".join(parts)  # type: ignore[arg-type]
    return _text(content, "content")


def _infill_request(body: dict[str, Any]) -> FIMRequest:
    """llama.cpp's /infill fields as a FIMRequest: ``prompt`` continues ``input_prefix`` (it is the
    text of the cursor's line before the cursor), ``input_extra`` files are repository context."""
    prefix = _get(body, "input_prefix", str, "") + _get(body, "prompt", str, "")
    suffix = _get(body, "input_suffix", str, "")
    extra = body.get("input_extra") or []
    if not isinstance(extra, list):
        raise _bad("input_extra must be a list of {filename, text} objects.", "input_extra")
    files = []
    for i, item in enumerate(extra):
        if not isinstance(item, dict):
            raise _bad(f"input_extra[{i}] must be an object with filename and text.", "input_extra")
        files.append(
            ContextFile(_text(item.get("filename", ""), "filename"), _text(item.get("text"), "text"))
        )
    repo_name = body.get("repo_name")
    file_path = body.get("file_path")
    return FIMRequest(
        prefix, suffix, context_files=tuple(files),
        repo_name=None if repo_name is None else _text(repo_name, "repo_name"),
        file_path=None if file_path is None else _text(file_path, "file_path"),
    )  # fmt: skip


def _infill_response(
    model: str, c: Completion, content: str, truncated: bool, n_predict: int
) -> dict[str, Any]:
    """llama.cpp's final /infill answer (``stop`` True, counts and timings)."""
    predicted = 0 if n_predict == 0 else c.completion_tokens
    evaluated = c.prompt_tokens - c.cached_tokens
    prompt_ms = None if c.prompt_seconds is None else c.prompt_seconds * 1000  # None: not known
    predicted_ms = c.generation_seconds * 1000
    cut = c.finish_reason == TIME_LIMIT
    stop_type = "word" if c.stop_sequence else ("limit" if c.finish_reason == "length" or cut else "eos")
    out = {
        "content": content,
        "id_slot": 0,
        "stop": True,
        "model": model,
        "tokens_predicted": predicted,
        "tokens_evaluated": c.prompt_tokens,
        "tokens_cached": c.cached_tokens,
        "truncated": truncated,
        "stop_type": stop_type,
        "stopping_word": c.stop_sequence or "",
        "has_new_line": "\n" in content,
        "timings": {
            "prompt_n": evaluated,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms and (prompt_ms / evaluated if evaluated else 0.0),
            "prompt_per_second": c.prompt_tps,
            "predicted_n": predicted,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted if predicted else 0.0,
            "predicted_per_second": predicted / c.generation_seconds if c.generation_seconds > 0 else 0.0,
        },
    }
    if cut:  # how much of the prompt the cache served is not known for an answer cut by time
        del out["tokens_cached"]
        out["timings"]["prompt_n"] = c.prompt_tokens
    return out


def _pick_fields(response: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """llama.cpp's ``response_fields``: only these, nested ones under their flat path
    (``"timings/prompt_n"``), as llama.vim reads them."""
    if fields is None:
        return response
    out = {}
    for path in fields:
        value: Any = response
        for key in path.split("/"):
            value = value.get(key, _MISSING) if isinstance(value, dict) else _MISSING
        if value is not _MISSING:
            out[path] = value
    return out


_MISSING = object()


#: How often a non-streamed request checks whether its client is still there.
DISCONNECT_POLL_SECONDS = 0.1


async def _unless_gone(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, cancelling it when the client disconnects first (an editor drops its
    request at each keystroke; the engine should not keep generating for nobody)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise APIError(499, "The client disconnected.", kind="client_closed")
    finally:
        task.cancel()  # a no-op once done; cancelling the engine's task cancels its generation


async def _sse(
    request: Request,
    stream: AsyncIterator[CompletionChunk],
    events: Callable[[CompletionChunk], list[dict[str, Any]]],
    *,
    done_marker: bool,
) -> Response:
    """A server-sent-events response of ``events(chunk)`` for each chunk, ``data: [DONE]`` last if asked.

    The first chunk is awaited before answering, so a bad request still gets its error status. A client
    that disconnects cancels the generator, and closing the stream cancels the generation.
    """
    try:
        first = await _unless_gone(request, anext(stream))  # a client may leave during a long prefill
    except BaseException:
        await stream.aclose()  # type: ignore[attr-defined]
        raise

    async def body() -> AsyncIterator[dict[str, str]]:
        try:
            chunk: CompletionChunk | None = first
            while chunk is not None:
                for event in events(chunk):
                    yield {"data": json.dumps(event)}
                chunk = None if chunk.finish_reason is not None else await anext(stream, None)
            if done_marker:
                yield {"data": "[DONE]"}
        except Exception as e:  # after the status line: the error goes in the stream
            yield {"data": json.dumps({"error": {"message": str(_api_error(e)), "type": "server_error"}})}
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    return EventSourceResponse(body(), ping=15)


def create_app(
    engine: StarCoderEngine | Callable[[], StarCoderEngine],
    *,
    api_key: str | None = None,
    parse_special_tokens: bool = False,
    model_name: str | None = None,
    batch_window_ms: float = 0,
) -> Starlette:
    """The ASGI app serving ``engine`` (see the module docs for the endpoints).

    Args:
        engine: A loaded engine (the caller closes it), or a function that loads one: it then runs in a
            thread when the server starts (requests get 503 meanwhile) and the server closes the engine
            when it stops.
        api_key: When set, every endpoint but ``/health`` needs ``Authorization: Bearer <api_key>``.
        parse_special_tokens: Whether control-token strings in a text ``prompt`` of ``/v1/completions``
            (and ``/tokenize``) are control tokens. Off by default: client text is data. Turn it on for
            trusted clients that hand-write ``<fim_prefix>...`` prompts.
        model_name: The model id the API reports (default: the engine's name).
        batch_window_ms: When above 0, non-streamed completions and chat requests with the same
            settings that arrive within this many milliseconds of each other run as one engine batch
            (more throughput for many clients; no prompt-cache reuse within a batch). Off by default:
            requests then run one after another, each reusing the prompt cache.
    """
    server = _Server(engine, api_key, parse_special_tokens, model_name, batch_window_ms)
    routes = [
        Route("/health", server.route(server.health, auth=False), methods=["GET"]),
        Route("/v1/models", server.route(server.models), methods=["GET"]),
        Route("/tokenize", server.route(server.tokenize), methods=["POST"]),
        Route("/detokenize", server.route(server.detokenize), methods=["POST"]),
        Route("/v1/completions", server.route(server.completions), methods=["POST"]),
        Route("/v1/chat/completions", server.route(server.chat), methods=["POST"]),
        Route("/infill", server.route(server.infill), methods=["POST"]),
        Route("/completion", server.route(server.completion), methods=["POST"]),
        Route("/props", server.route(server.props), methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=server.lifespan)


__all__ = ["create_app"]
