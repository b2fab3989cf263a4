"""OpenAI's endpoints: ``/v1/completions`` (with ``suffix`` for fill in the middle, and a constraint as
llama.cpp's ``grammar``/``json_schema``, OpenAI's ``response_format`` or vLLM's ``structured_outputs``),
``/v1/chat/completions`` and ``/v1/models``."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .._chat import resolve_chat_template, template_roles, tool_chat_prompt_ids
from .._tools import constrained
from ..backends.remote.backend import OUR_SERVER
from ..editor import CANCELLED, Document
from ..engine import StarCoderEngine
from ..fim.build import FIMPrompt, fim_stop_token_ids
from ..fim.request import FIMRequest
from ..types import Completion, CompletionChunk, is_int, join_chunks
from .adapters import Served
from .errors import bad_request
from .limits import MAX_MESSAGES, MAX_PROMPTS, check_count, check_ids_fit, check_text_fits
from .parsing import (
    end_fields,
    field,
    include_usage,
    is_ids,
    openai_settings,
    read_body,
    refuse_unsupported,
    text,
    text_ids,
)
from .shapes import usage_body
from .state import ServerState
from .streams import join, sse, unless_gone
from .structured import ChatAnswer, chat_turns, completions_constraint, response_format, tool_plan
from .tenants import salted

#: OpenAI's defaults for the legacy completions endpoint (``max_tokens`` 16, ``temperature`` 1).
OPENAI_MAX_TOKENS = 16


async def models(server: ServerState, request: Request) -> Response:
    """The base model, then each adapter with ``root`` (its folder) and ``parent`` (the base), as vLLM
    lists its LoRA adapters."""
    engine = server.ready()

    def card(name: str, root: Any, parent: str | None) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": server.created,
            "owned_by": OUR_SERVER,
            "root": root,
            "parent": parent,
            "max_model_len": engine.context_window,
            "context_window": engine.context_window,
            # llama.cpp's fields, which StarCoderEngine.connect checks against its tokenizer.
            "meta": {"n_vocab": engine.vocab_size, "n_ctx_train": engine.context_window},
        }

    base_root = str(engine.path) if engine.path is not None else engine.name
    cards = [card(server.name, base_root, None)]
    cards += [card(name, str(folder), server.name) for name, folder in server.adapters.folders.items()]
    return JSONResponse({"object": "list", "data": cards})


async def _opened(server: ServerState, request: Request) -> tuple[dict[str, Any], Served]:
    """An OpenAI request's checked body and the model it names (the base or an adapter)."""
    server.ready()
    body = await read_body(request, server.max_body_bytes)
    refuse_unsupported(body)
    return body, server.by_model(body)


# --- /v1/completions ------------------------------------------------------------------------------


async def completions(server: ServerState, request: Request) -> Response:
    body, served = await _opened(server, request)
    engine = served.engine
    salt = server.partition(request, body)  # the tenant's (and cache_salt's) own cache and documents
    settings = openai_settings(body, OPENAI_MAX_TOKENS, 1.0, server.prompt_lookup)
    settings = salted(settings | completions_constraint(body), salt)
    warm_up = is_int(settings["max_tokens"]) and settings["max_tokens"] == 0  # prefill and cache, no text
    if warm_up:
        settings["max_tokens"] = 1  # (the token is not answered: the prompt's cache is what is kept)
    suffix = body.get("suffix") is not None  # fill in the middle: a newer request for its document supersedes
    where = served.documents(salt)
    document = server.sessions.document(where, body.get("file_path"), body.get("id_slot")) if suffix else None
    # Tokenizing runs off the event loop.
    prompts, built = await asyncio.to_thread(
        _completion_prompts, server, engine, body, settings["max_tokens"], document
    )
    middle = engine.token_id("<fim_middle>")
    if any(isinstance(p, list) and middle in p for p in prompts):
        # A FIM prompt written by the client (parsed or as ids): end the middle as infill does.
        settings["stop_token_ids"] = fim_stop_token_ids(engine)
    stream = field(body, "stream", bool, False)
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(choices: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
        return {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": served.name,
            "choices": choices,
            **more,
        }

    def choice(index: int, text: str, finish: str | None) -> dict[str, Any]:
        text = "" if warm_up or finish == CANCELLED else text  # a cancelled answer's text is stale
        return {"text": text, "index": index, "logprobs": None, "finish_reason": finish}

    def answered(c: Completion) -> Completion:
        return dataclasses.replace(c, completion_tokens=0) if warm_up else c

    def claimed() -> AsyncIterator[CompletionChunk]:  # (the engine's stream, as it is without a document)
        if built is not None:  # a hole's prompt built already (to see that its extended prefix cut nothing)
            chunks = engine.astream_fim_prompt(prompts[0], built, **settings)
        else:
            chunks = engine.astream(prompts[0], **settings)
        return server.sessions.supersedable(document, chunks, None, warm_up=warm_up)

    if not stream:
        if len(prompts) == 1 and server.sessions.supersedes(document):
            done = [await unless_gone(request, join(claimed()))]
        elif len(prompts) == 1:
            done = [await unless_gone(request, server.generate(engine, prompts[0], settings))]
        else:  # several prompts: one batch (seeded sampling: one by one, each as alone)
            done = await unless_gone(request, server.generate_all(engine, prompts, settings))
        done = [answered(c) for c in done]
        choices = [choice(i, c.text, c.finish_reason) for i, c in enumerate(done)]
        return JSONResponse(chunk(choices, usage=usage_body(done)))
    if len(prompts) > 1:
        raise bad_request("Streaming takes one prompt; send a list of prompts without stream.", "prompt")
    with_usage = include_usage(body)

    def events(c: CompletionChunk) -> list[dict[str, Any]]:
        out = (
            [chunk([choice(0, c.text, c.finish_reason)])]
            if (c.text and not warm_up) or c.finish_reason
            else []
        )
        if c.finish_reason is not None and with_usage:
            out.append(chunk([], usage=usage_body([answered(join_chunks([c]))])))
        return out

    return await sse(request, claimed(), events, done_marker=True)


def _completion_prompts(
    server: ServerState,
    engine: StarCoderEngine,
    body: dict[str, Any],
    max_tokens: Any,
    document: Document | None,
) -> tuple[list[Any], FIMPrompt | None]:
    """The prompts of a completions request: text, ids, or FIM requests when ``suffix`` is given (with
    our extra ``file_path``: the hole's path, and with ``--repo`` its repository context); and the prompt
    of a single hole when it was built here, else None."""
    prompt = body.get("prompt")
    several = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], str | list)
    if several:
        check_count(prompt, MAX_PROMPTS, "prompts", "prompt")
    items = list(prompt) if several else [prompt]
    for item in items:  # before each id is checked
        if isinstance(item, list):
            check_ids_fit(len(item), engine.context_window, "prompt", "token ids")
    if not all(isinstance(p, str) or is_ids(p) for p in items):
        msg = "prompt must be text, a list of token ids, or a non-empty list of either."
        raise bad_request(msg, "prompt")
    suffix = body.get("suffix")
    file_path = body.get("file_path")
    if file_path is not None and suffix is None:
        raise bad_request(
            "file_path names the file of a fill-in-the-middle hole: it needs a suffix.", "file_path"
        )
    if suffix is None:
        # Text is data unless this server parses it (see create_app); either way it goes on as ids.
        parse, max_chars = server.parse_special_tokens, server.max_text_chars
        return [text_ids(engine, p, parse, max_chars) if isinstance(p, str) else p for p in items], None
    suffix = text(suffix, "suffix")
    if not all(isinstance(p, str) for p in items):
        raise bad_request("suffix (fill in the middle) needs a text prompt, not token ids.", "suffix")
    file_path = None if file_path is None else text(file_path, "file_path")
    holes = [FIMRequest(p, suffix, file_path=file_path, **end_fields(body)) for p in items]
    run = [server.editor_request(engine, hole, max_tokens, document) for hole in holes]
    return [request for request, _, _ in run], run[0][2] if len(run) == 1 else None


# --- /v1/chat/completions -------------------------------------------------------------------------


async def chat(server: ServerState, request: Request) -> Response:
    body, served = await _opened(server, request)
    engine = served.engine
    template = resolve_chat_template(engine, None)
    if template is None:
        raise bad_request("This checkpoint has no chat template; use /v1/completions.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list.", "messages")
    check_count(messages, MAX_MESSAGES, "messages", "messages")
    pairs = chat_turns(messages, template_roles(template))
    if body.get("max_completion_tokens") is not None:
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    plan, output = tool_plan(body), response_format(body)
    if plan is not None and plan.mode != "none" and output:
        raise bad_request("Give tools or a JSON response_format, not both: one constraint at a time.")
    settings = constrained({**openai_settings(body, 256, 1.0, server.prompt_lookup), **output}, plan)
    settings = salted(settings, server.partition(request, body))
    chars = sum(len(content) for _, content in pairs)
    check_text_fits(chars, server.max_text_chars, engine.context_window, "messages")
    ids = await asyncio.to_thread(tool_chat_prompt_ids, engine, pairs, template, plan)
    answer = ChatAnswer(plan)
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(kind: str, choices: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
        return {
            "id": cid,
            "object": kind,
            "created": created,
            "model": served.name,
            "choices": choices,
            **more,
        }

    if not field(body, "stream", bool, False):
        done = await unless_gone(request, server.generate(engine, ids, settings))
        message, finish = answer.message(done)
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        return JSONResponse(chunk("chat.completion", [choice], usage=usage_body([done])))
    with_usage = include_usage(body)
    first = [True]

    def events(c: CompletionChunk) -> list[dict[str, Any]]:
        out = []
        deltas, finish = answer.deltas(c)
        for i, delta in enumerate(deltas):
            delta = delta | ({"role": "assistant"} if first[0] else {})
            first[0] = False
            last = finish if i == len(deltas) - 1 else None
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": last}
            out.append(chunk("chat.completion.chunk", [choice]))
        if c.finish_reason is not None and with_usage:
            out.append(chunk("chat.completion.chunk", [], usage=usage_body([join_chunks([c])])))
        return out

    return await sse(request, engine.astream(ids, **settings), events, done_marker=True)
