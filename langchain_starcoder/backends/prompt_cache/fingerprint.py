"""What a prompt-cache file is valid for: a key over the weights' contents and every setting that
changes the KV values (dtype, quantization, kv_bits, window, tokenizer, MLX and the device)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ...loading.digests import file_digest, file_stamp
from ...loading.private_folder import Folder, NotPrivateError, make_private
from ...types import CachePartition

#: Bumped whenever what a file holds or how it is keyed changes: older files are then never used.
FORMAT_VERSION = 1
_MEMO_NAME = ".fingerprints.json"


def weight_files(path: Path) -> list[Path]:
    """The files a checkpoint's weights and architecture come from: a GGUF file itself, or a
    folder's safetensors and config.json."""
    if path.is_file():
        return [path]
    return sorted([*path.glob("*.safetensors"), path / "config.json"])


def weights_fingerprint(path: Path, memo_dir: Path | None) -> str:
    """A digest of the checkpoint's file contents. Each file is hashed once per (path, size,
    mtime, inode) (:mod:`langchain_starcoder.loading.digests`), remembered in this process and in
    ``memo_dir``: a file rebuilt in place gets a new mtime and is hashed again."""
    stored = _read_memo(memo_dir)
    digest, changed = hashlib.blake2b(digest_size=20), False
    for file in weight_files(path):
        stamp = file_stamp(file)
        entry = stored.get(stamp.path)
        remembered = entry.get("digest") if stamp.matches(entry) else None
        known = file_digest(file, stamp, str(remembered) if remembered is not None else None)
        if remembered is None:
            stored[stamp.path] = {**stamp.fields(), "digest": known}
            changed = True
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
    """The digests remembered in ``memo_dir``, if it and the file are private
    (:mod:`langchain_starcoder.loading.private_folder`):
    a digest decides which files are valid, so one another user could have written is not used."""
    if memo_dir is None:
        return {}
    try:
        with Folder(memo_dir) as folder, folder.open(_MEMO_NAME) as f:
            stored = json.load(f)
    except (OSError, ValueError, NotPrivateError):  # none yet, damaged or not private: hash again
        return {}
    return stored if isinstance(stored, dict) else {}


def _write_memo(memo_dir: Path | None, stored: dict[str, Any]) -> None:
    if memo_dir is None:
        return
    # A read-only, missing or not private folder: the digests are hashed again next time.
    with (
        contextlib.suppress(OSError, NotPrivateError),
        Folder(memo_dir) as folder,
        folder.replacing(_MEMO_NAME) as f,
    ):
        f.write(json.dumps(stored).encode())


def hash_weights_aside(path: Path | None, folder: Path) -> Future[str] | None:
    """The digest of the checkpoint's weight files, hashed on a thread of its own (no MLX there);
    ``folder`` remembers digests across processes (made here, if it can be)."""
    if path is None:
        return None
    # A folder that cannot be made, or is not private, gets its notice from the disk cache; its
    # digests are then neither read nor written (the weights are hashed all the same).
    with contextlib.suppress(OSError, NotPrivateError):
        make_private(folder)
    memo = folder
    future: Future[str] = Future()

    def run() -> None:
        try:
            future.set_result(weights_fingerprint(path, memo))
        except BaseException as e:  # an unreadable weight file: the load reports it first
            future.set_exception(e)

    threading.Thread(target=run, name="starcoder-weights-digest", daemon=True).start()
    return future


def partition_key(key: str, partition: CachePartition) -> str:
    """The key of ``partition``'s files among those valid for ``key``: ``key`` itself for the default
    partition (files written before partitions existed stay valid), else a digest of both (a file
    records it, never the salt)."""
    return key if partition.is_default else cache_key({"key": key, "partition": partition.digest})
