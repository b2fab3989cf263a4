"""Whole-file digests, each file hashed once per version: what the prompt caches on disk and the GGUF
files converted for llama.cpp are valid for.

A version is a :class:`FileStamp` (resolved path, size, mtime, inode): a file rebuilt or edited in place
gets a new one and is hashed again. Digests are remembered in this process; a caller that keeps them
across processes (beside its cache) passes the one it remembers for the same stamp.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any, NamedTuple


class FileStamp(NamedTuple):
    """One version of a file, told without reading it."""

    path: str  # resolved: a hub snapshot's link and its blob are one file
    size: int
    mtime_ns: int
    ino: int

    def fields(self) -> dict[str, int]:
        """What a remembered digest is stored with (the path is its key)."""
        return {"size": self.size, "mtime_ns": self.mtime_ns, "ino": self.ino}

    def matches(self, entry: Any) -> bool:
        """Whether ``entry`` (a stored dict of :meth:`fields` and a digest) is of this version."""
        return isinstance(entry, dict) and all(entry.get(k) == v for k, v in self.fields().items())


def file_stamp(file: Path) -> FileStamp:
    stat = file.stat()
    return FileStamp(str(file.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)


_lock = threading.Lock()
_memo: dict[FileStamp, str] = {}


def file_digest(file: Path, stamp: FileStamp | None = None, known: str | None = None) -> str:
    """The blake2b digest (hex) of ``file``'s whole content, hashed once per stamp in this process.
    ``known``: the digest a caller remembers for this same stamp, taken as it is."""
    stamp = stamp or file_stamp(file)
    with _lock:
        digest = _memo.get(stamp)
    if digest is None:
        if known is None:
            with open(file, "rb") as f:
                known = hashlib.file_digest(f, "blake2b").hexdigest()
        digest = known
        with _lock:
            _memo[stamp] = digest
    return digest
