"""Prompt-cache files: mlx-lm's ``save_prompt_cache`` layout (safetensors), written and read without MLX.

mlx-lm's own ``save_prompt_cache`` must run on the thread that owns the arrays and writes the whole
256-token step buffer; here the worker hands over numpy copies of exactly the cached positions and a
plain thread writes them, in the same layout, so ``mlx_lm.models.cache.load_prompt_cache`` reads our
files too. Reading is two steps: the header (checked against the file's size, its tensors laid end to
end) and then the data (checked against a CRC-32), so a caller checks the header against what it
expects before a byte of data is read, and a truncated or damaged file is refused instead of giving
another answer.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

#: The safetensors dtype names of the arrays a KV cache holds (bfloat16 travels as its bits).
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U32": np.uint32, "I32": np.int32}
MAX_HEADER = 64 << 20  # a header past this is not one we wrote
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


@dataclass
class Header:
    """A file's header: its tensors' entries (dtype, shape, data_offsets), its metadata, and where
    the data starts."""

    entries: dict[str, dict[str, Any]]
    metadata: dict[str, str]
    data_start: int

    @property
    def data_bytes(self) -> int:
        return sum(stop - start for start, stop in (e["data_offsets"] for e in self.entries.values()))


def write_cache_file(f: BinaryIO, tensors: Sequence[Tensor], metadata: dict[str, str]) -> None:
    """Write ``tensors`` and ``metadata`` (plus a CRC-32 of the data) to the open file ``f``."""
    crc, offset, entries = 0, 0, {}
    for t in tensors:
        crc = zlib.crc32(memoryview(t.data).cast("B"), crc)
        span = [offset, offset + t.data.nbytes]
        entries[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": span}
        offset += t.data.nbytes
    entries["__metadata__"] = {**metadata, _CRC_KEY: str(crc)}
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # safetensors pads the header to 8 bytes
    f.write(struct.pack("<Q", len(header)) + header)
    for t in tensors:
        f.write(memoryview(t.data).cast("B"))


def read_header(f: BinaryIO, max_header: int = MAX_HEADER) -> Header:
    """The header of the open file ``f`` (read from its start, at most ``max_header`` bytes of it),
    nothing of its data; raises CacheFileError for a header that is not whole, or whose tensors do
    not lie end to end and fill the rest of the file exactly."""
    size = os.fstat(f.fileno()).st_size
    f.seek(0)
    head = f.read(8)
    if len(head) < 8:
        msg = "shorter than a header"
        raise CacheFileError(msg)
    (n,) = struct.unpack("<Q", head)
    if n > min(max_header, size - 8):
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
    for name, entry in sorted(entries.items(), key=lambda item: _start(item[1])):
        try:
            start, stop = entry["data_offsets"]
            shape, width = entry["shape"], np.dtype(_DTYPES[entry["dtype"]]).itemsize
            if not all(type(v) is int and v >= 0 for v in (start, stop, *shape)):
                raise ValueError
            count = math.prod(shape)  # Python ints: a crafted shape cannot wrap around
        except (KeyError, TypeError, ValueError):
            msg = f"tensor {name!r} has a malformed entry"
            raise CacheFileError(msg) from None
        if start != end or stop - start != count * width:  # end to end: no gap, no overlap
            msg = f"tensor {name!r} has inconsistent offsets"
            raise CacheFileError(msg)
        end = stop
    if 8 + n + end != size:
        msg = f"{size} bytes where the header describes {8 + n + end} (truncated or appended to)"
        raise CacheFileError(msg)
    return Header(entries, metadata, 8 + n)


def read_tensors(f: BinaryIO, header: Header) -> dict[str, Tensor]:
    """The tensors (bfloat16 as its uint16 bits) of the open file ``f`` whose ``header`` was read
    (and checked) first; raises CacheFileError if the data does not match its CRC-32."""
    f.seek(header.data_start)
    data = memoryview(f.read(header.data_bytes))
    if len(data) != header.data_bytes or str(zlib.crc32(data)) != header.metadata.get(_CRC_KEY):
        msg = "its data does not match its checksum (damaged)"  # the tensors are written in header order
        raise CacheFileError(msg)
    tensors = {}
    for name, entry in header.entries.items():
        lo, hi = entry["data_offsets"]
        array = np.frombuffer(data[lo:hi], dtype=_DTYPES[entry["dtype"]]).reshape(entry["shape"])
        tensors[name] = Tensor(name, entry["dtype"], tuple(entry["shape"]), array)
    return tensors


def read_cache_file(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors and metadata of the whole, undamaged file at ``path`` (for tools and tests; the
    disk cache opens its files itself, checked, and reads a header it accepts)."""
    with open(path, "rb") as f:
        header = read_header(f)
        return read_tensors(f, header), header.metadata


def dtype_name(dtype: str) -> str:
    """The safetensors name of an MLX dtype name (``float32`` -> ``F32``)."""
    return {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "uint32": "U32", "int32": "I32"}[dtype]


def _start(entry: Any) -> int:
    """Where an entry says its data starts (0 for a malformed one, refused when it is checked)."""
    try:
        return int(entry["data_offsets"][0])
    except (KeyError, TypeError, ValueError, IndexError):
        return 0
