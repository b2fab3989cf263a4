"""One engine per (checkpoint, settings), shared by every wrapper in the process.

A notebook that builds three chains over one checkpoint holds one copy of the weights.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from .engine import StarCoderEngine

_lock = threading.Lock()
_engines: dict[tuple[Any, ...], StarCoderEngine] = {}


def _key(model: str | os.PathLike[str], quantize: Any, dtype: Any, kv_bits: Any) -> tuple[Any, ...]:
    path = Path(model).expanduser()
    name = str(path.resolve()) if path.exists() else str(model)
    return (name, quantize, dtype, kv_bits)


def get_engine(
    model: str | os.PathLike[str],
    *,
    quantize: int | None = None,
    dtype: str = "auto",
    kv_bits: int | None = None,
    revision: str | None = None,
) -> StarCoderEngine:
    """The shared engine for these settings, loading it on first use."""
    key = _key(model, quantize, dtype, kv_bits)
    with _lock:  # loads are rare; one at a time keeps two callers from loading the same weights
        engine = _engines.get(key)
        if engine is None:
            engine = StarCoderEngine.load(
                model, quantize=quantize, dtype=dtype, kv_bits=kv_bits, revision=revision
            )
            _engines[key] = engine
        return engine


def release_engines() -> None:
    """Close and forget every shared engine (frees their weights once no wrapper holds them)."""
    with _lock:
        for engine in _engines.values():
            engine.close()
        _engines.clear()
