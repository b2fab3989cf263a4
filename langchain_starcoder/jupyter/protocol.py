"""What the labextension sends to ``POST langchain-starcoder/complete`` and what it gets back: the request
checked field by field (a bad one is refused with what is wrong: a :class:`RequestError`, whose status the
editor's one map gives, editor/statuses.py), and the NDJSON lines of the answer.

The model, its backend and where it runs (a remote server's URL) are the Jupyter server's configuration,
never a request's: a request that names one is refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..editor.statuses import RequestError
from ..types import GHOST_TEXT_MAX_TOKENS

#: What the server's configuration chooses (:class:`~.config.StarCoderJupyter`), never a request.
SERVER_SETTINGS = ("model", "backend", "base_url")
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class CompletionAsk:
    """One completion request of the labextension, checked."""

    prefix: str
    """The hole's cell (or file) text before the cursor, as the editor shows it now."""
    suffix: str
    """Its text after the cursor."""
    path: str
    """The document's path relative to the server's root ("" when unknown): newer requests for the same
    path supersede older ones, and a file's repository context is looked up for it."""
    notebook: Mapping[str, Any] | None
    """The live notebook as nbformat-4 JSON (the hole's cell included), or None for a file."""
    cell: int | None
    """The index of the hole's cell in ``notebook["cells"]``."""
    max_tokens: int
    """The most tokens of the middle; a warm-up's prompt is budgeted for it too (the same prompt)."""
    warm_up: bool
    """Only fill the engine's cache with the prompt (the user moved to this cell, a cell ran): nothing is
    generated or answered but the done line, and it never supersedes a request that generates."""
    repo_context: bool
    """Add the server root's repository context (the modules a notebook imports, a file's related code)."""
    request_id: str
    temperature: float


def parse_ask(body: Any) -> CompletionAsk:
    """The request's JSON body, checked; :class:`RequestError` names the first bad field."""
    if not isinstance(body, Mapping):
        raise RequestError("The request body must be a JSON object with at least 'prefix'.")
    notebook, cell = body.get("notebook"), body.get("cell")
    if notebook is not None and not isinstance(notebook, Mapping):
        raise RequestError("notebook must be the notebook's nbformat-4 JSON (an object), or null for a file.")
    if notebook is not None and not _is_int(cell):
        raise RequestError("cell must be the index of the hole's cell in notebook.cells (an integer).")
    max_tokens = body.get("max_tokens", GHOST_TEXT_MAX_TOKENS)
    if not _is_int(max_tokens) or max_tokens < 1:
        raise RequestError(f"max_tokens must be a positive integer, not {max_tokens!r}.")
    temperature = body.get("temperature", 0.0)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0:
        raise RequestError(f"temperature must be a number >= 0, not {temperature!r}.")
    for name in SERVER_SETTINGS:
        if body.get(name) is not None:  # older bundles send null: only a value is refused
            msg = (
                f"{name} is not taken from a request: the model, its backend and the server to generate "
                f"on are the Jupyter server's configuration (c.StarCoderJupyter.{name} in "
                f"jupyter_server_config.py, or jupyter lab --StarCoderJupyter.{name}=...)."
            )
            raise RequestError(msg)
    repo_context, warm_up = body.get("repo_context", False), body.get("warm_up", False)
    for name, value in (("repo_context", repo_context), ("warm_up", warm_up)):
        if not isinstance(value, bool):
            raise RequestError(f"{name} must be true or false, not {value!r}.")
    return CompletionAsk(
        prefix=_text(body, "prefix", required=True) or "",
        suffix=_text(body, "suffix") or "",
        path=_text(body, "path") or "",
        notebook=notebook,
        cell=cell if notebook is not None else None,
        max_tokens=max_tokens,
        warm_up=warm_up,
        repo_context=repo_context,
        request_id=_text(body, "request_id") or "",
        temperature=float(temperature),
    )


def _text(body: Mapping[str, Any], name: str, *, required: bool = False) -> str | None:
    """A string field; "" and null (JupyterLab's unset settings) are None, except for required text."""
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise RequestError(f"{name} must be a string, not {type(value).__name__}.")
    if _SURROGATE.search(value):  # JSON's "\\ud800" alone: no text a tokenizer can encode
        raise RequestError(f"{name} holds a lone surrogate (\\ud800-\\udfff): not Unicode text.")
    return value if value or required else None


def read_body(body: bytes) -> Any:
    """The request's body as JSON; :class:`RequestError` when it is not JSON or nests too deeply for
    the parser (Python's recursion limit)."""
    try:
        return json.loads(body or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(f"The request body is not JSON: {e}") from None
    except RecursionError:
        raise RequestError("The request body nests too deeply to be read (arrays or objects).") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def line(**fields: Any) -> bytes:
    """One NDJSON line of the answer."""
    return json.dumps(fields, ensure_ascii=False).encode() + b"\n"
