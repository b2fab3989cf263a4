"""The ASGI app: the routes over one :class:`ServerState`."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.routing import Route

from ..engine import StarCoderEngine
from ..errors import InvalidParameterError
from ..fim.request import FIM_MODES
from ..types import GenerationParams, is_int
from . import llama_api, openai_api
from .limits import DEFAULT_MAX_BODY_BYTES
from .state import ServerState

if TYPE_CHECKING:
    from ..repo import RepoIndex


def create_app(
    engine: StarCoderEngine | Callable[[], StarCoderEngine],
    *,
    api_key: str | Sequence[str] | None = None,
    parse_special_tokens: bool = False,
    model_name: str | None = None,
    batch_window_ms: float = 0,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    repo: RepoIndex | None = None,
    prompt_lookup_num_tokens: int | None = None,
    supersede: bool = True,
    fim_mode: str = "psm",
    stable_prefix: bool = True,
    adapters: Mapping[str, str | os.PathLike[str]] | None = None,
) -> Starlette:
    """The ASGI app serving ``engine`` (see the package docs for the endpoints).

    Args:
        engine: A loaded engine (the caller closes it), or a function that loads one: it then runs in a
            thread when the server starts (requests get 503 meanwhile) and the server closes the engine
            when it stops.
        api_key: A key, or several: every endpoint but ``/health`` then needs ``Authorization: Bearer KEY``
            with one of them. Each key is a tenant, whose documents (supersession, stable prefix, context
            order) and prompt cache (in memory and on disk, and the ``tokens_cached`` counts) are its own;
            a request's ``cache_salt`` partitions them further (tenants.py). Without a key the server has
            one tenant: every client shares them.
        parse_special_tokens: Whether control-token strings in a text ``prompt`` of ``/v1/completions``
            (and ``/tokenize``) are control tokens. Off by default: client text is data. Turn it on for
            trusted clients that hand-write ``<fim_prefix>...`` prompts.
        model_name: The model id the API reports (default: the engine's name).
        batch_window_ms: When above 0, non-streamed completions and chat requests with the same
            settings that arrive within this many milliseconds of each other run as one engine batch
            (more throughput for many clients; no prompt-cache reuse within a batch). Sampling requests
            with a ``seed`` run alone, so the seed reproduces their answer. Off by default: requests
            then run one after another, each reusing the prompt cache.
        max_body_bytes: A request body larger than this is refused with 413 before it is read whole
            (default 4 MiB). Text prompts are also refused before tokenizing when they are longer than
            the context window could hold at the tokenizer's longest token.
        repo: A :class:`~langchain_starcoder.RepoIndex`: ``/infill`` and ``/v1/completions`` with a
            ``suffix`` add its context for the request's ``file_path`` (relative to the index's root, or
            absolute inside it) after the client's own ``input_extra`` files, in the budget they leave.
            A request without ``file_path`` gets no repository context.
        prompt_lookup_num_tokens: Prompt-lookup speculative decoding for requests that do not set
            their own ``prompt_lookup_num_tokens`` (None: the engine's default; 0: off).
        supersede: A fill-in-the-middle request (``/infill``, ``/v1/completions`` with a ``suffix``)
            that names its document (``file_path`` or ``id_slot``) cancels its tenant's older request
            for it still running, which answers as cancelled; and each document's context files keep
            their last order, so the prompt cache's common prefix stays long (docs/server.md, "While
            you type"). On by default; answers are exactly what each request gives alone.
        fim_mode: The FIM layout of those requests: "psm" (prefix, suffix, middle; the default) or
            "spm" (suffix first: an edit at the hole prefills only the prefix's changed end).
        stable_prefix: When a FIM request's prefix is the document's last prefix with the editor's
            window slid down the file (llama.vim sends the lines before the cursor), the lines it dropped
            are put back above it, so the prompt starts where the last one did and the prompt cache serves
            it (docs/server.md, "While you type"). Exact (the answer is ``engine.infill``'s on the longer
            prefix, which may differ from the window's alone); on by default, False sends the window as is.
        adapters: Fine-tuning adapters served beside the base, by name: ``{"mine": "adapters/mine"}``.
            Each runs on the base's weights (:meth:`StarCoderEngine.with_adapter`; made once the base is
            ready, closed when the server stops) with prompt caches of its own. A request picks one by
            OpenAI's ``model`` field (``/v1/models`` lists them, vLLM's way; another name is a 404) or by
            llama.cpp's ``lora`` field on ``/infill`` and ``/completion`` (``[{"id": 0, "scale": 1}]``, ids
            in this order; ``/lora-adapters`` lists them); the base without either (docs/server.md).
    """
    keys = _checked(api_key, fim_mode, max_body_bytes, prompt_lookup_num_tokens)
    server = ServerState(
        engine,
        keys,
        parse_special_tokens,
        model_name,
        batch_window_ms,
        max_body_bytes,
        repo=repo,
        prompt_lookup=prompt_lookup_num_tokens,
        supersede=supersede,
        fim_mode=fim_mode,
        stable_prefix=stable_prefix,
        adapters=adapters,
    )
    return Starlette(routes=_routes(server), lifespan=server.lifespan)


def _checked(
    api_key: str | Sequence[str] | None,
    fim_mode: str,
    max_body_bytes: int,
    prompt_lookup_num_tokens: int | None,
) -> Sequence[str] | None:
    """The tenants' keys, once every setting create_app takes is checked (a bad one fails here)."""
    if fim_mode not in FIM_MODES:
        msg = f"fim_mode must be one of {', '.join(FIM_MODES)}, not {fim_mode!r}."
        raise InvalidParameterError(msg)
    if not is_int(max_body_bytes) or max_body_bytes <= 0:
        msg = f"max_body_bytes must be a positive integer, not {max_body_bytes!r}."
        raise InvalidParameterError(msg)
    GenerationParams.create(prompt_lookup_num_tokens=prompt_lookup_num_tokens)  # a bad value fails here
    keys = [api_key] if isinstance(api_key, str) else api_key
    if keys is not None and not (isinstance(keys, Sequence) and all(isinstance(k, str) for k in keys)):
        msg = f"api_key must be a string or a list of strings (tenants' keys), not {type(api_key).__name__}."
        raise InvalidParameterError(msg)
    return keys


def _routes(server: ServerState) -> list[Route]:
    """The endpoints, each through ``server.route`` (authentication, errors, readiness)."""
    return [
        Route("/health", server.route(llama_api.health, auth=False), methods=["GET"]),
        Route("/v1/models", server.route(openai_api.models), methods=["GET"]),
        Route("/tokenize", server.route(llama_api.tokenize), methods=["POST"]),
        Route("/detokenize", server.route(llama_api.detokenize), methods=["POST"]),
        Route("/v1/completions", server.route(openai_api.completions), methods=["POST"]),
        Route("/v1/chat/completions", server.route(openai_api.chat), methods=["POST"]),
        Route("/infill", server.route(llama_api.infill), methods=["POST"]),
        Route("/completion", server.route(llama_api.completion), methods=["POST"]),
        Route("/props", server.route(llama_api.props), methods=["GET"]),
        Route("/lora-adapters", server.route(llama_api.lora_adapters), methods=["GET"]),
    ]
