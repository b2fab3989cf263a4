"""Prompt caches kept in a folder across processes: found by the longest shared token prefix,
written off the worker thread, atomically, within a byte limit (least recently used go first).

Files are named ``<key>-<tokens>.safetensors``: ``key`` (:mod:`.fingerprint`) says which weights and
settings made them, and for which partition of the cache (:func:`.fingerprint.partition_key`: a digest,
never the salt), so a process ignores files of other models and a request those of other partitions,
without reading them; they age out through the byte limit (one limit for all). A file that claims
its key but is damaged, truncated or does not match is removed with one notice; its header is checked
against the model's cache layout (:mod:`.layout`) before any of its data is read. The folder's
last-modified times are the LRU order: a file is touched when it is used. The folder is private
(:mod:`.folder`): one that another user could have written turns the disk cache off, with one notice.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from ...loading.private_folder import Folder, NotPrivateError
from ...types import CachePartition
from .files import CacheFileError, Header, Tensor, dtype_name, read_header, read_tensors, write_cache_file
from .fingerprint import partition_key
from .layout import CacheLayout
from .memory import prefix_copy

#: A cache is written when it holds at least this many tokens more than the longest prefix on disk:
#: shorter prompts prefill in well under a second on the CPU, and each file costs a write.
MIN_NEW_TOKENS = 256
#: A file is read instead of the in-memory cache only when it saves at least this many tokens.
MIN_GAIN_TOKENS = 32
_MAX_PENDING = 2  # writes queued at most; a later offer is dropped instead of holding more copies
_STALE_TEMP_SECONDS = 600  # a temporary file this old was left by a process that died mid-write
_SUFFIX = ".safetensors"
#: The names this package gives its files: eviction removes no other file, whatever the folder holds.
_OUR_NAME = re.compile(r"[0-9a-f]{16}-[0-9a-f]{20}\.safetensors")
# What a file that cannot be used raises, short of vanishing: it is then skipped and removed.
_UNUSABLE = (CacheFileError, NotPrivateError, OSError, ValueError, KeyError, TypeError)


class PromptCacheNotice(UserWarning):
    """A prompt-cache file was skipped, or the folder could not be written or trusted; the engine
    still answers."""


class DiskPromptCache:
    """The prompt-cache files of one engine in ``folder`` (see the module docs).

    ``longest`` and ``load`` run on the backend's worker (``load`` makes MLX arrays); ``offer``
    copies a cache out of MLX there and leaves the write to a thread of its own.
    """

    def __init__(self, folder: Path, key: str, max_bytes: int, layout: CacheLayout):
        self.folder = folder
        self.key = key
        self.max_bytes = max_bytes
        self.layout = layout
        self._lock = threading.Lock()  # the index and pending count: worker and writer both touch them
        # partition key -> file name -> the token ids it holds (the partitions that have files)
        self._index: dict[str, dict[str, np.ndarray]] = {}
        self._pending = 0
        self._warned: set[str] = set()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="starcoder-prompt-cache-writer")
        self.trusted = True  # False once the folder is seen not to be private: nothing read or written
        self.writable = self._make_folder()

    # --- finding and reading (worker thread) ---------------------------------------------------

    def key_of(self, partition: CachePartition) -> str:
        """The key of ``partition``'s files (the default partition's is :attr:`key`)."""
        return partition_key(self.key, partition)

    def longest(self, tokens: Sequence[int], partition: CachePartition) -> tuple[str | None, int]:
        """``partition``'s file sharing the longest token prefix with ``tokens``, and that length."""
        key = self.key_of(partition)
        self._refresh(key)
        query = np.asarray(tokens, dtype=np.int64)
        best, best_len = None, 0
        with self._lock:
            entries = list(self._index.get(key, {}).items())
        for name, held in entries:
            n = _common_prefix(held, query)
            if n > best_len:
                best, best_len = name, n
        return best, best_len

    def load(self, name: str, tokens: Sequence[int], n: int, partition: CachePartition) -> list[Any] | None:
        """The cache in ``partition``'s file ``name`` for the first ``n`` of ``tokens``; None (with one
        notice, the file removed) if it is damaged or does not match, or None if it vanished or
        changed meanwhile."""
        try:
            with self._open() as folder:
                return self._load(folder, name, tokens, n, self.key_of(partition))
        except (OSError, NotPrivateError):  # the folder is gone, or no longer private (turned off)
            self._forget(name)
            return None

    def _load(self, folder: Folder, name: str, tokens: Sequence[int], n: int, key: str) -> list[Any] | None:
        try:
            with folder.open(name) as f:
                header = read_header(f, self.layout.max_header_bytes)
                held = self._held_tokens(header, key)
                if held[:n] != list(tokens[:n]):  # replaced since it was indexed
                    self._forget(name)
                    return None
                cache = self._caches(read_tensors(f, header), len(held))
                with contextlib.suppress(OSError):
                    os.utime(f.fileno())  # most recently used
        except FileNotFoundError:  # evicted by another process since the lookup
            self._forget(name)
            return None
        except _UNUSABLE as e:
            self._discard(folder, name, str(e))
            return None
        if n < len(held):
            cache = [prefix_copy(c, n) for c in cache]
        return cache

    def _held_tokens(self, header: Header, key: str) -> list[int]:
        """The token ids of a file whose header says ``key`` and describes this model's cache."""
        if header.metadata.get("0.key") != key:
            msg = "it was made by other weights or settings"
            raise CacheFileError(msg)
        return self.layout.checked_tokens(header)

    def _caches(self, tensors: dict[str, Tensor], held: int) -> list[Any]:
        """The layer caches of a file's tensors, which have this model's shapes for ``held`` tokens."""
        layout = self.layout
        scalars = [held] if layout.kv_bits is None else [held, layout.kv_group_size, layout.kv_bits]
        cache = []
        for i in range(layout.layers):
            if [int(tensors[f"{i}.{2 + j}"].data) for j in range(len(scalars))] != scalars:
                msg = f"layer {i} records another offset or quantization"
                raise CacheFileError(msg)
            if layout.kv_bits is None:
                state = (_mlx(tensors[f"{i}.0"]), _mlx(tensors[f"{i}.1"]), held)
                cache.append(KVCache.from_state(state))
            else:
                keys, values = (tuple(_mlx(tensors[f"{i}.{p}.{j}"]) for j in range(3)) for p in "01")
                cache.append(QuantizedKVCache.from_state((keys, values, *scalars)))
        return cache

    # --- writing (a copy on the worker, the file on the writer thread) -------------------------

    def offer(self, tokens: Sequence[int], cache: list[Any], partition: CachePartition) -> None:
        """Keep ``cache`` (which holds ``tokens``) on disk for ``partition`` if it holds enough that
        partition's files lack."""
        if not (self.writable and self.trusted) or len(tokens) < MIN_NEW_TOKENS:
            return
        if not all(type(c) in (KVCache, QuantizedKVCache) for c in cache):
            return  # a cache of another kind (rotating, say) is not one this format holds
        _, on_disk = self.longest(tokens, partition)
        if len(tokens) - on_disk < MIN_NEW_TOKENS:
            return
        with self._lock:
            if self._pending >= _MAX_PENDING:
                return
            self._pending += 1
        try:
            tensors = _snapshot(cache, len(tokens))
            self._writer.submit(self._write, list(tokens), tensors, self.key_of(partition))
        except Exception as e:  # the interpreter exiting, say: the request still ends as it would
            with self._lock:
                self._pending -= 1
            self._notice("write", f"Could not keep a prompt cache in {self.folder} ({e}).")

    def _write(self, tokens: list[int], tensors: list[Tensor], key: str) -> None:
        digest = hashlib.blake2b(np.asarray(tokens, dtype=np.int64).tobytes(), digest_size=10).hexdigest()
        name = f"{key[:16]}-{digest}{_SUFFIX}"
        metadata = _mlx_lm_metadata(
            {"key": key, "tokens": json.dumps(tokens, separators=(",", ":"))},
            ["KVCache" if self.layout.kv_bits is None else "QuantizedKVCache"] * self.layout.layers,
            [t.name for t in tensors if t.shape == ()],
        )
        try:
            with self._open(make=True) as folder:  # removed under a running engine: made again
                with folder.replacing(name) as f:
                    write_cache_file(f, tensors, metadata)
                with self._lock:
                    self._index.setdefault(key, {})[name] = np.asarray(tokens, dtype=np.int64)
                self._evict(folder)
        except NotPrivateError:
            pass  # the folder is no longer private: the disk cache is off, and said so
        except OSError as e:
            self._notice(
                "write",
                f"Could not write a prompt cache to {self.folder} ({e.strerror or e}); the engine "
                "answers as before, prefilling what a kept cache would have saved.",
            )
        finally:
            with self._lock:
                self._pending -= 1

    def _evict(self, folder: Folder) -> None:
        """Remove the least recently used files of any model until the folder is within its limit
        (one process at a time, so two never count the folder while the other removes)."""
        with folder.locked():
            files, total, now = [], 0, time.time()
            for entry in folder.entries():
                with contextlib.suppress(FileNotFoundError):
                    st = folder.stat(entry.name)
                    if entry.name.endswith(".tmp") and now - st.st_mtime > _STALE_TEMP_SECONDS:
                        folder.remove(entry.name)
                    elif _OUR_NAME.fullmatch(entry.name) and stat.S_ISREG(st.st_mode):
                        files.append((st.st_mtime_ns, st.st_size, entry.name))
                        total += st.st_size
            for _, size, name in sorted(files):
                if total <= self.max_bytes:
                    break
                with contextlib.suppress(FileNotFoundError):
                    folder.remove(name)
                self._forget(name)
                total -= size

    def flush(self) -> None:
        """Wait for the writes queued so far."""
        self._writer.submit(lambda: None).result()

    def close(self) -> None:
        self._writer.shutdown(wait=True)

    # --- the folder and the index --------------------------------------------------------------

    def _open(self, make: bool = False) -> Folder:
        """The folder, opened and checked (made first if ``make``); one that is not private turns
        the disk cache off, with one notice, and raises NotPrivateError."""
        if not self.trusted:
            msg = f"The prompt-cache folder {self.folder} is not private"
            raise NotPrivateError(msg)
        try:
            return Folder.made(self.folder) if make else Folder(self.folder)
        except NotPrivateError as e:
            self._turn_off(str(e))
            raise

    def _refresh(self, key: str) -> None:
        """Index ``key``'s files (written by any process): new ones by their header, gone ones
        dropped. Files of other keys are not read."""
        try:
            with self._open() as folder:
                ours = [e.name for e in folder.entries() if e.name.endswith(_SUFFIX)]
                names = {name for name in ours if name.startswith(key[:16])}
                with self._lock:
                    index = self._index.get(key, {})
                    for gone in set(index) - names:
                        del index[gone]
                    if not index:
                        self._index.pop(key, None)
                    new = names - set(index)
                for name in new:
                    self._index_file(folder, name, key)
        except (OSError, NotPrivateError):  # not there (yet), unreadable, or not private: no files
            with self._lock:
                self._index.clear()

    def _index_file(self, folder: Folder, name: str, key: str) -> None:
        try:
            with folder.open(name) as f:
                tokens = self._held_tokens(read_header(f, self.layout.max_header_bytes), key)
        except FileNotFoundError:
            return
        except _UNUSABLE as e:
            self._discard(folder, name, str(e))
            return
        with self._lock:
            self._index.setdefault(key, {})[name] = np.asarray(tokens, dtype=np.int64)

    def _forget(self, name: str) -> None:
        """Drop ``name`` from the index (and a partition left without files: salts may be many)."""
        with self._lock:
            for key, index in list(self._index.items()):
                index.pop(name, None)
                if not index:
                    del self._index[key]

    def _discard(self, folder: Folder, name: str, why: str) -> None:
        self._forget(name)
        with contextlib.suppress(OSError):
            folder.remove(name)
        self._notice(name, f"Skipped and removed the prompt-cache file {self.folder / name}: {why}.")

    def _turn_off(self, why: str) -> None:
        self.trusted = False
        with self._lock:
            self._index.clear()
        self._notice(
            "private",
            f"{why}: another user could have written its prompt caches, so this engine neither reads "
            "nor writes any there and answers as before, prefilling each prompt. Give prompt_cache_dir "
            "a folder of your own that group and others cannot write (chmod go-w), or none.",
        )

    def _notice(self, topic: str, msg: str) -> None:
        """One notice per file or kind of failure for the life of the engine."""
        with self._lock:
            if topic in self._warned:
                return
            self._warned.add(topic)
        warnings.warn(msg, PromptCacheNotice, stacklevel=3)

    def _make_folder(self) -> bool:
        """Whether the folder can be written (made private if missing); a folder that is not private
        is turned off here, with its notice."""
        try:
            with self._open(make=True) as folder:
                probe = f".probe.{os.getpid()}.{threading.get_ident()}.tmp"  # one per engine: none race
                with folder.replacing(probe):
                    pass
                folder.remove(probe)
        except NotPrivateError:
            return False
        except OSError as e:
            self._notice(
                "write",
                f"The prompt-cache folder {self.folder} cannot be written ({e.strerror or e}); caches "
                "already in it are used, none are added.",
            )
            return False
        return True


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def _snapshot(cache: list[Any], n: int) -> list[Tensor]:
    """Numpy copies of the first ``n`` positions of every layer, in mlx-lm's state order (worker thread)."""
    named: list[tuple[str, mx.array]] = []
    scalars: list[tuple[str, int]] = []
    for i, layer in enumerate(cache):
        if isinstance(layer, QuantizedKVCache):
            for p, part in enumerate((layer.keys, layer.values)):
                named += [(f"{i}.{p}.{j}", a[..., :n, :]) for j, a in enumerate(part)]
            scalars += [(f"{i}.2", n), (f"{i}.3", layer.group_size), (f"{i}.4", layer.bits)]
        else:
            named += [(f"{i}.0", layer.keys[..., :n, :]), (f"{i}.1", layer.values[..., :n, :])]
            scalars.append((f"{i}.2", n))
    mx.eval([a for _, a in named])
    tensors = []
    for name, a in named:
        kind = dtype_name(str(a.dtype).removeprefix("mlx.core."))
        data = np.array(a.view(mx.uint16) if kind == "BF16" else a)
        tensors.append(Tensor(name, kind, tuple(a.shape), data))
    tensors += [Tensor(name, "I32", (), np.array(v, dtype=np.int32)) for name, v in scalars]
    return sorted(tensors, key=lambda t: _state_order(t.name))


def _state_order(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split("."))


def _mlx(tensor: Tensor) -> mx.array:
    a = mx.array(tensor.data)
    return a.view(mx.bfloat16) if tensor.dtype == "BF16" else a


def _mlx_lm_metadata(ours: dict[str, str], classes: list[str], scalar_names: list[str]) -> dict[str, str]:
    """mlx-lm's ``save_prompt_cache`` metadata: ours under ``0.``, the cache classes under ``1.``,
    the scalar tensors under ``2.`` (so ``load_prompt_cache`` turns them back into ints)."""
    metadata = {f"0.{k}": v for k, v in ours.items()}
    metadata.update({f"1.{i}": c for i, c in enumerate(classes)})
    metadata["2.0"] = ""
    for i, name in enumerate(scalar_names, start=1):
        metadata[f"2.{i}.0"], metadata[f"2.{i}.1"] = name, "scalar"
    return metadata
