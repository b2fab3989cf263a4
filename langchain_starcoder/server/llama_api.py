"""llama.cpp's endpoints: ``/infill`` (llama.vim, llama.vscode), ``/completion`` and ``/props`` (what
``StarCoderEngine.connect`` speaks, with text prompts too), ``/health``, ``/tokenize`` and ``/detokenize``."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..editor import Document
from ..editor.stable_context import reordered_used
from ..engine import StarCoderEngine
from ..fim.build import FIMPrompt
from ..fim.request import FIMRequest
from ..types import DEFAULT_MAX_TOKENS, Completion, CompletionChunk, is_int, join_chunks
from .errors import bad_request
from .limits import MAX_RESPONSE_FIELDS, check_count, check_ids_fit, check_text_fits
from .parsing import field, infill_request, llama_settings, read_body, text, text_ids
from .shapes import files_used, final_answer, pick_fields
from .state import ServerState
from .streams import join, sse, time_limited, unless_gone
from .structured import llama_constraint
from .tenants import salted


async def health(server: ServerState, request: Request) -> Response:
    server.ready()
    return JSONResponse({"status": "ok"})


async def props(server: ServerState, request: Request) -> Response:
    """llama.cpp's ``/props``: the context a request may fill (StarCoderEngine.connect reads it)."""
    engine = server.ready()
    return JSONResponse({"default_generation_settings": {"n_ctx": engine.context_window}})


async def lora_adapters(server: ServerState, request: Request) -> Response:
    """llama-server's ``GET /lora-adapters``: the adapters a request's ``lora`` field picks by id."""
    server.ready()
    return JSONResponse(server.adapters.lora_adapters())


async def tokenize(server: ServerState, request: Request) -> Response:
    engine = server.ready()
    body = await read_body(request, server.max_body_bytes)
    content = text(body.get("content"), "content")
    parse = field(body, "parse_special", bool, server.parse_special_tokens)
    check_text_fits(len(content), server.max_text_chars, engine.context_window, "content")
    ids = await asyncio.to_thread(engine.encode, content, special_tokens=parse)
    return JSONResponse({"tokens": ids})


async def detokenize(server: ServerState, request: Request) -> Response:
    engine = server.ready()
    body = await read_body(request, server.max_body_bytes)
    ids = body.get("tokens")
    if isinstance(ids, list):  # no request decodes more than a context window's worth
        check_count(ids, engine.context_window, "token ids", "tokens")
    if not isinstance(ids, list) or not all(is_int(t) for t in ids):
        raise bad_request("tokens must be a list of token ids (integers).", "tokens")
    bad = [t for t in ids if not 0 <= t < engine.vocab_size]
    if bad:
        msg = f"Token ids {bad[:5]} are outside the vocabulary [0, {engine.vocab_size})."
        raise bad_request(msg, "tokens")
    return JSONResponse({"content": await asyncio.to_thread(engine.decode, ids)})


async def completion(server: ServerState, request: Request) -> Response:
    """llama.cpp's ``/completion``: one prompt (text, token ids, or a list mixing both), answered whole
    or streamed; with ``return_tokens`` each chunk carries its ids (what ``StarCoderEngine.connect``
    speaks). Text is data unless the server parses control tokens (``parse_special_tokens``)."""
    server.ready()
    body = await read_body(request, server.max_body_bytes)
    engine = server.by_lora(body).engine  # the base or an adapter
    if body.get("n_probs"):  # token probabilities: not here
        raise bad_request("/completion does not support n_probs.", "n_probs")
    prompt = await asyncio.to_thread(_completion_prompt, server, engine, body.get("prompt"))  # tokenizes
    n_predict = field(body, "n_predict", int, -1)
    settings = llama_settings(body, DEFAULT_MAX_TOKENS if n_predict < 0 else n_predict, server.prompt_lookup)
    settings = salted(settings | llama_constraint(body), server.partition(request, body))
    with_tokens = field(body, "return_tokens", bool, False)
    if not field(body, "stream", bool, False):
        done = await unless_gone(request, server.generate(engine, prompt, settings))
        out = final_answer(server.name, done, done.text, False, n_predict)
        return JSONResponse(out | ({"tokens": done.token_ids} if with_tokens else {}))
    predicted = 0

    def events(c: CompletionChunk) -> list[dict[str, Any]]:
        nonlocal predicted
        predicted += len(c.token_ids)
        event: dict[str, Any] = {"content": c.text, "tokens_predicted": predicted}
        if with_tokens:
            event["tokens"] = c.token_ids
        event["stop"] = c.finish_reason is not None
        if c.finish_reason is not None:
            event["timings"] = {"cache_n": c.cached_tokens or 0, "prompt_n": c.prompt_tokens}
        return [event]

    return await sse(request, engine.astream(prompt, **settings), events, done_marker=False)


def _completion_prompt(server: ServerState, engine: StarCoderEngine, prompt: Any) -> list[int]:
    """The ids of a /completion prompt: text, ids, or llama.cpp's mixed list (ids as given, text encoded)."""
    parse = server.parse_special_tokens
    if isinstance(prompt, str):
        return text_ids(engine, prompt, parse, server.max_text_chars)
    pieces = prompt if isinstance(prompt, list) and prompt else [None]
    check_ids_fit(len(pieces), engine.context_window, "prompt", "pieces (token ids and texts)")
    if not all(is_int(p) or isinstance(p, str) for p in pieces) or all(isinstance(p, str) for p in pieces):
        msg = (
            "/completion takes one prompt: text, a list of token ids, or a list mixing ids and text; "
            "send several prompts as several requests."
        )
        raise bad_request(msg, "prompt")
    chars = sum(len(p) for p in pieces if isinstance(p, str))
    check_text_fits(chars, server.max_text_chars, engine.context_window, "prompt")
    ids: list[int] = []
    for piece in pieces:
        ids += engine.encode(piece, special_tokens=parse) if isinstance(piece, str) else [piece]
    return ids


def _infill_prompt(
    server: ServerState,
    engine: StarCoderEngine,
    request: FIMRequest,
    max_tokens: int,
    document: Document | None,
) -> tuple[FIMRequest, FIMPrompt, list[str]]:
    """The request as run, its prompt (built once: the engine runs this one) and ``input_extra_used``."""
    given = len(request.context_files)  # the client's input_extra: first, and what input_extra_used reports
    request, order, prompt = server.editor_request(engine, request, max_tokens, document)
    if prompt is None:  # (built already when an extended prefix was tried)
        prompt = engine.fim_prompt(request, max_tokens)
    used = reordered_used(files_used(request.context_files, prompt.files_kept), order, given)
    return request, prompt, used


async def infill(server: ServerState, request: Request) -> Response:
    server.ready()
    body = await read_body(request, server.max_body_bytes)
    served = server.by_lora(body)  # the base or an adapter
    engine = served.engine
    fim_request = infill_request(body)
    n_predict = field(body, "n_predict", int, -1)
    warm_up = n_predict == 0  # llama.vim's "cache this context" request: prefill, answer nothing
    max_tokens = 1 if warm_up else (DEFAULT_MAX_TOKENS if n_predict < 0 else n_predict)
    salt = server.partition(request, body)  # the tenant's (and cache_salt's) own cache and documents
    settings = salted(llama_settings(body, max_tokens, server.prompt_lookup) | llama_constraint(body), salt)
    limit_ms = field(body, "t_max_predict_ms", (int, float), 0)
    fields = body.get("response_fields")
    if isinstance(fields, list):
        check_count(fields, MAX_RESPONSE_FIELDS, "fields", "response_fields")
    if fields is not None and not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
        raise bad_request("response_fields must be a list of strings.", "response_fields")
    document = server.sessions.document(
        served.documents(salt), fim_request.file_path, field(body, "id_slot", int)
    )
    fim_request, prompt, used = await asyncio.to_thread(
        _infill_prompt, server, engine, fim_request, max_tokens, document
    )
    truncated = (
        prompt.prefix_chars_kept < len(fim_request.prefix)
        or prompt.suffix_chars_kept < len(fim_request.suffix)
        or any(u != "whole" for u in used)
    )
    prompt_tokens = len(prompt.token_ids)
    chunks = engine.astream_fim_prompt(fim_request, prompt, **settings)
    chunks = server.sessions.supersedable(document, chunks, prompt_tokens, warm_up=warm_up)
    stream = time_limited(chunks, limit_ms, prompt_tokens)

    def final(c: Completion, content: str) -> dict[str, Any]:
        out = final_answer(server.name, c, content, truncated, n_predict)
        return pick_fields({**out, "input_extra_used": used}, fields)

    if not field(body, "stream", bool, False):
        done = await unless_gone(request, join(stream))
        return JSONResponse(final(done, "" if warm_up else done.text))

    def events(c: CompletionChunk) -> list[dict[str, Any]]:
        if c.finish_reason is not None:
            tail = [{"content": c.text, "stop": False, "id_slot": 0}] if c.text and not warm_up else []
            return [*tail, final(join_chunks([c]), "")]
        if not c.text or warm_up:
            return []
        return [{"content": c.text, "stop": False, "id_slot": 0}]

    return await sse(request, stream, events, done_marker=False)
