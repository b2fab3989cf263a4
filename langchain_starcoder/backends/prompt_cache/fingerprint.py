"""What a prompt-cache file is valid for: a key over the weights' contents and every setting that
changes the KV values (dtype, quantization, kv_bits, window, tokenizer, MLX and the device)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

#: Bumped whenever what a file holds or how it is keyed changes: older files are then never used.
FORMAT_VERSION = 1
_MEMO_NAME = ".fingerprints.json"
_memo_lock = threading.Lock()
_memo: dict[tuple[str, int, int, int], str] = {}  # (path, size, mtime_ns, inode) -> digest


def weight_files(path: Path) -> list[Path]:
    """The files a checkpoint's weights and architecture come from: a GGUF file itself, or a
    folder's safetensors and config.json."""
    if path.is_file():
        return [path]
    return sorted([*path.glob("*.safetensors"), path / "config.json"])


def weights_fingerprint(path: Path, memo_dir: Path | None) -> str:
    """A digest of the checkpoint's file contents. Each file is hashed once per (path, size,
    mtime, inode), remembered in this process and in ``memo_dir``: a file rebuilt in place gets a
    new mtime and is hashed again."""
    stored = _read_memo(memo_dir)
    digest, changed = hashlib.blake2b(digest_size=20), False
    for file in weight_files(path):
        stat = file.stat()
        real = str(file.resolve())
        memo_key = (real, stat.st_size, stat.st_mtime_ns, stat.st_ino)
        with _memo_lock:
            known = _memo.get(memo_key)
        if known is None:
            stamp = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ino": stat.st_ino}
            entry = stored.get(real)
            if isinstance(entry, dict) and all(entry.get(k) == v for k, v in stamp.items()):
                known = str(entry.get("digest"))
            else:
                with open(file, "rb") as f:
                    known = hashlib.file_digest(f, "blake2b").hexdigest()
                stored[real] = {**stamp, "digest": known}
                changed = True
            with _memo_lock:
                _memo[memo_key] = known
        digest.update(f"{file.name}:{known};".encode())
    if changed:
        _write_memo(memo_dir, stored)
    return digest.hexdigest()


def vocab_fingerprint(vocab: Mapping[str, int], extra: Iterable[Any] = ()) -> str:
    """A digest of a tokenizer's vocabulary (token -> id) and anything else that shapes its ids."""
    text = json.dumps([sorted(vocab.items(), key=lambda kv: kv[1]), list(extra)], ensure_ascii=False)
    return hashlib.blake2b(text.encode(), digest_size=20).hexdigest()


def cache_key(parts: Mapping[str, Any]) -> str:
    """One digest of every part that must match for a file to be used (the format version included)."""
    text = json.dumps({"format": FORMAT_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=20).hexdigest()


def _read_memo(memo_dir: Path | None) -> dict[str, Any]:
    if memo_dir is None:
        return {}
    try:
        stored = json.loads((memo_dir / _MEMO_NAME).read_text())
    except (OSError, ValueError):  # none yet, or damaged: hash again
        return {}
    return stored if isinstance(stored, dict) else {}


def _write_memo(memo_dir: Path | None, stored: dict[str, Any]) -> None:
    if memo_dir is None:
        return
    temp = memo_dir / f"{_MEMO_NAME}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        temp.write_text(json.dumps(stored))
        os.replace(temp, memo_dir / _MEMO_NAME)
    except OSError:  # a read-only or missing folder: the digests are hashed again next time
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)


def hash_weights_aside(path: Path | None, folder: Path) -> Future[str] | None:
    """The digest of the checkpoint's weight files, hashed on a thread of its own (no MLX there);
    ``folder`` remembers digests across processes (made here, if it can be)."""
    if path is None:
        return None
    with contextlib.suppress(OSError):  # a folder that cannot be made gets its notice later
        folder.mkdir(parents=True, exist_ok=True)
    memo = folder if folder.is_dir() else None
    future: Future[str] = Future()

    def run() -> None:
        try:
            future.set_result(weights_fingerprint(path, memo))
        except BaseException as e:  # an unreadable weight file: the load reports it first
            future.set_exception(e)

    threading.Thread(target=run, name="starcoder-weights-digest", daemon=True).start()
    return future
