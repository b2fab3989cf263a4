"""One engine per (checkpoint, settings), shared by every wrapper in the process.

A notebook that builds three chains over one checkpoint holds one copy of the weights.
"""

from __future__ import annotations

import inspect
import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from .engine import StarCoderEngine

#: The model the wrappers and the command line use when none is named.
DEFAULT_MODEL = "mlx-community/starcoder2-3b-4bit"

# A setting left out and the same setting at its default are one engine (defaults read from the
# loader and from connect).
_LOAD_DEFAULTS = {
    name: p.default
    for method in (StarCoderEngine.load, StarCoderEngine.connect)
    for name, p in inspect.signature(method).parameters.items()
    if p.kind is p.KEYWORD_ONLY and p.default is not p.empty
}
_lock = threading.Lock()
_engines: dict[tuple[Any, ...], Future[StarCoderEngine]] = {}


def _key(model: str | os.PathLike[str], settings: dict[str, Any]) -> tuple[Any, ...]:
    """The registry key: the checkpoint (a folder by its real path) and the load settings
    (``quantize``, ``dtype``, ``kv_bits``, ``revision``, ``gguf_file``: keywords of
    ``StarCoderEngine.load``; or ``base_url``, ``tokenizer``, ``api_key``, ``timeout``, ``deadline``,
    ``max_retries`` of ``StarCoderEngine.connect``)."""
    path = Path(model).expanduser()
    name = str(path.resolve()) if path.exists() else str(model)
    return (name, *sorted({**_LOAD_DEFAULTS, **settings}.items()))


def peek_engine(model: str | os.PathLike[str], **settings: Any) -> StarCoderEngine | None:
    """The shared engine for these settings if it is loaded already; never loads."""
    with _lock:
        future = _engines.get(_key(model, settings))
    if future is None or not future.done() or future.exception() is not None:
        return None
    return future.result()


def get_engine(model: str | os.PathLike[str], **settings: Any) -> StarCoderEngine:
    """The shared engine for these settings, loading it on first use.

    Callers asking for an engine that is being loaded wait for that load; other engines stay
    available meanwhile.
    """
    key = _key(model, settings)
    with _lock:
        future = _engines.get(key)
        loading = future is None
        if loading:
            future = _engines[key] = Future()
    if loading:
        try:
            engine = _open(model, settings)
        except BaseException as e:
            with _lock:
                del _engines[key]  # a failed load is not remembered: the next call tries again
            future.set_exception(e)
            raise
        future.set_result(engine)
    return future.result()


def _open(model: str | os.PathLike[str], settings: dict[str, Any]) -> StarCoderEngine:
    """Load the checkpoint, or, with a ``base_url``, connect to the server that serves it."""
    if settings.get("base_url") is None:
        return StarCoderEngine.load(model, **settings)
    connect = {k: v for k, v in settings.items() if k != "base_url"}
    key = connect.get("api_key")
    connect["api_key"] = key.get_secret_value() if hasattr(key, "get_secret_value") else key
    return StarCoderEngine.connect(settings["base_url"], model=os.fspath(model), **connect)


def release_engines() -> None:
    """Close and forget every shared engine (frees their weights once no wrapper holds them)."""
    with _lock:
        futures = list(_engines.values())
        _engines.clear()
    for future in futures:
        if future.done() and future.exception() is None:
            future.result().close()
