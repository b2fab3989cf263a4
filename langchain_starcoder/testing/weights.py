"""Random weights written one layer at a time, so that a checkpoint of any depth needs one layer's memory.

A builder lists its weights as groups (the embedding, each layer, the head) drawn in order from one seed.
Every shape is known before anything is drawn (a dry run with :meth:`Draw.shapes`), so each safetensors
header is written first, then each group is drawn, converted tensor by tensor (dtype, or mlx-lm's 4/8-bit
layout) and appended to the file before the next is drawn. The same plan gives the disk and memory a build
needs, refused up front when the machine has less.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._progress import progress_bar
from ..errors import StarCoderError

#: The groups of a checkpoint's weights, in file order, drawn by ``draw`` (one dict per layer or so).
Groups = Callable[["Draw"], Iterator[dict[str, np.ndarray]]]

_SAFETENSORS_DTYPE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4}
#: The interpreter, MLX and the tokenizer trainer, on top of the weights in flight (measured ~0.4 GB).
_BASE_MEMORY = 512 * 2**20
#: Tokenizer and config files, on top of the weights (a 49k-token tokenizer.json is ~3 MB).
_OTHER_FILES = 32 * 2**20
#: mlx-lm's shard size (``save_model``): a quantized checkpoint is split like mlx-community's.
_MLX_LM_SHARD_BYTES = 5 << 30


class ResourceError(StarCoderError):
    """A checkpoint was refused before it was built: it needs more memory or disk than the machine has."""


class Draw:
    """Makes a group's arrays: random ones from a seed, or (``Draw.shapes()``) views that hold no memory,
    for planning. Matrices are scaled by 1/sqrt(fan-in) and vectors sit around ``mean``: activations O(1)."""

    def __init__(self, seed: int | None):
        self._rng = None if seed is None else np.random.default_rng(seed)

    @classmethod
    def shapes(cls) -> Draw:
        return cls(None)

    def normal(self, shape: tuple[int, ...], scale: float, mean: float = 0.0) -> np.ndarray:
        if self._rng is None:
            return np.broadcast_to(np.float32(0), shape)
        out = self._rng.standard_normal(shape, dtype=np.float32)
        out *= np.float32(scale)  # in place: a float32 copy of the biggest matrix is the peak to keep down
        if mean:
            out += np.float32(mean)
        return out

    def dense(self, rows: int, cols: int) -> np.ndarray:
        return self.normal((rows, cols), cols**-0.5)

    def vector(self, n: int, scale: float = 0.02, mean: float = 0.0) -> np.ndarray:
        return self.normal((n,), scale, mean)

    def embedding(self, vocab: int, hidden: int, special_tokens: int) -> np.ndarray:
        out = self.normal((vocab, hidden), 0.3)
        if self._rng is not None:
            out[:special_tokens] *= np.float32(0.05)  # keep control tokens rare in random-weight output
        return out


def dense_and_norms(
    prefix: str,
    linears: tuple[tuple[str, int, int], ...],
    norms: tuple[str, ...],
    draw: Draw,
    width: int | None = None,
) -> dict[str, np.ndarray]:
    """Weights and biases of ``linears`` (name, rows, cols) and LayerNorms of ``width`` (the first
    linear's columns when not given) under ``prefix``."""
    width = width or linears[0][2]
    out = {}
    for name, rows, cols in linears:
        out[f"{prefix}{name}.weight"] = draw.dense(rows, cols)
        out[f"{prefix}{name}.bias"] = draw.vector(rows)
    for norm in norms:
        out[f"{prefix}{norm}.weight"] = draw.vector(width, 0.1, 1.0)
        out[f"{prefix}{norm}.bias"] = draw.vector(width)
    return out


# --- the plan --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quantization:
    bits: int
    group_size: int

    def applies(self, name: str, shape: tuple[int, ...]) -> bool:
        """mlx-lm quantizes every Linear and Embedding whose rows split into whole groups."""
        return name.endswith(".weight") and len(shape) == 2 and shape[-1] % self.group_size == 0


@dataclass
class Plan:
    """Each file's tensors (name -> safetensors dtype and shape), in the order they are written."""

    files: dict[str, dict[str, tuple[str, tuple[int, ...]]]]
    parameters: int
    largest_group: int  # float32 bytes of the biggest group, drawn at once
    largest_tensor: int  # float32 bytes of the biggest tensor, converted at once
    tensors: dict[str, str] = field(default_factory=dict)  # tensor -> its file

    @property
    def disk_bytes(self) -> int:
        return sum(_nbytes(*entry) for file in self.files.values() for entry in file.values())

    @property
    def memory_bytes(self) -> int:
        """What a build holds at its peak: one group, one tensor's conversion, and the process itself."""
        return self.largest_group + 2 * self.largest_tensor + _BASE_MEMORY


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * _ITEMSIZE[dtype]


def _stored(
    name: str, shape: tuple[int, ...], dtype: str, quantization: Quantization | None
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """What one drawn tensor becomes on disk: itself in ``dtype``, or mlx-lm's packed weight with float16
    scales and biases (every other tensor float16 too, as ``model.set_dtype(float16)`` leaves it)."""
    if quantization is None:
        return {name: (_SAFETENSORS_DTYPE[dtype], shape)}
    if not quantization.applies(name, shape):
        return {name: ("F16", shape)}
    rows, cols = shape
    stem, groups = name.removesuffix(".weight"), (rows, cols // quantization.group_size)
    return {
        name: ("U32", (rows, cols * quantization.bits // 32)),
        f"{stem}.scales": ("F16", groups),
        f"{stem}.biases": ("F16", groups),
    }


def plan_weights(
    groups: Groups, dtype: str, quantization: Quantization | None, max_shard_bytes: int | None
) -> Plan:
    """The files and sizes of ``groups`` written in ``dtype`` (or quantized), from their shapes alone."""
    if quantization is not None:
        max_shard_bytes = _MLX_LM_SHARD_BYTES
    shards: list[dict[str, tuple[str, tuple[int, ...]]]] = [{}]
    size = parameters = largest_group = largest_tensor = 0
    for group in groups(Draw.shapes()):
        largest_group = max(largest_group, sum(4 * a.size for a in group.values()))
        for name, array in group.items():
            parameters += array.size
            largest_tensor = max(largest_tensor, 4 * array.size)
            for stored, entry in _stored(name, array.shape, dtype, quantization).items():
                nbytes = _nbytes(*entry)
                if max_shard_bytes and shards[-1] and size + nbytes > max_shard_bytes:
                    shards.append({})
                    size = 0
                shards[-1][stored] = entry
                size += nbytes
    if len(shards) == 1:
        files = {"model.safetensors": shards[0]}
    else:
        files = {f"model-{i:05d}-of-{len(shards):05d}.safetensors": s for i, s in enumerate(shards, 1)}
    plan = Plan(files, parameters, largest_group, largest_tensor)
    plan.tensors = {tensor: file for file, entries in files.items() for tensor in entries}
    return plan


# --- room on this machine --------------------------------------------------------------------------------


def available_memory() -> int | None:
    """Bytes of memory this process can still take: Linux's MemAvailable, capped by a cgroup limit (a
    container); the physical memory elsewhere; None if unknown."""
    available = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    with contextlib.suppress(OSError, StopIteration, ValueError):
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        available = int(next(line for line in meminfo if line.startswith("MemAvailable:")).split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            room = int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text())
            available = room if available is None else min(available, room)
    return available


def free_disk(path: Path) -> int:
    return shutil.disk_usage(path).free


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def check_room(path: Path, plan: Plan, what: str) -> None:
    """Refuse, before anything is written, a build of ``what`` that cannot fit in memory or on disk at
    ``path`` (weights already there that the build replaces count as free)."""
    memory = available_memory()
    if memory is not None and plan.memory_bytes > memory:
        msg = (
            f"Building {what} needs about {_gb(plan.memory_bytes)} of memory (one layer at a time) but "
            f"{_gb(memory)} is available; free some memory or choose a smaller preset."
        )
        raise ResourceError(msg)
    replaced = sum(f.stat().st_size for f in path.glob("model*.safetensors*") if f.is_file())
    disk, free = plan.disk_bytes + _OTHER_FILES, free_disk(path) + replaced
    if disk > free:
        msg = (
            f"Building {what} writes {_gb(disk)} but {path} has {_gb(free)} free; make room, or build it "
            "quantized (--quantize 4) or with fewer layers (--layers)."
        )
        raise ResourceError(msg)


# --- writing ---------------------------------------------------------------------------------------------


def _converted(name: str, array: np.ndarray, dtype: str, quantization: Quantization | None) -> dict[str, Any]:
    """One drawn tensor as it is stored (see :func:`_stored`), as arrays that expose their bytes."""
    import mlx.core as mx

    if quantization is None and dtype == "float32":
        return {name: array}
    value = mx.array(array).astype(mx.float16 if quantization else getattr(mx, dtype))
    if quantization is None or not quantization.applies(name, array.shape):
        return {name: value}
    weight, scales, biases = mx.quantize(value, group_size=quantization.group_size, bits=quantization.bits)
    stem = name.removesuffix(".weight")
    return {name: weight, f"{stem}.scales": scales, f"{stem}.biases": biases}


def _raw(array: Any) -> memoryview:
    """The bytes of a numpy or MLX array (MLX's 16-bit floats go through a uint16 view: numpy has no
    bfloat16)."""
    import mlx.core as mx

    if isinstance(array, mx.array):
        if array.dtype in (mx.float16, mx.bfloat16):
            array = array.view(mx.uint16)
        array = np.asarray(array)
    return memoryview(np.ascontiguousarray(array)).cast("B")


def _header(entries: dict[str, tuple[str, tuple[int, ...]]], metadata: dict[str, str]) -> bytes:
    """A safetensors header for ``entries`` stored back to back in their order."""
    header: dict[str, Any] = {}
    offset = 0
    for tensor, (kind, shape) in entries.items():
        end = offset + _nbytes(kind, shape)
        header[tensor] = {"dtype": kind, "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    blob = json.dumps({**header, "__metadata__": metadata}, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(blob)) + blob


def write_weights(
    path: Path, groups: Groups, seed: int, plan: Plan, dtype: str, quantization: Quantization | None
) -> None:
    """Write each file's header from ``plan``, then draw ``groups`` one at a time and append each tensor
    to its file. A quantized checkpoint gets mlx-lm's index (it always writes one), a sharded one ours.
    The bytes written are counted on a progress bar, when progress is shown."""
    metadata = {"format": "mlx" if quantization else "pt"}
    with contextlib.ExitStack() as stack:
        files = {name: stack.enter_context(open(path / name, "wb")) for name in plan.files}
        written = stack.enter_context(progress_bar(plan.disk_bytes, "Writing random weights", "B"))
        for name, entries in plan.files.items():
            files[name].write(_header(entries, metadata))
        for group in groups(Draw(seed)):
            for name in list(group):  # popped: each float32 tensor is freed once it is written
                for tensor, value in _converted(name, group.pop(name), dtype, quantization).items():
                    data, file = _raw(value), plan.tensors[tensor]
                    planned = plan.files[file][tensor]
                    if data.nbytes != _nbytes(*planned):  # the plan and the drawing disagree: a bug here
                        msg = f"{tensor}: {data.nbytes} bytes drawn, not the {planned} planned."
                        raise AssertionError(msg)
                    files[file].write(data)
                    written.update(data.nbytes)
    if len(plan.files) > 1 or quantization is not None:
        index: dict[str, Any] = {"metadata": {"total_size": plan.disk_bytes}}
        if quantization is not None:
            index["metadata"]["total_parameters"] = plan.parameters
        index["weight_map"] = dict(sorted(plan.tensors.items()))
        indent = 4 if quantization is not None else 2  # mlx-lm's, and ours before
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=indent))
