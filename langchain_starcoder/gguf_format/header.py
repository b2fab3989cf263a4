"""A GGUF file's header: metadata and tensor table, parsed and checked against the file's size, so a
bad file fails before anything is allocated."""

from __future__ import annotations

import math
import mmap
import os
import reprlib
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


#: ggml's limits: dimensions of a tensor (GGML_MAX_DIMS), bytes of its name (GGML_MAX_NAME, with its NUL).
MAX_DIMS, MAX_NAME_BYTES = 4, 63
#: How deep metadata arrays may nest (llama.cpp writes none nested; ggml reads none).
MAX_NESTING = 8

# Value types of GGUF metadata: id -> struct format; 8 is a string, 9 an array.
_STRING, _ARRAY = 8, 9
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8"}
_NUMPY[12] = "<f8"
# The fewest bytes an entry takes in the file: what a declared count is checked against.
_LEAST_BYTES = {_STRING: 8, _ARRAY: 4 + 8}
_LEAST_KV_BYTES = 8 + 4 + 1  # key length, value type, the smallest value
_LEAST_TENSOR_BYTES = 8 + 4 + 4 + 8  # name length, dimension count, type, offset


class _Malformed(Exception):
    """The header runs past the end of the file, or declares more than the file can hold."""


class _Reader:
    """Little-endian reads from a memory map. Every length and count is checked against the bytes
    left before anything is allocated from it: a hostile header fails fast, in bounded memory."""

    def __init__(self, data: Any, size: int):
        self.data, self.size, self.pos = data, size, 0

    def take(self, n: int, what: str) -> int:
        """Claim the next ``n`` bytes; where they start."""
        if n > self.size - self.pos:
            raise _Malformed(f"{what} runs past the end of the file")
        start, self.pos = self.pos, self.pos + n
        return start

    def unpack(self, fmt: str, what: str) -> Any:
        fmt = "<" + fmt
        return struct.unpack_from(fmt, self.data, self.take(struct.calcsize(fmt), what))[0]

    def count(self, what: str, least_bytes: int) -> int:
        """A declared number of entries of at least ``least_bytes`` each, if the file can hold them."""
        n = self.unpack("Q", f"the number of {what}")
        left = self.size - self.pos
        if n * least_bytes > left:
            raise _Malformed(f"it declares {n} {what}, more than its remaining {left} bytes can hold")
        return n

    def string(self, what: str, max_bytes: int | None = None) -> str:
        n = self.unpack("Q", f"the length of {what}")
        if max_bytes is not None and n > max_bytes:
            raise _Malformed(f"{what} is {n} bytes long, more than ggml's {max_bytes}")
        start = self.take(n, what)
        return bytes(self.data[start : start + n]).decode("utf-8", errors="replace")

    def value(self, kind: int, what: str, depth: int = 0) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind], what)
        if kind == _STRING:
            return self.string(what)
        if kind != _ARRAY:
            raise _Malformed(f"{what} has an unknown value type {kind}")
        if depth == MAX_NESTING:
            raise _Malformed(f"{what} nests arrays more than {MAX_NESTING} deep")
        item = self.unpack("I", what)
        if item in _NUMPY:  # numbers in bulk (token types, scores)
            dtype = np.dtype(_NUMPY[item])
            n = self.count(f"items in {what}", dtype.itemsize)
            return np.frombuffer(self.data, dtype, n, self.take(n * dtype.itemsize, what)).tolist()
        if item not in _LEAST_BYTES:
            raise _Malformed(f"{what} has items of an unknown value type {item}")
        n = self.count(f"items in {what}", _LEAST_BYTES[item])
        return [self.value(item, what, depth + 1) for _ in range(n)]


def read_header(path: Path) -> GGUFHeader:
    """Metadata and tensor table of a GGUF file, every count and extent checked against the file's size."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 24:
                raise _Malformed("shorter than a GGUF header")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _parse(path, data, size)
    except OSError as e:
        msg = f"{path} cannot be read ({e.strerror or e})."
        raise CheckpointError(msg) from e
    except _Malformed as e:
        msg = f"{path} is truncated or not a valid GGUF file ({e}); download it again."
        raise CheckpointError(msg) from e


def _parse(path: Path, data: Any, size: int) -> GGUFHeader:
    if bytes(data[:4]) != b"GGUF":
        msg = f"{path} is not a GGUF file (it does not start with 'GGUF')."
        raise CheckpointError(msg)
    r = _Reader(data, size)
    r.pos = 4
    version = r.unpack("I", "the version")
    if version not in (2, 3):
        msg = f"{path} is GGUF version {version}; versions 2 and 3 are supported. Re-convert it."
        raise CheckpointError(msg)
    n_tensors = r.count("tensors", _LEAST_TENSOR_BYTES)
    n_kv = r.count("metadata entries", _LEAST_KV_BYTES)
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string("a metadata key")
        what = f"metadata {reprlib.repr(key)}"
        if key in metadata:
            raise _Malformed(f"{what} appears twice")
        metadata[key] = r.value(r.unpack("I", what), what)
    infos: dict[str, tuple[list[int], int, int]] = {}
    for _ in range(n_tensors):
        name = r.string("a tensor name", MAX_NAME_BYTES)
        what = f"tensor {name!r}"
        n_dims = r.unpack("I", what)
        if n_dims > MAX_DIMS:
            raise _Malformed(f"{what} has {n_dims} dimensions; ggml tensors have at most {MAX_DIMS}")
        dims = [r.unpack("Q", what) for _ in range(n_dims)]
        if name in infos:
            raise _Malformed(f"{what} appears twice")
        infos[name] = (dims, r.unpack("I", what), r.unpack("Q", what))
    alignment = metadata.get("general.alignment", 32)
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or alignment < 1
        or alignment & (alignment - 1)
    ):
        raise _Malformed(f"general.alignment is {reprlib.repr(alignment)}, not a power of two")
    start = -(-r.pos // alignment) * alignment
    tensors = {}
    for name, (dims, kind, offset) in infos.items():
        if kind not in GGML_TYPES:
            msg = (
                f"{path}: tensor {name} has ggml type {kind}, which langchain-starcoder does not know "
                f"(a newer llama.cpp type?). Supported: {supported_types_text()}. Re-quantize the file "
                "with llama.cpp (e.g. to Q4_0 or Q8_0), or use its F16 version."
            )
            raise UnsupportedModelError(msg)
        type_name, block, block_bytes = GGML_TYPES[kind]
        if dims and dims[0] % block:
            raise _Malformed(f"tensor {name!r} has rows of {dims[0]} values, not whole {type_name} blocks")
        if offset % alignment:
            raise _Malformed(f"tensor {name!r} starts at {offset}, not a multiple of {alignment}")
        nbytes = math.prod(dims) // block * block_bytes  # Python integers: no overflow
        tensors[name] = TensorInfo(tuple(reversed(dims)), type_name, start + offset, nbytes)
    end = max((t.offset + t.nbytes for t in tensors.values()), default=start)
    if end > size:
        msg = (
            f"{path} is truncated: its tensors need {end} bytes, the file has {size}. "
            "Download it again (a partial download, or a split file missing its other parts)."
        )
        raise CheckpointError(msg)
    return GGUFHeader(path, metadata, tensors)
