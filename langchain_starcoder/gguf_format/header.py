"""A GGUF file's header: metadata and tensor table, parsed and checked against the file's size, so a
bad file fails before anything is allocated."""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError, UnsupportedModelError
from .ggml_types import GGML_TYPES, supported_types_text


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]  # numpy order (GGUF stores the innermost dimension first)
    type_name: str
    offset: int  # from the start of the file
    nbytes: int


@dataclass
class GGUFHeader:
    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]

    @property
    def arch(self) -> Any:
        return self.metadata.get("general.architecture")


# Value types of GGUF metadata: id -> struct format (8 is a string, 9 an array).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8"}
_NUMPY[12] = "<f8"


class _Reader:
    """Little-endian reads from a memory map; running off its end raises struct.error (truncation)."""

    def __init__(self, data: Any):
        self.data, self.pos = data, 0

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("Q")
        if self.pos + n > len(self.data):
            raise struct.error("string past the end of the file")
        text = bytes(self.data[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == 8:
            return self.string()
        if kind == 9:
            item, count = self.unpack("I"), self.unpack("Q")
            if item in _NUMPY:  # numbers in bulk (token types, scores)
                dtype = np.dtype(_NUMPY[item])
                end = self.pos + count * dtype.itemsize
                if end > len(self.data):
                    raise struct.error("array past the end of the file")
                values = np.frombuffer(self.data, dtype, count, self.pos).tolist()
                self.pos = end
                return values
            return [self.value(item) for _ in range(count)]
        raise ValueError(f"unknown metadata value type {kind}")


def read_header(path: Path) -> GGUFHeader:
    """Metadata and tensor table of a GGUF file, checked against the file's size."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 24:
                raise struct.error("shorter than a GGUF header")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _parse(path, data, size)
    except OSError as e:
        msg = f"{path} cannot be read ({e.strerror or e})."
        raise CheckpointError(msg) from e
    except (struct.error, ValueError, OverflowError, MemoryError) as e:
        msg = f"{path} is truncated or not a valid GGUF file ({e}); download it again."
        raise CheckpointError(msg) from e


def _parse(path: Path, data: Any, size: int) -> GGUFHeader:
    r = _Reader(data)
    if bytes(data[:4]) != b"GGUF":
        msg = f"{path} is not a GGUF file (it does not start with 'GGUF')."
        raise CheckpointError(msg)
    r.pos = 4
    version = r.unpack("I")
    if version not in (2, 3):
        msg = f"{path} is GGUF version {version}; versions 2 and 3 are supported. Re-convert it."
        raise CheckpointError(msg)
    n_tensors, n_kv = r.unpack("Q"), r.unpack("Q")
    metadata = {}
    for _ in range(n_kv):
        key = r.string()
        metadata[key] = r.value(r.unpack("I"))
    infos = []
    for _ in range(n_tensors):
        name, n_dims = r.string(), r.unpack("I")
        dims = [r.unpack("Q") for _ in range(n_dims)]
        infos.append((name, dims, r.unpack("I"), r.unpack("Q")))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 1:
        raise ValueError(f"general.alignment is {alignment!r}")
    start = -(-r.pos // alignment) * alignment
    tensors = {}
    for name, dims, kind, offset in infos:
        if kind not in GGML_TYPES:
            msg = (
                f"{path}: tensor {name} has an unknown ggml type {kind}; supported: {supported_types_text()}."
            )
            raise UnsupportedModelError(msg)
        type_name, block, block_bytes = GGML_TYPES[kind]
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        nbytes = count // block * block_bytes
        tensors[name] = TensorInfo(tuple(reversed(dims)), type_name, start + offset, nbytes)
    end = max((t.offset + t.nbytes for t in tensors.values()), default=start)
    if end > size:
        msg = (
            f"{path} is truncated: its tensors need {end} bytes, the file has {size}. "
            "Download it again (a partial download, or a split file missing its other parts)."
        )
        raise CheckpointError(msg)
    return GGUFHeader(path, metadata, tensors)
