"""A checked GGUF file: the config its metadata implies, and every tensor it must hold."""

from __future__ import annotations

import os
import reprlib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError, InvalidParameterError, UnsupportedModelError
from ..loading import model_args, validate_config
from .ggml_types import DEQUANTIZED_TYPES, QUANTIZED_TYPES, SUPPORTED_TYPES, supported_types_text
from .header import GGUFHeader, read_header
from .layout import LAYOUTS, block_of, expected_shapes

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


#: Each config.json setting and the llama.cpp metadata key (after ``{arch}.``) it comes from.
_STARCODER2_KEYS = {
    "hidden_size": "embedding_length",
    "num_hidden_layers": "block_count",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "intermediate_size": "feed_forward_length",
    "max_position_embeddings": "context_length",
    "rope_theta": "rope.freq_base",
    "norm_epsilon": "attention.layer_norm_epsilon",
    "sliding_window": "attention.sliding_window",
}
_STARCODER_KEYS = {
    "n_embd": "embedding_length",
    "n_layer": "block_count",
    "n_head": "attention.head_count",
    "n_inner": "feed_forward_length",
    "n_positions": "context_length",
    "layer_norm_epsilon": "attention.layer_norm_epsilon",
}
#: What llama.cpp itself requires of a model file (config.json may leave some of these out).
_REQUIRED = (
    "embedding_length",
    "block_count",
    "attention.head_count",
    "feed_forward_length",
    "context_length",
)
_TOKEN_KEYS = {"bos_token_id": "tokenizer.ggml.bos_token_id", "eos_token_id": "tokenizer.ggml.eos_token_id"}
_FIX = "Re-convert the file with llama.cpp's convert_hf_to_gguf.py, or download it again."


def read_gguf(path: str | os.PathLike[str], *, sliding_window: int | None = None) -> GGUFCheckpoint:
    """Parse and check a GGUF file: architecture, sizes, every tensor's name, type and shape.

    The config its metadata implies passes the same rules as a config.json (``loading.validate_config``).
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
    if not isinstance(arch, str) or arch not in LAYOUTS:
        msg = (
            f"{header.path} holds a {reprlib.repr(arch)} model; langchain-starcoder runs GGUF files of the "
            f"architectures {list(LAYOUTS)} (StarCoder2, and StarCoder / GPTBigCode)."
        )
        raise UnsupportedModelError(msg)
    embed = header.tensors.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        msg = f"{header.path} has no 2-D tensor token_embd.weight; it is not a complete model file."
        raise CheckpointError(msg)
    missing = [f"{arch}.{key}" for key in _REQUIRED if f"{arch}.{key}" not in header.metadata]
    if missing:
        msg = (
            f"{header.path} has no {missing[0]!r} in its metadata; it is not a complete llama.cpp model file."
        )
        raise CheckpointError(msg)
    notices: list[str] = []
    if arch == "starcoder":
        config = _starcoder_config(header, sliding_window)
    else:
        config = _starcoder2_config(header, sliding_window, notices)
    config |= {"vocab_size": embed.shape[0], "tie_word_embeddings": "output.weight" not in header.tensors}
    config |= {key: header.metadata[name] for key, name in _TOKEN_KEYS.items() if name in header.metadata}
    keys = _STARCODER_KEYS if arch == "starcoder" else _STARCODER2_KEYS
    names = {key: f"{arch}.{name}" for key, name in keys.items()}
    names |= {**_TOKEN_KEYS, "vocab_size": "the rows of token_embd.weight"}
    validate_config(config, header.path, names=names, fix=_FIX)
    if arch == "starcoder":
        _check_one_kv_head(header)
    _check_tensors(header, config)
    return GGUFCheckpoint(header, config, notices)


def _from_metadata(header: GGUFHeader, keys: dict[str, str]) -> dict[str, Any]:
    """The settings the metadata records, as they are (``validate_config`` checks them)."""
    config = {}
    for key, name in keys.items():
        if (value := header.metadata.get(f"{header.arch}.{name}")) is not None:
            # GGUF stores float32: its shortest decimal gives back what the config said (1e-05, not 9.99e-06)
            config[key] = float(str(np.float32(value))) if isinstance(value, float) else value
    return config


def _starcoder2_config(header: GGUFHeader, sliding_window: int | None, notices: list[str]) -> dict[str, Any]:
    """A Starcoder2 config.json's settings from llama.cpp's ``starcoder2.*`` metadata."""
    config = _from_metadata(header, _STARCODER2_KEYS)
    if sliding_window is not None:
        config["sliding_window"] = sliding_window
    elif "sliding_window" not in config:
        config["sliding_window"] = STARCODER2_SLIDING_WINDOW
        notices.append(
            f"{header.path.name} does not record StarCoder2's attention window (llama.cpp's converter "
            f"drops it); using the published {STARCODER2_SLIDING_WINDOW}. To override it, pass "
            "sliding_window= (--sliding-window on the command line)."
        )
    if type(config["sliding_window"]) is int and config["sliding_window"] == 0:
        config["sliding_window"] = None  # GGUF's (and our parameter's) 0 is full attention
    if "rope_theta" not in config:
        notices.append(
            f"{header.path.name} does not record rope.freq_base; using llama.cpp's default 10000 "
            "(StarCoder2 checkpoints use 100000 to 1000000: check where the file came from)."
        )
    # llama.cpp's defaults when a key is absent: as many KV heads as heads, RoPE base 10000
    if "num_attention_heads" in config:
        config.setdefault("num_key_value_heads", config["num_attention_heads"])
    config.setdefault("rope_theta", 10000.0)
    config.setdefault("norm_epsilon", 1e-5)
    return {
        "model_type": "starcoder2",
        "architectures": ["Starcoder2ForCausalLM"],
        **config,
        "hidden_act": "gelu_pytorch_tanh",  # what llama.cpp's starcoder2 graph computes
        "use_bias": "blk.0.attn_q.bias" in header.tensors,
    }


def _starcoder_config(header: GGUFHeader, sliding_window: int | None) -> dict[str, Any]:
    """A GPTBigCode config.json's settings from llama.cpp's ``starcoder.*`` metadata."""
    if sliding_window:
        msg = f"sliding_window= applies to StarCoder2; {header.path.name} is a StarCoder (v1) model."
        raise InvalidParameterError(msg)
    return {
        "model_type": "gpt_bigcode",
        "architectures": ["GPTBigCodeForCausalLM"],
        "layer_norm_epsilon": 1e-5,
        **_from_metadata(header, _STARCODER_KEYS),
        "activation_function": "gelu_pytorch_tanh",  # what llama.cpp's starcoder graph computes
        "multi_query": True,
        "scale_attn_weights": True,
    }


def _check_one_kv_head(header: GGUFHeader) -> None:
    kv_heads = header.metadata.get("starcoder.attention.head_count_kv", 1)
    if type(kv_heads) is not int or kv_heads != 1:
        msg = (
            f"{header.path}: starcoder.attention.head_count_kv is {reprlib.repr(kv_heads)}: StarCoder GGUF "
            "files have one key/value head (multi-query)."
        )
        raise UnsupportedModelError(msg)


def _check_tensors(header: GGUFHeader, config: dict[str, Any]) -> None:
    """Every tensor the metadata implies, of that shape and a supported type, and no other."""
    args = model_args(config)
    # The blocks first: the table of expected tensors grows with block_count, which a header may
    # set to millions; the file's own tensor table is bounded by its size.
    n = args.num_hidden_layers
    blocks = {i for name in header.tensors if (i := block_of(name)) is not None}
    if len(blocks) != n or max(blocks, default=-1) != n - 1:  # i.e. blocks 0 to n - 1
        found = f"blocks {min(blocks)} to {max(blocks)}" if blocks else "no blocks"
        msg = (
            f"{header.path}: its metadata says {header.arch}.block_count is {n}, but its tensors are "
            f"of {found} ({len(blocks)} in all). {_FIX}"
        )
        raise CheckpointError(msg)
    expected = expected_shapes(config)
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
