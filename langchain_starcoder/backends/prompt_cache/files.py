"""Prompt-cache files: mlx-lm's ``save_prompt_cache`` layout (safetensors), written and read without MLX.

mlx-lm's own ``save_prompt_cache`` must run on the thread that owns the arrays and writes the whole
256-token step buffer; here the worker hands over numpy copies of exactly the cached positions and a
plain thread writes them, in the same layout, so ``mlx_lm.models.cache.load_prompt_cache`` reads our
files too. Reading checks the header against the file's size and a CRC-32 of the data before any
byte becomes an array, so a truncated or damaged file is refused instead of giving another answer.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: The safetensors dtype names of the arrays a KV cache holds (bfloat16 travels as its bits).
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U32": np.uint32, "I32": np.int32}
_MAX_HEADER = 64 << 20  # a header past this is not one we wrote
#: mlx-lm reads metadata entry 0 as the caller's own dict: the checksum goes there.
_CRC_KEY = "0.crc32"


class CacheFileError(Exception):
    """The file is not a whole, undamaged prompt-cache file."""


@dataclass
class Tensor:
    """One array of a cache's state: its bytes (C order) and safetensors dtype name."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray


def write_cache_file(path: Path, tensors: Sequence[Tensor], metadata: dict[str, str]) -> None:
    """Write ``tensors`` and ``metadata`` (plus a CRC-32 of the data) to ``path``, flushed to disk."""
    crc, offset, entries = 0, 0, {}
    for t in tensors:
        crc = zlib.crc32(memoryview(t.data).cast("B"), crc)
        span = [offset, offset + t.data.nbytes]
        entries[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": span}
        offset += t.data.nbytes
    entries["__metadata__"] = {**metadata, _CRC_KEY: str(crc)}
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # safetensors pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        for t in tensors:
            f.write(memoryview(t.data).cast("B"))
        f.flush()
        os.fsync(f.fileno())


def read_header(path: Path) -> tuple[dict[str, Any], dict[str, str], int]:
    """The tensor entries, the metadata and the header's end offset; raises CacheFileError for a
    header that is not whole or does not fit the file's size."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            msg = "shorter than a header"
            raise CacheFileError(msg)
        (n,) = struct.unpack("<Q", head)
        if n > min(_MAX_HEADER, size - 8):
            msg = f"header of {n} bytes in a file of {size}"
            raise CacheFileError(msg)
        try:
            entries = json.loads(f.read(n))
        except (UnicodeDecodeError, ValueError) as e:
            msg = f"unreadable header ({e})"
            raise CacheFileError(msg) from None
    if not isinstance(entries, dict) or not isinstance(entries.get("__metadata__"), dict):
        msg = "no metadata in the header"
        raise CacheFileError(msg)
    metadata = entries.pop("__metadata__")
    end = 0
    for name, entry in entries.items():
        try:
            start, stop = entry["data_offsets"]
            count = int(np.prod(entry["shape"], dtype=np.int64))
            width = np.dtype(_DTYPES[entry["dtype"]]).itemsize
        except (KeyError, TypeError, ValueError):
            msg = f"tensor {name!r} has a malformed entry"
            raise CacheFileError(msg) from None
        if not 0 <= start <= stop or stop - start != count * width:
            msg = f"tensor {name!r} has inconsistent offsets"
            raise CacheFileError(msg)
        end = max(end, stop)
    if 8 + n + end != size:
        msg = f"{size} bytes where the header describes {8 + n + end} (truncated or appended to)"
        raise CacheFileError(msg)
    return entries, metadata, 8 + n


def read_cache_file(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors (bfloat16 as its uint16 bits) and metadata of a whole file whose data matches
    its CRC-32."""
    entries, metadata, start = read_header(path)
    data = memoryview(path.read_bytes())[start:]
    if str(zlib.crc32(data)) != metadata.get(_CRC_KEY):  # the tensors are written in header order
        msg = "its data does not match its checksum (damaged)"
        raise CacheFileError(msg)
    tensors = {}
    for name, entry in entries.items():
        lo, hi = entry["data_offsets"]
        array = np.frombuffer(data[lo:hi], dtype=_DTYPES[entry["dtype"]]).reshape(entry["shape"])
        tensors[name] = Tensor(name, entry["dtype"], tuple(entry["shape"]), array)
    return tensors, metadata


def dtype_name(dtype: str) -> str:
    """The safetensors name of an MLX dtype name (``float32`` -> ``F32``)."""
    return {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "uint32": "U32", "int32": "I32"}[dtype]
