"""llama.cpp's endpoints: ``/infill`` (llama.vim, llama.vscode), ``/completion`` and ``/props`` (what
``StarCoderEngine.connect`` speaks), ``/health``, ``/tokenize`` and ``/detokenize``."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..types import Completion, CompletionChunk, is_int, join_chunks
from .errors import bad_request
from .limits import check_text_fits
from .parsing import field, infill_request, is_ids, llama_settings, read_body, text
from .shapes import files_used, infill_response, pick_fields
from .state import ServerState
from .streams import join, sse, time_limited, unless_gone

#: ``/infill`` without ``n_predict`` (or with llama.cpp's -1, "until done"): this many tokens at most.
INFILL_MAX_TOKENS = 256


async def health(server: ServerState, request: Request) -> Response:
    server.ready()
    return JSONResponse({"status": "ok"})


async def props(server: ServerState, request: Request) -> Response:
    """llama.cpp's ``/props``: the context a request may fill (StarCoderEngine.connect reads it)."""
    engine = server.ready()
    return JSONResponse({"default_generation_settings": {"n_ctx": engine.context_window}})


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
    if not isinstance(ids, list) or not all(is_int(t) for t in ids):
        raise bad_request("tokens must be a list of token ids (integers).", "tokens")
    bad = [t for t in ids if not 0 <= t < engine.vocab_size]
    if bad:
        msg = f"Token ids {bad[:5]} are outside the vocabulary [0, {engine.vocab_size})."
        raise bad_request(msg, "tokens")
    return JSONResponse({"content": await asyncio.to_thread(engine.decode, ids)})


async def completion(server: ServerState, request: Request) -> Response:
    """llama.cpp's ``/completion`` for token-id prompts, streamed with each chunk's ids: what
    ``StarCoderEngine.connect`` speaks. The client keeps its stop strings; this engine ends at
    end-of-text only."""
    engine = server.ready()
    body = await read_body(request, server.max_body_bytes)
    ids = body.get("prompt")
    if not is_ids(ids):
        raise bad_request("/completion takes the prompt as a list of token ids.", "prompt")
    if not field(body, "stream", bool, False) or not field(body, "return_tokens", bool, False):
        raise bad_request("/completion answers stream=true with return_tokens=true only.", "stream")
    settings = llama_settings(body, field(body, "n_predict", int, INFILL_MAX_TOKENS))
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

    return await sse(request, stream, events, done_marker=False)


async def infill(server: ServerState, request: Request) -> Response:
    engine = server.ready()
    body = await read_body(request, server.max_body_bytes)
    fim_request = infill_request(body)
    n_predict = field(body, "n_predict", int, -1)
    warm_up = n_predict == 0  # llama.vim's "cache this context" request: prefill, answer nothing
    max_tokens = 1 if warm_up else (INFILL_MAX_TOKENS if n_predict < 0 else n_predict)
    settings = llama_settings(body, max_tokens)
    limit_ms = field(body, "t_max_predict_ms", (int, float), 0)
    fields = body.get("response_fields")
    if fields is not None and not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
        raise bad_request("response_fields must be a list of strings.", "response_fields")
    prompt = await asyncio.to_thread(engine.fim_prompt, fim_request, max_tokens)
    used = files_used(fim_request.context_files, prompt.files_kept)
    truncated = (
        prompt.prefix_chars_kept < len(fim_request.prefix)
        or prompt.suffix_chars_kept < len(fim_request.suffix)
        or any(u != "whole" for u in used)
    )
    stream = time_limited(engine.astream(fim_request, **settings), limit_ms, len(prompt.token_ids))

    def final(c: Completion, content: str) -> dict[str, Any]:
        out = infill_response(server.name, c, content, truncated, n_predict)
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
