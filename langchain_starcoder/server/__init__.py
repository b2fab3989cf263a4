"""An HTTP server over one engine: OpenAI-compatible completions and chat, and llama.cpp's ``/infill``.

A Starlette app whose handlers translate request shapes into engine calls and back: ``app`` (the routes),
``state`` (engine, key, settings), ``openai_api`` and ``llama_api`` (the endpoints), ``parsing`` and
``shapes`` (requests in, answers out), ``streams`` (SSE, disconnects), ``batcher``, ``errors``, ``limits``
(body size, text bound, list counts), ``adapters`` (which model a request runs), ``connections`` (uvicorn's
request deadline, connection limit) and ``tenants`` (each API key a tenant: its documents and prompt cache are
its own). What an editor's requests share lives in :mod:`langchain_starcoder.editor`, which the Jupyter
extension uses too: supersession (a newer request for a document cancels the older), each document's context
files in their last order, the stable prefix (a window of the lines before the cursor that slid down the file
gets back the lines it dropped, so the prompt keeps its start) and the one map from errors to statuses.

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
- With ``create_app(repo=RepoIndex(...))`` (``serve --repo DIR``), ``/infill`` and ``/v1/completions``
  with a ``suffix`` add the repository's context for the request's ``file_path`` (our extra field on
  both), after the client's own ``input_extra`` files, in the budget they leave; a request without
  ``file_path`` gets none (docs/repository-context.md).
- ``GET /health``, ``GET /v1/models``, ``POST /tokenize``, ``POST /detokenize``.
- With ``create_app(adapters={"name": DIR})`` (``serve --adapter NAME=DIR``): each adapter an engine on the
  base's weights, picked by OpenAI's ``model`` field on ``/v1/...`` (``/v1/models`` lists them, vLLM's way)
  or by llama.cpp's ``lora`` field on ``/infill`` and ``/completion`` (``GET /lora-adapters``); adapters.py.
- llama.cpp's ``POST /completion`` (one prompt: text, token ids or both mixed; whole or streamed, with
  ids when ``return_tokens``) and ``GET /props``: so ``StarCoderEngine.connect("http://host:8080",
  model=...)`` drives this server like a llama-server.

While you type (docs/server.md): a newer ``/infill`` or ``/v1/completions`` (with ``suffix``) request for
the same document (tenant and ``cache_salt``, ``file_path``, ``id_slot``) cancels the older one still running,
which answers as cancelled; ``n_predict``/``max_tokens`` 0 prefills and caches without answering text;
``fim_mode`` "spm" puts the suffix first (a keystroke then prefills only the prefix's changed end).

Errors are OpenAI-shaped JSON (``{"error": {"message", "type", "param", "code"}}``): 400 for bad input
(a list field with more items than ``limits`` allows too), 401 without an API key when keys are set (each key
is a tenant; a request's ``cache_salt``, vLLM's field, partitions its tenant's cache further), 413 when
the body passes ``max_body_bytes`` or the prompt plus ``max_tokens`` pass the context window, 503 while the
model loads (editor/statuses.py: the Jupyter extension's map too); an unexpected error is a 500 naming an
id in the server's log, never the error's text. Generation runs through the engine's async API, so the event
loop never blocks; a client that disconnects cancels its generation (and one that leaves mid-body is a debug
line, not an error).
"""

from __future__ import annotations

try:
    import sse_starlette  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as e:  # an optional extra: say how to get it
    msg = f"The server needs the 'server' extra ({e.name} is missing): pip install -e \".[server]\"."
    raise ImportError(msg, name=e.name) from e

from .app import create_app
from .connections import BoundedConfig

__all__ = ["BoundedConfig", "create_app"]
