"""GGUF files (llama.cpp, Ollama) of StarCoder2 and StarCoder (v1): metadata -> config, tensors ->
our modules' weights, tokenizer.

Kept as one file for the one format: header, config, weights, tokenizer, hub download and convert
share the header's checked view of the file.

The header is parsed here (each tensor's own type, shape and extent, so a bad file fails before
anything is allocated); the weights are read by MLX's own GGUF reader (``mx.load``), which returns
Q4_0, Q4_1 and Q8_0 as MLX affine group-32 quantized triples (exactly: no dequantize-requantize
round trip) and the K-quants Q2_K and Q6_K as float16 (Q4_K, which it gets wrong, is dequantized
here). K-quants stay dequantized (one notice says what it costs); every other quantized type is
refused with the list of supported ones.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import (
    CheckpointError,
    InvalidParameterError,
    ModelNotFoundError,
    UnsupportedModelError,
)
from .loading import LoadedModel, _is_positive, _is_size, default_compute_dtype, is_hub_id, model_args

#: StarCoder2's published attention window; llama.cpp's converter does not write it into GGUF files.
STARCODER2_SLIDING_WINDOW = 4096

#: ggml type id -> (name, elements per block, bytes per block), for every type a file may hold.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}  # fmt: skip

FLOAT_TYPES = ("F32", "F16", "BF16")
#: Kept quantized, as MLX affine quantization with groups of 32: type -> bits.
QUANTIZED_TYPES = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}
#: Read by MLX as float16 and kept so (MLX has no K-quant kernels): they cost memory, see the notice.
DEQUANTIZED_TYPES = ("Q2_K", "Q4_K", "Q6_K")
SUPPORTED_TYPES = (*FLOAT_TYPES, *QUANTIZED_TYPES, *DEQUANTIZED_TYPES)
GROUP_SIZE = 32


class GGUFNotice(UserWarning):
    """Something a GGUF file's user should know: a default filled in, memory a type costs."""


# --- the header ------------------------------------------------------------------------------------


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
            msg = f"{path}: tensor {name} has an unknown ggml type {kind}; supported: {_supported()}."
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


def _supported() -> str:
    return (
        f"{', '.join(FLOAT_TYPES)}, {', '.join(QUANTIZED_TYPES)} (kept quantized) and "
        f"{', '.join(DEQUANTIZED_TYPES)} (dequantized)"
    )


# --- names and config --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    """How llama.cpp names an architecture's tensors, and the names of our (Hugging Face's) module."""

    model_type: str
    top: dict[str, str]  # llama.cpp -> ours, outside the blocks
    blocks: str
    block: dict[str, str]


#: llama.cpp's architectures (``general.architecture``) this package runs: StarCoder2, and StarCoder
#: v1 (GPTBigCode) as llama.cpp's converter writes it (fused QKV, learned positions, one KV head).
LAYOUTS = {
    "starcoder2": _Layout(
        "starcoder2",
        {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"},
        "model.layers",
        {
            "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj", "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj",
            "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
        },
    ),
    "starcoder": _Layout(
        "gpt_bigcode",
        {
            "token_embd": "transformer.wte", "position_embd": "transformer.wpe",
            "output_norm": "transformer.ln_f", "output": "lm_head",
        },
        "transformer.h",
        {
            "attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj",
            "ffn_norm": "ln_2", "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj",
        },
    ),
}  # fmt: skip
_NAME = re.compile(r"(?:blk\.(\d+)\.)?(\w+)\.(weight|bias|scales|biases)")


def our_name(name: str, arch: str = "starcoder2") -> str | None:
    """llama.cpp's tensor name (``blk.3.ffn_up.weight``, or its ``.scales``/``.biases`` as MLX reads
    a quantized one) -> Hugging Face's (``model.layers.3.mlp.c_fc.weight``); None if unknown."""
    layout, m = LAYOUTS[arch], _NAME.fullmatch(name)
    if m is None:
        return None
    layer, module, part = m.groups()
    if layer is None:
        return f"{layout.top[module]}.{part}" if module in layout.top else None
    return f"{layout.blocks}.{layer}.{layout.block[module]}.{part}" if module in layout.block else None


@dataclass
class GGUFCheckpoint:
    """A checked GGUF file: its header, the config it implies, and the notices it earned."""

    header: GGUFHeader
    config: dict[str, Any]
    notices: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.header.path


def _meta_int(header: GGUFHeader, key: str, default: int | None = None) -> int:
    value = header.metadata.get(key, default)
    if value is None:
        msg = f"{header.path} has no {key!r} in its metadata; it is not a complete llama.cpp model file."
        raise CheckpointError(msg)
    if not _is_size(value):
        msg = f"{header.path}: {key} is {value!r}, but it must be a whole number >= 1. Re-convert the file."
        raise CheckpointError(msg)
    return value


def _meta_float(header: GGUFHeader, key: str, default: float) -> float:
    value = header.metadata.get(key, default)
    if not _is_positive(value):
        msg = f"{header.path}: {key} is {value!r}, but it must be a positive number. Re-convert the file."
        raise CheckpointError(msg)
    # GGUF stores float32: its shortest decimal gives back what the config said (1e-05, not 9.99e-06)
    return float(str(np.float32(value))) if isinstance(value, float) else float(value)


def read_gguf(path: str | os.PathLike[str], *, sliding_window: int | None = None) -> GGUFCheckpoint:
    """Parse and check a GGUF file: architecture, sizes, every tensor's name, type and shape.

    ``sliding_window`` (StarCoder2): the attention window (0 for full attention); by default the
    file's ``starcoder2.attention.sliding_window``, else StarCoder2's published 4096 (with a notice).
    """
    if sliding_window is not None and (
        not isinstance(sliding_window, int) or isinstance(sliding_window, bool) or sliding_window < 0
    ):
        msg = f"sliding_window must be a whole number >= 0 (0: full attention), not {sliding_window!r}."
        raise InvalidParameterError(msg)
    header = read_header(Path(path))
    if not header.tensors:
        msg = (
            f"{header.path} holds no weights (a vocab-only GGUF file, as llama.cpp ships for its "
            "tokenizer tests); use a model file."
        )
        raise CheckpointError(msg)
    arch = header.arch
    if arch not in LAYOUTS:
        msg = (
            f"{header.path} holds a {arch!r} model; langchain-starcoder runs GGUF files of the "
            f"architectures {list(LAYOUTS)} (StarCoder2, and StarCoder / GPTBigCode)."
        )
        raise UnsupportedModelError(msg)
    embed = header.tensors.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        msg = f"{header.path} has no 2-D tensor token_embd.weight; it is not a complete model file."
        raise CheckpointError(msg)
    notices: list[str] = []
    if arch == "starcoder":
        config = _starcoder_config(header, sliding_window)
    else:
        config = _starcoder2_config(header, sliding_window, notices)
    config |= {"vocab_size": embed.shape[0], "tie_word_embeddings": "output.weight" not in header.tensors}
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos")):
        token = header.metadata.get(f"tokenizer.ggml.{name}_token_id")
        if isinstance(token, int):
            config[key] = token
    _check_tensors(header, config)
    return GGUFCheckpoint(header, config, notices)


def _starcoder2_config(header: GGUFHeader, sliding_window: int | None, notices: list[str]) -> dict[str, Any]:
    """A Starcoder2 config.json's settings from llama.cpp's ``starcoder2.*`` metadata."""
    window = sliding_window
    if window is None:
        window = header.metadata.get("starcoder2.attention.sliding_window")
        if window is None:
            window = STARCODER2_SLIDING_WINDOW
            notices.append(
                f"{header.path.name} does not record StarCoder2's attention window (llama.cpp's converter "
                f"drops it); using the published {window}. Pass sliding_window= to override."
            )
    if "starcoder2.rope.freq_base" not in header.metadata:
        notices.append(
            f"{header.path.name} does not record rope.freq_base; using llama.cpp's default 10000 "
            "(StarCoder2 checkpoints use 100000 to 1000000: check where the file came from)."
        )
    heads = _meta_int(header, "starcoder2.attention.head_count")
    config = {
        "model_type": "starcoder2",
        "architectures": ["Starcoder2ForCausalLM"],
        "hidden_size": _meta_int(header, "starcoder2.embedding_length"),
        "num_hidden_layers": _meta_int(header, "starcoder2.block_count"),
        "num_attention_heads": heads,
        # llama.cpp's defaults when a key is absent: as many KV heads as heads, RoPE base 10000
        "num_key_value_heads": _meta_int(header, "starcoder2.attention.head_count_kv", heads),
        "intermediate_size": _meta_int(header, "starcoder2.feed_forward_length"),
        "max_position_embeddings": _meta_int(header, "starcoder2.context_length"),
        "rope_theta": _meta_float(header, "starcoder2.rope.freq_base", 10000.0),
        "norm_epsilon": _meta_float(header, "starcoder2.attention.layer_norm_epsilon", 1e-5),
        "sliding_window": window or None,
        "hidden_act": "gelu_pytorch_tanh",  # what llama.cpp's starcoder2 graph computes
        "use_bias": "blk.0.attn_q.bias" in header.tensors,
    }
    hidden, kv_heads = config["hidden_size"], config["num_key_value_heads"]
    if hidden % heads or heads % kv_heads:
        msg = (
            f"{header.path}: embedding_length {hidden}, head_count {heads} and head_count_kv {kv_heads} "
            "do not fit: the heads must divide the embedding and the KV heads the heads."
        )
        raise CheckpointError(msg)
    return config


def _starcoder_config(header: GGUFHeader, sliding_window: int | None) -> dict[str, Any]:
    """A GPTBigCode config.json's settings from llama.cpp's ``starcoder.*`` metadata."""
    if sliding_window:
        msg = f"sliding_window= applies to StarCoder2; {header.path.name} is a StarCoder (v1) model."
        raise InvalidParameterError(msg)
    hidden, heads = (
        _meta_int(header, "starcoder.embedding_length"),
        _meta_int(header, "starcoder.attention.head_count"),
    )
    kv_heads = _meta_int(header, "starcoder.attention.head_count_kv", 1)
    if kv_heads != 1 or hidden % heads:
        msg = (
            f"{header.path}: head_count_kv {kv_heads}, embedding_length {hidden}, head_count {heads}: "
            "StarCoder GGUF files have one key/value head (multi-query) and heads that divide the embedding."
        )
        raise UnsupportedModelError(msg)
    return {
        "model_type": "gpt_bigcode",
        "architectures": ["GPTBigCodeForCausalLM"],
        "n_embd": hidden,
        "n_layer": _meta_int(header, "starcoder.block_count"),
        "n_head": heads,
        "n_inner": _meta_int(header, "starcoder.feed_forward_length"),
        "n_positions": _meta_int(header, "starcoder.context_length"),
        "layer_norm_epsilon": _meta_float(header, "starcoder.attention.layer_norm_epsilon", 1e-5),
        "activation_function": "gelu_pytorch_tanh",  # what llama.cpp's starcoder graph computes
        "multi_query": True,
        "scale_attn_weights": True,
    }


def _expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """llama.cpp's name and (numpy) shape of every tensor the config implies."""
    args = model_args(config)
    h, inter, vocab = args.hidden_size, args.intermediate_size, args.vocab_size
    kv = args.num_key_value_heads * args.head_dim
    shapes = {"token_embd.weight": (vocab, h), "output_norm.weight": (h,), "output_norm.bias": (h,)}
    if config["model_type"] == "gpt_bigcode":
        linears = {"attn_qkv": (h + 2 * kv, h), "attn_output": (h, h)}
        shapes["position_embd.weight"] = (args.n_positions, h)
        biases = True
    else:
        linears = {"attn_q": (h, h), "attn_k": (kv, h), "attn_v": (kv, h), "attn_output": (h, h)}
        biases = args.use_bias
    linears |= {"ffn_up": (inter, h), "ffn_down": (h, inter)}
    if not args.tie_word_embeddings:
        shapes["output.weight"] = (vocab, h)
    for i in range(args.num_hidden_layers):
        for name, shape in linears.items():
            shapes[f"blk.{i}.{name}.weight"] = shape
            if biases:
                shapes[f"blk.{i}.{name}.bias"] = shape[:1]
        for norm in ("attn_norm", "ffn_norm"):
            shapes |= {f"blk.{i}.{norm}.weight": (h,), f"blk.{i}.{norm}.bias": (h,)}
    return shapes


def _check_tensors(header: GGUFHeader, config: dict[str, Any]) -> None:
    """Every tensor the metadata implies, of that shape and a supported type, and no other."""
    expected = _expected_shapes(config)
    args = model_args(config)
    sizes = ", ".join(
        f"{k} {getattr(args, k)}" for k in ("num_hidden_layers", "hidden_size", "intermediate_size")
    )
    for name, shape in expected.items():
        info = header.tensors.get(name)
        if info is None:
            msg = f"{header.path} has no tensor {name}, which its metadata ({sizes}) implies."
            raise CheckpointError(msg)
        if info.shape != shape:
            msg = (
                f"{header.path}: tensor {name} has shape {list(info.shape)}, but the metadata ({sizes}) "
                f"implies {list(shape)}."
            )
            raise CheckpointError(msg)
    extra = sorted(set(header.tensors) - set(expected))
    if extra:
        msg = f"{header.path} holds tensors a {config['model_type']} model does not have: {extra[:5]}."
        raise CheckpointError(msg)
    for name, info in header.tensors.items():
        if info.type_name not in SUPPORTED_TYPES:
            msg = (
                f"{header.path}: tensor {name} is of type {info.type_name}, which MLX cannot read. "
                f"Supported: {_supported()}. Re-quantize the file with llama.cpp (e.g. to Q4_0 or "
                "Q8_0), or use its F16 version."
            )
            raise UnsupportedModelError(msg)
        quantized = info.type_name in QUANTIZED_TYPES or info.type_name in DEQUANTIZED_TYPES
        if quantized and len(info.shape) != 2:
            msg = f"{header.path}: tensor {name} is a quantized {len(info.shape)}-D tensor; expected 2-D."
            raise CheckpointError(msg)


def quantized_layers(header: GGUFHeader) -> dict[str, dict[str, int]]:
    """Our module path -> MLX quantization of each tensor kept quantized (its own type's bits)."""
    layers = {}
    for name, info in header.tensors.items():
        if info.type_name in QUANTIZED_TYPES:
            path = our_name(name, header.arch).removesuffix(".weight")
            layers[path] = {"group_size": GROUP_SIZE, "bits": QUANTIZED_TYPES[info.type_name]}
    return layers


def warn_notices(checkpoint: GGUFCheckpoint) -> None:
    for notice in checkpoint.notices:  # shown at the caller of StarCoderEngine.load
        warnings.warn(notice, GGUFNotice, stacklevel=4)


# --- weights ---------------------------------------------------------------------------------------------


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


def load_gguf_model(
    checkpoint: GGUFCheckpoint, *, quantize: int | None, group_size: int, dtype: str
) -> LoadedModel:
    """Build our module from a checked GGUF file; then the same dtype policy and quantize-on-load
    as safetensors checkpoints (``loading.finish_loading``)."""
    import mlx.nn as nn

    from .loading import FAMILIES, finish_loading

    config = dict(checkpoint.config)
    layers = quantized_layers(checkpoint.header)
    family = FAMILIES[config["model_type"]]
    model = family.Model(family.ModelArgs.from_dict(config))
    if layers:
        nn.quantize(model, class_predicate=lambda path, _: layers.get(path, False))
    weights = read_weights(checkpoint)
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        msg = f"The weights of {checkpoint.path} do not fit a {config['model_type']} model: {e}"
        raise CheckpointError(msg) from e
    if layers:
        config["quantization"] = {"group_size": GROUP_SIZE, **_quantization_entries(layers)}
    return finish_loading(model, config, quantize=quantize, group_size=group_size, dtype=dtype)


def _check_quantize(checkpoint: GGUFCheckpoint, quantize: int | None) -> None:
    if quantize is not None and quantized_layers(checkpoint.header):
        msg = f"{checkpoint.path} is already quantized (Q4_0/Q4_1/Q8_0 tensors); load it with quantize=None."
        raise InvalidParameterError(msg)


def _quantization_entries(layers: dict[str, dict[str, int]]) -> dict[str, Any]:
    """mlx-lm's ``quantization`` config: the commonest bits, and each layer that differs (mixed files)."""
    bits = [q["bits"] for q in layers.values()]
    common = max(set(bits), key=bits.count)
    return {"bits": common, **{path: q for path, q in sorted(layers.items()) if q["bits"] != common}}


# --- tokenizer ------------------------------------------------------------------------------------------

_CONTROL, _USER_DEFINED = 3, 4
_PRE_TOKENIZERS = ("starcoder",)


def gguf_tokenizer(checkpoint: GGUFCheckpoint) -> Any:
    """The tokenizer a GGUF file carries (``tokenizer.ggml.*``), as the Hugging Face tokenizer of
    the same model: byte-level BPE, digits split, control tokens special (so never parsed from
    data), in mlx-lm's wrapper with our code detokenizer."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from .loading import CodeDetokenizer

    meta, path = checkpoint.header.metadata, checkpoint.path
    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
    if pre is None:  # files converted before llama.cpp recorded it (spring 2024)
        pre = "starcoder"
        checkpoint.notices.append(f"{path.name} does not name its pre-tokenizer; using StarCoder's.")
    tokens, merges = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges")
    if kind != "gpt2" or not isinstance(tokens, list) or not isinstance(merges, list):
        msg = (
            f"{path} carries no byte-level BPE tokenizer (tokenizer.ggml.model is {kind!r}, with "
            "tokens and merges): StarCoder files have one. Re-convert it with llama.cpp."
        )
        raise CheckpointError(msg)
    if pre not in _PRE_TOKENIZERS:
        msg = f"{path}: tokenizer.ggml.pre {pre!r} is not StarCoder's; supported: {list(_PRE_TOKENIZERS)}."
        raise UnsupportedModelError(msg)
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens) or len(tokens) > checkpoint.config["vocab_size"]:
        msg = (
            f"{path}: the tokenizer's {len(tokens)} tokens are not unique or outnumber the "
            f"embedding's {checkpoint.config['vocab_size']} rows; re-convert the file."
        )
        raise CheckpointError(msg)
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    try:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        bpe = models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False)
    except Exception as e:  # tokenizers raises a bare Exception for a merge of unknown tokens
        msg = f"{path}: the tokenizer's merges do not fit its tokens ({e}); re-convert the file."
        raise CheckpointError(msg) from e
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=True)
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    control = [t for t, kind in zip(tokens, types, strict=False) if kind == _CONTROL]
    user = [t for t, kind in zip(tokens, types, strict=False) if kind == _USER_DEFINED]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=token("bos"),
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding"),
        additional_special_tokens=control,
        clean_up_tokenization_spaces=False,
        model_max_length=model_args(checkpoint.config).max_position_embeddings,
    )
    template = meta.get("tokenizer.chat_template")  # instruct models carry theirs (ChatStarCoder uses it)
    if isinstance(template, str):
        hf.chat_template = template
    eos = checkpoint.config.get("eos_token_id")
    return TokenizerWrapper(hf, CodeDetokenizer, eos_token_ids=[] if eos is None else [eos])


# --- where the file is ----------------------------------------------------------------------------------


def is_gguf(model: str | os.PathLike[str], gguf_file: str | None) -> bool:
    return gguf_file is not None or os.fspath(model).lower().endswith(".gguf")


def open_gguf(
    model: str | os.PathLike[str],
    gguf_file: str | None,
    revision: str | None,
    sliding_window: int | None,
    settings: dict[str, Any],
) -> tuple[str, Path, dict[str, Any], Callable[[], Any], Callable[[], LoadedModel]] | None:
    """For ``StarCoderEngine.load``: None if ``model`` is not a GGUF file, else its name, path,
    config, a tokenizer maker and the weights loader (``settings``: quantize, group_size, dtype)."""
    if not is_gguf(model, gguf_file):
        if sliding_window is not None:
            msg = "sliding_window= applies to GGUF files only; a checkpoint folder's config.json sets it."
            raise InvalidParameterError(msg)
        return None
    checkpoint = read_gguf(resolve_gguf_file(model, gguf_file, revision), sliding_window=sliding_window)
    _check_quantize(checkpoint, settings["quantize"])
    dtype = settings["dtype"]
    if dtype == "auto":
        dtype = str(default_compute_dtype() or "float16").removeprefix("mlx.core.")
    if notice := dequantized_notice(checkpoint, 4 if dtype == "float32" else 2):
        checkpoint.notices.append(notice)

    def make_tokenizer() -> Any:
        tokenizer = gguf_tokenizer(checkpoint)
        warn_notices(checkpoint)  # once the file has passed every check
        return tokenizer

    name = os.fspath(model) if gguf_file is None else f"{os.fspath(model)}/{gguf_file}"
    loader = lambda: load_gguf_model(checkpoint, **settings)  # noqa: E731
    return name, checkpoint.path, checkpoint.config, make_tokenizer, loader


def resolve_gguf_file(model: str | os.PathLike[str], gguf_file: str | None, revision: str | None) -> Path:
    """The local GGUF file: ``model`` itself (a .gguf path), ``gguf_file`` in a local folder, or
    ``gguf_file`` of a hub repo downloaded (that one file) with huggingface_hub."""
    path = Path(model).expanduser()
    if gguf_file is None:
        if not path.is_file():
            msg = f"No GGUF file at {path}."
            raise ModelNotFoundError(msg)
        return path
    if path.is_dir():
        file = path / gguf_file
        if not file.is_file():
            found = sorted(p.name for p in path.glob("*.gguf"))
            msg = f"{path} has no {gguf_file}" + (f"; it has {found}." if found else ".")
            raise ModelNotFoundError(msg)
        return file
    name = os.fspath(model)
    if not is_hub_id(name):
        msg = f"No folder at {path} and {name!r} is not a hub id (owner/name) to fetch {gguf_file} from."
        raise ModelNotFoundError(msg)
    return _download(name, gguf_file, revision)


def _download(repo_id: str, filename: str, revision: str | None) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    # Raised "from None", as loading's: the hub's chained errors (50 lines of httpx) would bury the message.
    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision))
    except RevisionNotFoundError:
        msg = f"Hub model {repo_id!r} has no revision {revision!r}; check the branch, tag or commit."
        raise ModelNotFoundError(msg) from None
    except GatedRepoError:
        msg = f"Hub model {repo_id!r} is gated: accept its licence on the hub and log in (`hf auth login`)."
        raise ModelNotFoundError(msg) from None
    except RepositoryNotFoundError:
        msg = f"Hub model {repo_id!r} does not exist (or is private: log in with `hf auth login`)."
        raise ModelNotFoundError(msg) from None
    except LocalEntryNotFoundError:
        msg = (
            f"Could not download {filename} of {repo_id!r}: the hub cannot be reached (or "
            "HF_HUB_OFFLINE is set) and it is not in the local cache."
        )
        raise ModelNotFoundError(msg) from None
    except EntryNotFoundError:
        msg = f"Hub model {repo_id!r} has no file {filename!r}; check the name (case matters)."
        raise ModelNotFoundError(msg) from None
    except (OSError, ValueError) as e:
        msg = f"Download of {filename} from {repo_id!r} failed: {e}"
        raise ModelNotFoundError(msg) from None


# --- convert ---------------------------------------------------------------------------------------------


def convert_gguf(src: str | os.PathLike[str], dst: Path, *, sliding_window: int | None = None) -> None:
    """Write an MLX checkpoint folder (safetensors, config.json, tokenizer files) from a GGUF file
    into the existing folder ``dst``: Q4_0/Q4_1/Q8_0 stay quantized (mlx-lm's layout and
    ``quantization`` config, per-layer bits where a file mixes them), floats keep their dtype."""
    import mlx.core as mx

    checkpoint = read_gguf(src, sliding_window=sliding_window)
    if notice := dequantized_notice(checkpoint, 2):
        checkpoint.notices.append(notice)
    tokenizer = gguf_tokenizer(checkpoint)
    warn_notices(checkpoint)
    weights = read_weights(checkpoint)
    config = dict(checkpoint.config)
    layers = quantized_layers(checkpoint.header)
    if layers:
        config["quantization"] = {"group_size": GROUP_SIZE, **_quantization_entries(layers)}
        config["quantization_config"] = config["quantization"]
    floats = {w.dtype for w in weights.values() if mx.issubdtype(w.dtype, mx.floating)}
    config["torch_dtype"] = next(
        (name for name in ("float32", "bfloat16") if getattr(mx, name) in floats), "float16"
    )
    mx.save_safetensors(str(dst / "model.safetensors"), weights, metadata={"format": "mlx"})
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    tokenizer._tokenizer.save_pretrained(dst)
    # transformers 5 names the class TokenizersBackend, which transformers 4 does not know
    settings = json.loads((dst / "tokenizer_config.json").read_text(encoding="utf-8"))
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    settings.setdefault("additional_special_tokens", settings.get("extra_special_tokens", []))
    (dst / "tokenizer_config.json").write_text(json.dumps(settings, indent=2, ensure_ascii=False))
