"""A checked GGUF file: the config its metadata implies, and every tensor it must hold."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError, InvalidParameterError, UnsupportedModelError
from ..loading import _is_positive, _is_size, model_args
from .ggml_types import DEQUANTIZED_TYPES, QUANTIZED_TYPES, SUPPORTED_TYPES, supported_types_text
from .header import GGUFHeader, read_header
from .layout import LAYOUTS, expected_shapes

#: StarCoder2's published attention window; llama.cpp's converter does not write it into GGUF files.
STARCODER2_SLIDING_WINDOW = 4096


class GGUFNotice(UserWarning):
    """Something a GGUF file's user should know: a default filled in, memory a type costs."""


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


def _check_tensors(header: GGUFHeader, config: dict[str, Any]) -> None:
    """Every tensor the metadata implies, of that shape and a supported type, and no other."""
    expected = expected_shapes(config)
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
                f"Supported: {supported_types_text()}. Re-quantize the file with llama.cpp (e.g. to Q4_0 or "
                "Q8_0), or use its F16 version."
            )
            raise UnsupportedModelError(msg)
        quantized = info.type_name in QUANTIZED_TYPES or info.type_name in DEQUANTIZED_TYPES
        if quantized and len(info.shape) != 2:
            msg = f"{header.path}: tensor {name} is a quantized {len(info.shape)}-D tensor; expected 2-D."
            raise CheckpointError(msg)


def warn_notices(checkpoint: GGUFCheckpoint) -> None:
    for notice in checkpoint.notices:  # shown at the caller of StarCoderEngine.load
        warnings.warn(notice, GGUFNotice, stacklevel=4)
