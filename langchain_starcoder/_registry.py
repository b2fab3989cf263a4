"""One engine per (checkpoint, settings), shared by every wrapper in the process.

A notebook that builds three chains over one checkpoint holds one copy of the weights.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from .engine import StarCoderEngine
from .engine.options import load_options, remote_options

#: The model the wrappers and the command line use when none is named.
DEFAULT_MODEL = "mlx-community/starcoder2-3b-4bit"

_lock = threading.Lock()
_engines: dict[tuple[Any, ...], Future[StarCoderEngine]] = {}


def _key(model: str | os.PathLike[str], settings: dict[str, Any]) -> tuple[Any, ...]:
    """The registry key: the checkpoint (a folder by its real path), the server's URL (None for a
    local model) and the typed options (a setting left out and the same setting at its default are
    one engine). ``settings`` are ``StarCoderEngine.load``'s keywords (``options=`` included); or,
    with a ``base_url``, ``connect``'s (``api_key`` may be a pydantic ``SecretStr``)."""
    path = Path(model).expanduser()
    name = str(path.resolve()) if path.exists() else str(model)
    settings = dict(settings)
    base_url = settings.pop("base_url", None)
    if base_url is None:
        return (name, None, load_options(**settings))
    key = settings.get("api_key")
    if hasattr(key, "get_secret_value"):
        settings["api_key"] = key.get_secret_value()
    return (name, base_url, remote_options(**settings))


def peek_engine(model: str | os.PathLike[str], **settings: Any) -> StarCoderEngine | None:
    """The shared engine for these settings if it is loaded already; never loads."""
    with _lock:
        if not _engines:  # nothing loaded: not even the options' checks (they import MLX) are needed
            return None
    key = _key(model, settings)
    with _lock:
        future = _engines.get(key)
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
            engine = _open(model, *key[1:])
        except BaseException as e:
            with _lock:
                del _engines[key]  # a failed load is not remembered: the next call tries again
            future.set_exception(e)
            raise
        future.set_result(engine)
    return future.result()


def _open(model: str | os.PathLike[str], base_url: str | None, options: Any) -> StarCoderEngine:
    """Load the checkpoint, or, with a ``base_url``, connect to the server that serves it."""
    if base_url is None:
        return StarCoderEngine.load(model, options=options)
    return StarCoderEngine.connect(base_url, model=os.fspath(model), options=options)


def release_engines() -> None:
    """Close and forget every shared engine (frees their weights once no wrapper holds them)."""
    with _lock:
        futures = list(_engines.values())
        _engines.clear()
    for future in futures:
        if future.done() and future.exception() is None:
            future.result().close()
