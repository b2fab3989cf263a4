"""A GGUF file's tensors as MLX arrays under our names: read by ``mx.load`` (Q4_0, Q4_1 and Q8_0 as
MLX affine group-32 quantized triples, exactly), BF16 and Q4_K read here."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CheckpointError
from .checkpoint import GGUFCheckpoint
from .ggml_types import DEQUANTIZED_TYPES, GROUP_SIZE, QUANTIZED_TYPES
from .header import GGUFHeader
from .layout import our_name


def quantized_layers(header: GGUFHeader) -> dict[str, dict[str, int]]:
    """Our module path -> MLX quantization of each tensor kept quantized (its own type's bits)."""
    layers = {}
    for name, info in header.tensors.items():
        if info.type_name in QUANTIZED_TYPES:
            path = our_name(name, header.arch).removesuffix(".weight")
            layers[path] = {"group_size": GROUP_SIZE, "bits": QUANTIZED_TYPES[info.type_name]}
    return layers


def read_weights(checkpoint: GGUFCheckpoint) -> dict[str, Any]:
    """The file's tensors under our names, through ``mx.load`` (BF16 and Q4_K read here, see below)."""
    import mlx.core as mx

    header = checkpoint.header
    try:
        arrays = mx.load(str(header.path))
    except (RuntimeError, ValueError) as e:
        msg = f"MLX could not read the weights of {header.path}: {e}"
        raise CheckpointError(msg) from e
    weights = {our_name(k, header.arch): v for k, v in arrays.items()}
    # mx.load turns BF16 into float16, which rounds small values and overflows large ones: read it
    # ourselves (a bfloat16 is the top half of a float32).
    # mx.load's Q4_K is wrong for half of each block's values (it disagrees with ggml and the gguf
    # package): dequantize Q4_K here, like ggml's dequantize_row_q4_K.
    raw = np.memmap(header.path, dtype=np.uint8, mode="r")
    for name, info in header.tensors.items():
        data = raw[info.offset : info.offset + info.nbytes]
        if info.type_name == "BF16":
            bits = data.view("<u2").astype(np.uint32) << 16
            weights[our_name(name, header.arch)] = mx.array(bits.view(np.float32).reshape(info.shape)).astype(
                mx.bfloat16
            )
        elif info.type_name == "Q4_K":
            weights[our_name(name, header.arch)] = mx.array(dequantize_q4_k(data).reshape(info.shape))
    return weights


def dequantize_q4_k(data: np.ndarray) -> np.ndarray:
    """ggml's Q4_K blocks (256 weights: float16 d and dmin, 12 bytes of 6-bit scales and mins,
    128 bytes of 4-bit values) as float16."""
    blocks = data.reshape(-1, 144)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    s = blocks[:, 4:16].astype(np.int32)
    # 8 sub-blocks of 32: the first four's scale/min in 6 bits, the last four's split across bytes
    scales = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mins = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    qs = blocks[:, 16:144].reshape(-1, 4, 1, 32)
    q = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float32)
    values = d[:, :, None] * scales[:, :, None] * q - dmin[:, :, None] * mins[:, :, None]
    return values.reshape(-1).astype(np.float16)


def dequantized_notice(checkpoint: GGUFCheckpoint, itemsize: int) -> str | None:
    """One line on what the K-quant tensors cost once dequantized (``itemsize`` bytes a weight)."""
    tensors = [t for t in checkpoint.header.tensors.values() if t.type_name in DEQUANTIZED_TYPES]
    if not tensors:
        return None
    types = sorted({t.type_name for t in tensors})
    size = sum(int(np.prod(t.shape)) * itemsize for t in tensors)
    on_disk = sum(t.nbytes for t in tensors)
    return (
        f"{checkpoint.path.name}: {len(tensors)} tensors of type {'/'.join(types)} are dequantized "
        f"(MLX has no kernels for them): {size / 1e9:.2f} GB in memory instead of {on_disk / 1e9:.2f} GB. "
        "A Q4_0, Q4_1 or Q8_0 file stays quantized."
    )


def quantization_entries(layers: dict[str, dict[str, int]]) -> dict[str, Any]:
    """mlx-lm's ``quantization`` config: the commonest bits, and each layer that differs (mixed files)."""
    bits = [q["bits"] for q in layers.values()]
    common = max(set(bits), key=bits.count)
    return {"bits": common, **{path: q for path, q in sorted(layers.items()) if q["bits"] != common}}
