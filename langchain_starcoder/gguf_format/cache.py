"""GGUF files converted from checkpoint folders once and kept in the user's cache, keyed by content."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .write import convert_to_gguf

#: Where converted files go: ``$LANGCHAIN_STARCODER_CACHE/gguf``, else the user's cache folder.
CACHE_ENV = "LANGCHAIN_STARCODER_CACHE"
#: Bytes hashed from each weights file: its start, its end and evenly spaced pieces between.
_SAMPLE, _PIECES = 1 << 20, 32


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    if not root:
        root = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "langchain-starcoder"
    return Path(root).expanduser() / "gguf"


def fingerprint(checkpoint: Path) -> str:
    """A hash of what the GGUF file is made of: config and tokenizer files whole, and each weights
    file's header, size and sampled content (hashing gigabytes on every load would cost a minute).
    A changed file changes its size, its header or the bytes sampled from it."""
    digest = hashlib.sha256()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        file = checkpoint / name
        if file.is_file():
            digest.update(name.encode() + b"\0" + file.read_bytes() + b"\0")
    for file in sorted(checkpoint.glob("model*.safetensors")):
        size = file.stat().st_size
        digest.update(f"{file.name}\0{size}\0".encode())
        with open(file, "rb") as fh:
            for i in range(_PIECES + 1):
                fh.seek(max(0, (size - _SAMPLE) * i // _PIECES))
                digest.update(fh.read(_SAMPLE))
    return digest.hexdigest()[:24]


def cached_gguf(checkpoint: Path, outtype: str, directory: Path | None = None) -> Path:
    """``checkpoint`` as a GGUF file of ``outtype``, converted on first use (written beside its
    place, then moved there: a crash leaves no half file behind)."""
    directory = directory or cache_dir()
    config = json.loads((checkpoint / "config.json").read_text())
    name = f"{config.get('model_type', 'model')}-{fingerprint(checkpoint)}-{outtype}.gguf"
    target = directory / name
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{name}.{os.getpid()}.partial"
    try:
        convert_to_gguf(checkpoint, partial, outtype=outtype)
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return target
