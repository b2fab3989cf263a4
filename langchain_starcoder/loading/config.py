"""config.json, read and checked by one rule table (the GGUF reader checks its metadata by it too)."""

from __future__ import annotations

import json
import math
import reprlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, UnsupportedModelError
from .families import FAMILIES, model_args


def read_config(path: Path) -> dict[str, Any]:
    """config.json, checked: a StarCoder2 or StarCoder (GPTBigCode) config whose sizes and settings
    the model can be built from."""
    config_file = path / "config.json"
    if not config_file.is_file():
        msg = f"{path} has no config.json: it is not a Hugging Face checkpoint folder."
        raise CheckpointError(msg)
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        msg = f"{config_file} is not valid JSON ({e}); re-download or rebuild the checkpoint."
        raise CheckpointError(msg) from e
    if not isinstance(config, dict):
        msg = (
            f"{config_file} holds {reprlib.repr(config)}, not a JSON object of settings; "
            "re-download or rebuild the checkpoint."
        )
        raise CheckpointError(msg)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        msg = (
            f"{path} holds a {reprlib.repr(model_type)} model; langchain-starcoder runs StarCoder2 "
            "(model_type 'starcoder2', e.g. mlx-community/starcoder2-3b-4bit) and StarCoder "
            "(model_type 'gpt_bigcode', e.g. bigcode/starcoderbase-1b) checkpoints."
        )
        raise UnsupportedModelError(msg)
    validate_config(config, config_file)
    return config


#: MLX array dimensions are 32-bit ints: no size can be larger.
MAX_SIZE = 2**31 - 1


def _is_size(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SIZE


def _is_positive(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < math.inf


def _is_token_id(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SIZE


_SIZE = (_is_size, f"a whole number from 1 to {MAX_SIZE}")

#: What each config.json entry the model uses must be: key -> (required, test, what it must be).
#: An optional key may be absent (ModelArgs's default applies).
CONFIG_RULES: dict[str, tuple[bool, Callable[[Any], bool], str]] = {
    "hidden_size": (True, *_SIZE),
    "num_hidden_layers": (True, *_SIZE),
    "num_attention_heads": (True, *_SIZE),
    "num_key_value_heads": (True, *_SIZE),
    "intermediate_size": (True, *_SIZE),
    "vocab_size": (False, *_SIZE),
    "max_position_embeddings": (False, *_SIZE),
    "sliding_window": (
        False,
        lambda v: v is None or _is_size(v),
        "null (full attention) or a whole number >= 1",
    ),
    "rope_theta": (False, lambda v: v is None or _is_positive(v), "a positive number"),
    "rope_parameters": (False, lambda v: v is None or isinstance(v, dict), "null or an object"),
    # transformers refuses an int here: be as strict, and say so first
    "norm_epsilon": (
        False,
        lambda v: isinstance(v, float) and _is_positive(v),
        "a positive float (e.g. 1e-05)",
    ),
    "hidden_act": (False, lambda v: isinstance(v, str), "the name of an activation"),
    "use_bias": (False, lambda v: isinstance(v, bool), "true or false"),
    "tie_word_embeddings": (False, lambda v: isinstance(v, bool), "true or false"),
    "eos_token_id": (
        False,
        lambda v: v is None or _is_token_id(v) or (isinstance(v, list) and all(map(_is_token_id, v))),
        "null, a token id or a list of token ids",
    ),
    "quantization": (
        False,
        lambda v: isinstance(v, dict) and _is_size(v.get("bits")) and _is_size(v.get("group_size")),
        'an object with whole-number "bits" and "group_size"',
    ),
}

#: The same for a GPTBigCode (StarCoder v1) config.json, whose names are GPT-2's.
GPT_BIGCODE_RULES: dict[str, tuple[bool, Callable[[Any], bool], str]] = {
    "n_embd": (True, *_SIZE),
    "n_layer": (True, *_SIZE),
    "n_head": (True, *_SIZE),
    "n_positions": (False, *_SIZE),
    "n_inner": (False, lambda v: v is None or _is_size(v), "null (4 x n_embd) or a whole number >= 1"),
    "activation_function": (False, lambda v: isinstance(v, str), "the name of an activation"),
    "layer_norm_epsilon": (False, CONFIG_RULES["norm_epsilon"][1], CONFIG_RULES["norm_epsilon"][2]),
    "multi_query": (False, lambda v: isinstance(v, bool), "true or false"),
    "scale_attn_weights": (False, lambda v: isinstance(v, bool), "true or false"),
    "add_cross_attention": (False, lambda v: v is False, "false (a decoder-only model)"),
    **{k: CONFIG_RULES[k] for k in ("vocab_size", "tie_word_embeddings", "eos_token_id", "quantization")},
}


_RULES = {"starcoder2": CONFIG_RULES, "gpt_bigcode": GPT_BIGCODE_RULES}


_FIX = "Fix config.json, or re-download or rebuild the checkpoint."


def validate_config(
    config: dict[str, Any], source: Path, *, names: Mapping[str, str] | None = None, fix: str = _FIX
) -> None:
    """Refuse a config the model cannot be built from, before anything is allocated: one clear error.

    ``source`` is the file the config came from; ``names`` what it calls each setting where that
    differs (a GGUF file's metadata keys), and ``fix`` what to do about a bad one.
    """
    names = names or {}

    def name(key: str) -> str:
        return names.get(key, key)

    family = config.get("model_type", "starcoder2")
    for key, (required, test, expected) in _RULES[family].items():
        if key not in config:
            if required:
                msg = f"{source} has no {name(key)!r}, which must be {expected}. {fix}"
                raise CheckpointError(msg)
        elif not test(config[key]):
            msg = f"{source}: {name(key)} is {reprlib.repr(config[key])}, but it must be {expected}. {fix}"
            raise CheckpointError(msg)
    if family == "gpt_bigcode":
        if config["n_embd"] % config["n_head"]:
            msg = (
                f"{source}: {name('n_embd')} {config['n_embd']} and {name('n_head')} {config['n_head']} "
                f"do not fit: the heads must divide {name('n_embd')}. {fix}"
            )
            raise CheckpointError(msg)
    else:
        _validate_starcoder2(config, source, name, fix)
    try:  # well formed, but is it a model this package runs (activation, RoPE type)?
        args = model_args(config)
    except UnsupportedModelError as e:
        msg = f"{source}: {e} langchain-starcoder runs StarCoder and StarCoder2 checkpoints as published."
        raise UnsupportedModelError(msg) from e
    _validate_eos(config, args.vocab_size, source, name, fix)


def _validate_starcoder2(config: dict[str, Any], source: Path, name: Callable[[str], str], fix: str) -> None:
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope and not _is_positive(rope["rope_theta"]):
        msg = (
            f"{source}: rope_parameters.rope_theta is {reprlib.repr(rope['rope_theta'])}, "
            f"but it must be a positive number. {fix}"
        )
        raise CheckpointError(msg)
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    if hidden % heads or heads % kv_heads:
        msg = (
            f"{source}: {name('hidden_size')} {hidden}, {name('num_attention_heads')} {heads} and "
            f"{name('num_key_value_heads')} {kv_heads} do not fit: the heads must divide "
            f"{name('hidden_size')} and the key/value heads must divide the heads. {fix}"
        )
        raise CheckpointError(msg)


def _validate_eos(
    config: dict[str, Any], vocab_size: int, source: Path, name: Callable[[str], str], fix: str
) -> None:
    """The end-of-text ids must be in the vocabulary: one past it would never stop a generation."""
    eos = config.get("eos_token_id")
    ids = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if any(i >= vocab_size for i in ids):
        msg = (
            f"{source}: {name('eos_token_id')} is {reprlib.repr(eos)}, but the vocabulary has "
            f"{vocab_size} tokens (ids 0 to {vocab_size - 1}). {fix}"
        )
        raise CheckpointError(msg)
