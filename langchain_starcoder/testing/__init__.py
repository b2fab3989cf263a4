"""Build StarCoder2 and StarCoder (GPTBigCode) checkpoints offline, for tests, examples and benchmarks.

The checkpoints have the real layout (Hugging Face ``Starcoder2ForCausalLM`` / ``GPTBigCodeForCausalLM``
weight names and config, a byte-level BPE ``tokenizer.json`` carrying the family's special tokens with
``<|endoftext|>`` at id 0), so transformers, mlx-lm and this package all load them. The weights are
random, so the text they generate is nonsense, but it is deterministic for a given ``seed``. They are
drawn and written one layer at a time (:mod:`.weights`), so the real 3b, 7b and 15b shapes build in the
memory of one layer; the tokenizer trainer is :mod:`.tokenizer`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .._registry import DEFAULT_MODEL
from ..errors import ModelNotFoundError
from ..loading import QUANTIZE_BITS, check_choice, resolve_model_path
from .tokenizer import SPECIAL_TOKENS, STARCODER_SPECIAL_TOKENS, write_tokenizer
from .weights import (
    Draw,
    Quantization,
    ResourceError,
    check_room,
    dense_and_norms,
    plan_weights,
    write_weights,
)

__all__ = [
    "GPT_BIGCODE_PRESETS",
    "INSTRUCT_CHAT_TEMPLATE",
    "MODEL_ENV",
    "PRESETS",
    "SPECIAL_TOKENS",
    "STARCHAT_CHAT_TEMPLATE",
    "STARCHAT_TOKENS",
    "STARCODER_SPECIAL_TOKENS",
    "ResourceError",
    "build_gpt_bigcode",
    "build_starcoder2",
    "copy_checkpoint",
    "model_or_offline",
]

#: Where the command line and the notebooks (through model_or_offline) read the model from.
MODEL_ENV = "LANGCHAIN_STARCODER_MODEL"

_COMMON = {
    "model_type": "starcoder2",
    "architectures": ["Starcoder2ForCausalLM"],
    "hidden_act": "gelu_pytorch_tanh",
    "norm_epsilon": 1e-5,
    "use_bias": True,
    "tie_word_embeddings": True,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "attention_dropout": 0.0,
    "residual_dropout": 0.0,
    "embedding_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
}

_PRESET_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "rope_theta",
    "sliding_window",
    "max_position_embeddings",
)
_UNTIED = {"tie_word_embeddings": False}

#: Shapes of the real checkpoints (their Hugging Face configs), and "tiny" and "small" for tests.
PRESETS: dict[str, dict[str, Any]] = {
    name: dict(zip(_PRESET_KEYS, shape, strict=True)) | more
    for name, shape, more in (
        # hidden, layers, heads, KV heads, MLP, vocabulary, RoPE theta, window, positions
        ("tiny", (64, 2, 4, 2, 256, 1024, 10000.0, 512, 2048), _UNTIED),
        ("small", (256, 2, 4, 2, 1024, 1024, 10000.0, 512, 2048), _UNTIED),
        ("3b", (3072, 30, 24, 2, 12288, 49152, 999999.4420358813, 4096, 16384), {}),
        ("7b", (4608, 32, 36, 4, 18432, 49152, 1000000.0, 4096, 16384), {}),
        ("15b", (6144, 40, 48, 4, 24576, 49152, 100000.0, 4096, 16384), {}),
    )
}

_DTYPES = ("float32", "float16", "bfloat16")

#: A chat template in the shape of starcoder2-15b-instruct's, for building instruct checkpoints.
INSTRUCT_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\n\n' }}"
    "{% elif message['role'] == 'user' %}{{ '### Instruction\n' + message['content'] + '\n\n' }}"
    "{% else %}{{ '### Response\n' + message['content'] + eos_token + '\n\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Response\n' }}{% endif %}"
)


def build_starcoder2(
    path: str | Path,
    *,
    preset: str = "tiny",
    num_layers: int | None = None,
    sliding_window: int | None = None,
    seed: int = 0,
    dtype: str = "float32",
    quantize: int | None = None,
    chat_template: str | None = None,
    group_size: int = 64,
    tie_word_embeddings: bool | None = None,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write a StarCoder2 checkpoint with random weights to ``path`` and return the path.

    Args:
        path: Folder to create (it may exist; the files are replaced).
        preset: "tiny" (a few MB, for tests), "small" (wide enough for every quantization group
            size), or the real shapes "3b", "7b", "15b".
        num_layers: Override the number of layers, to keep a big preset small.
        sliding_window: Override the attention window (``0`` for none, i.e. full attention).
        seed: Seed of the weights; the same seed gives the same checkpoint.
        dtype: Weight dtype on disk: "float32", "float16" or "bfloat16".
        quantize: 4 or 8 to write an MLX-quantized checkpoint laid out like mlx-community's
            (float16 scales and biases, a "quantization" entry in config.json).
        chat_template: A Jinja chat template to store in tokenizer_config.json (instruct models).
        group_size: Quantization group size, with ``quantize``.
        tie_word_embeddings: False writes a separate ``lm_head.weight``. By default the preset's
            choice: tied for the real shapes, untied for "tiny" (random tied weights tend to repeat
            their input token, which makes dull test output).
        max_shard_bytes: Split the weights into ``model-0000x-of-0000y.safetensors`` shards of at
            most this size, with an index, as big hub checkpoints are.
    """
    check_choice("preset", preset, tuple(PRESETS))
    check_choice("dtype", dtype, _DTYPES)
    check_choice("quantize", quantize, QUANTIZE_BITS)

    config = {**_COMMON, **PRESETS[preset], "torch_dtype": dtype}
    if tie_word_embeddings is not None:
        config["tie_word_embeddings"] = tie_word_embeddings
    if num_layers is not None:
        config["num_hidden_layers"] = num_layers
    if sliding_window is not None:
        config["sliding_window"] = sliding_window or None
    quantization = None if quantize is None else Quantization(quantize, group_size)
    if quantization is not None:
        # mlx-community's layout, as mlx_lm.convert writes it: float16 scales, biases and other weights.
        config["quantization"] = {"group_size": group_size, "bits": quantize, "mode": "affine"}
        config["quantization_config"] = config["quantization"]
        config["torch_dtype"] = "float16"
    stored = f"{quantize}-bit" if quantize else dtype
    return _write_checkpoint(
        path,
        config,
        _starcoder2_weights,
        {"chat_template": chat_template},
        seed=seed,
        dtype=dtype,
        quantization=quantization,
        max_shard_bytes=max_shard_bytes,
        what=f"a {preset} StarCoder2 checkpoint ({config['num_hidden_layers']} layers, {stored})",
    )


def _starcoder2_weights(config: dict[str, Any], draw: Draw) -> Iterator[dict[str, np.ndarray]]:
    """The Hugging Face layout's weights, one group at a time: the embedding, each layer, the head."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    yield {"model.embed_tokens.weight": draw.embedding(config["vocab_size"], hidden, len(SPECIAL_TOKENS))}
    for i in range(config["num_hidden_layers"]):
        linears = (
            ("self_attn.q_proj", hidden, hidden),
            ("self_attn.k_proj", kv, hidden),
            ("self_attn.v_proj", kv, hidden),
            ("self_attn.o_proj", hidden, hidden),
            ("mlp.c_fc", inter, hidden),
            ("mlp.c_proj", hidden, inter),
        )
        yield dense_and_norms(
            f"model.layers.{i}.", linears, ("input_layernorm", "post_attention_layernorm"), draw
        )
    last = dense_and_norms("model.", (), ("norm",), draw, hidden)
    if not config["tie_word_embeddings"]:
        last["lm_head.weight"] = draw.dense(config["vocab_size"], hidden)
    yield last


def _write_checkpoint(
    folder: str | os.PathLike[str],
    config: dict[str, Any],
    family_weights: Callable[[dict[str, Any], Draw], Iterator[dict[str, np.ndarray]]],
    tokenizer: dict[str, Any],
    *,
    seed: int,
    dtype: str,
    what: str,
    quantization: Quantization | None = None,
    max_shard_bytes: int | None = None,
) -> Path:
    """Check that the checkpoint fits, then write its tokenizer (``write_tokenizer`` with these
    keywords, at the config's vocabulary size), weights (``family_weights`` of ``config``, one group at
    a time) and config into ``folder``, replacing the weights of an earlier build there; the folder."""
    path, weights = Path(folder), partial(family_weights, config)
    path.mkdir(parents=True, exist_ok=True)
    plan = plan_weights(weights, dtype, quantization, max_shard_bytes)
    check_room(path, plan, what)
    for old in path.glob("model*.safetensors*"):
        old.unlink()
    write_tokenizer(path, vocab_size=config["vocab_size"], **tokenizer)
    write_weights(path, weights, seed, plan, dtype, quantization)
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 0}, indent=2))
    # Last: a folder with config.json holds a whole checkpoint (model_or_offline relies on it).
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return path


# --- StarCoder (v1, GPTBigCode) ---------------------------------------------------------------

#: The chat tokens and template of HuggingFaceH4/starchat-beta (a StarCoderPlus fine-tune).
STARCHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
STARCHAT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

#: GPTBigCode shapes for tests: "tiny", and "small" (head_dim 64, for kv_bits and every group size).
GPT_BIGCODE_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(n_embd=64, n_layer=2, n_head=4, n_inner=None, n_positions=1024, vocab_size=1024),
    "small": dict(n_embd=256, n_layer=2, n_head=4, n_inner=1024, n_positions=1024, vocab_size=1024),
}


def build_gpt_bigcode(
    path: str | Path,
    *,
    preset: str = "tiny",
    multi_query: bool = True,
    n_positions: int | None = None,
    seed: int = 0,
    dtype: str = "float32",
    chat_template: str | None = None,
    tie_word_embeddings: bool = False,
) -> Path:
    """Write a StarCoder (GPTBigCode) checkpoint with random weights to ``path`` and return the path.

    The layout is Hugging Face's ``GPTBigCodeForCausalLM`` (``transformer.wte``, ``transformer.h.N.attn.
    c_attn``...), so transformers loads it too; the tokenizer carries StarCoder's special tokens.

    Args:
        path: Folder to create (it may exist; the files are replaced).
        preset: "tiny" (``n_inner`` null, i.e. 4 x n_embd) or "small" (head_dim 64).
        multi_query: True for StarCoder's one key/value head, False for multi-head attention.
        n_positions: Override the number of learned positions (the context window).
        seed: Seed of the weights; the same seed gives the same checkpoint.
        dtype: Weight dtype on disk: "float32", "float16" or "bfloat16".
        chat_template: A Jinja chat template for tokenizer_config.json; with
            :data:`STARCHAT_CHAT_TEMPLATE` the vocabulary also gets starchat's chat tokens, and
            ``<|end|>`` is the tokenizer's eos token (as in starchat).
        tie_word_embeddings: True shares ``wte`` with the output layer, as real checkpoints do.
    """
    check_choice("preset", preset, tuple(GPT_BIGCODE_PRESETS))
    check_choice("dtype", dtype, _DTYPES)
    config: dict[str, Any] = {
        "model_type": "gpt_bigcode",
        "architectures": ["GPTBigCodeForCausalLM"],
        **GPT_BIGCODE_PRESETS[preset],
        "activation_function": "gelu_pytorch_tanh",
        "layer_norm_epsilon": 1e-5,
        "multi_query": multi_query,
        "scale_attn_weights": True,
        "attention_softmax_in_fp32": True,
        "scale_attention_softmax_in_fp32": True,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "attn_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "resid_pdrop": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": dtype,
    }
    if n_positions is not None:
        config["n_positions"] = n_positions
    starchat = chat_template == STARCHAT_CHAT_TEMPLATE
    specials = STARCODER_SPECIAL_TOKENS + (STARCHAT_TOKENS if starchat else ())
    eos = "<|end|>" if starchat else "<|endoftext|>"
    tokenizer = {"chat_template": chat_template, "special_tokens": specials, "eos_token": eos}
    return _write_checkpoint(
        path,
        config,
        _gpt_bigcode_weights,
        tokenizer,
        seed=seed,
        dtype=dtype,
        what=f"a {preset} StarCoder checkpoint",
    )


def _gpt_bigcode_weights(config: dict[str, Any], draw: Draw) -> Iterator[dict[str, np.ndarray]]:
    """The ``GPTBigCodeForCausalLM`` layout's weights, one group at a time."""
    hidden = config["n_embd"]
    inner = config["n_inner"] or 4 * hidden
    kv = (1 if config["multi_query"] else config["n_head"]) * (hidden // config["n_head"])
    yield {
        "transformer.wte.weight": draw.embedding(config["vocab_size"], hidden, len(STARCODER_SPECIAL_TOKENS)),
        "transformer.wpe.weight": draw.normal((config["n_positions"], hidden), 0.1),
    }
    for i in range(config["n_layer"]):
        linears = (
            ("attn.c_attn", hidden + 2 * kv, hidden),
            ("attn.c_proj", hidden, hidden),
            ("mlp.c_fc", inner, hidden),
            ("mlp.c_proj", hidden, inner),
        )
        yield dense_and_norms(f"transformer.h.{i}.", linears, ("ln_1", "ln_2"), draw)
    last = dense_and_norms("transformer.", (), ("ln_f",), draw, hidden)
    if not config["tie_word_embeddings"]:
        last["lm_head.weight"] = draw.dense(config["vocab_size"], hidden)
    yield last


def copy_checkpoint(src: str | Path, dst: str | Path) -> Path:
    """Copy a built checkpoint folder (tests that damage a checkpoint work on a copy)."""
    return Path(shutil.copytree(src, dst, dirs_exist_ok=True))


def model_or_offline(
    model: str | None = None, default: str = DEFAULT_MODEL, *, instruct: bool = False
) -> str:
    """``model`` if it can be had, else, for ``default`` only, a small offline checkpoint (demos).

    ``model`` None means ``$LANGCHAIN_STARCODER_MODEL`` if set, else ``default``. A folder is used as it is;
    a hub id is downloaded here (once; then it is in the local hub cache). With no hub access (offline, or
    ``HF_HUB_OFFLINE=1``) and no cached copy, ``default`` is replaced by a checkpoint with random weights
    built offline once under ``~/.cache/langchain-starcoder`` (its output is nonsense, but every step is
    real), and two lines on stdout say why and where. Any other model that cannot be had raises
    :class:`ModelNotFoundError` (naming the variable, when it came from there). ``instruct`` builds the
    stand-in with a chat template.
    """
    from_env = model is None and bool(os.environ.get(MODEL_ENV))
    model = (os.environ.get(MODEL_ENV) or default) if model is None else model
    try:
        resolve_model_path(model)
    except ModelNotFoundError as err:
        if from_env:
            msg = (
                f"{err} The model came from ${MODEL_ENV}: point it at a checkpoint folder (an absolute path) "
                f"or a hub id, or unset it to use {default}."
            )
            raise ModelNotFoundError(msg) from None
        if model != default:
            raise
        kind = "instruct " if instruct else ""
        path = Path.home() / ".cache" / "langchain-starcoder" / f"offline-tiny{'-instruct' * instruct}"
        print(f"{err}\n-> Using an offline {kind}checkpoint with random weights at {path}.\n", flush=True)
        if not (path / "config.json").is_file():  # config.json is written last
            build_starcoder2(path, chat_template=INSTRUCT_CHAT_TEMPLATE if instruct else None)
        return str(path)
    return model
