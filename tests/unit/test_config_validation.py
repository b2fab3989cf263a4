"""Damaged config.json files: one clear error each, before the tokenizer or the model is loaded.

Every case damages a copy of a real small checkpoint's config.json and loads it through the public
``StarCoderEngine.load``; the error must be a StarCoderError that names the file, the key and the value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import transformers

from langchain_starcoder import CheckpointError, StarCoderEngine, UnsupportedModelError
from langchain_starcoder.testing import build_starcoder2, copy_checkpoint

DELETE = object()  # a value in a change: remove the key


def damaged(src: Path, dst: Path, change: dict[str, Any] | Any) -> Path:
    """A copy of ``src`` whose config.json is updated with ``change`` (or replaced by a non-dict)."""
    path = copy_checkpoint(src, dst)
    config = json.loads((path / "config.json").read_text())
    if isinstance(change, dict):
        config = {k: v for k, v in {**config, **change}.items() if v is not DELETE}
    else:
        config = change
    (path / "config.json").write_text(json.dumps(config))
    return path


# (change to the tiny checkpoint's config, what the message must name); all CheckpointError.
# The tiny checkpoint: hidden 64, 2 layers, 4 heads, 2 KV heads, intermediate 256, vocab 1024.
BAD_VALUES = {
    "missing size": ({"hidden_size": DELETE}, ["'hidden_size'"]),
    "size as string": ({"hidden_size": "64"}, ["hidden_size", "'64'"]),
    "zero heads": ({"num_attention_heads": 0}, ["num_attention_heads", " 0"]),
    "fractional layers": ({"num_hidden_layers": 2.5}, ["num_hidden_layers", "2.5"]),
    "bool kv heads": ({"num_key_value_heads": True}, ["num_key_value_heads", "True"]),
    "negative intermediate": ({"intermediate_size": -256}, ["intermediate_size", "-256"]),
    "absurd vocab": ({"vocab_size": 10**12}, ["vocab_size", "1000000000000"]),
    "null vocab": ({"vocab_size": None}, ["vocab_size", "None"]),
    "zero context": ({"max_position_embeddings": 0}, ["max_position_embeddings", " 0"]),
    "negative context": ({"max_position_embeddings": -1}, ["max_position_embeddings", "-1"]),
    "zero window": ({"sliding_window": 0}, ["sliding_window", " 0"]),
    "string window": ({"sliding_window": "512"}, ["sliding_window", "'512'"]),
    "zero rope_theta": ({"rope_theta": 0}, ["rope_theta", " 0"]),
    "string rope_theta": ({"rope_theta": "1e4"}, ["rope_theta", "'1e4'"]),
    "negative nested rope_theta": (
        {"rope_parameters": {"rope_type": "default", "rope_theta": -5.0}},
        ["rope_parameters.rope_theta", "-5.0"],
    ),
    "rope_parameters list": ({"rope_parameters": [10000.0]}, ["rope_parameters", "[10000.0]"]),
    "zero eps": ({"norm_epsilon": 0.0}, ["norm_epsilon", "0.0"]),
    "int eps": ({"norm_epsilon": 1}, ["norm_epsilon", " 1,", "float"]),  # transformers refuses it too
    "NaN eps": ({"norm_epsilon": float("nan")}, ["norm_epsilon", "nan"]),
    "hidden_act not a string": ({"hidden_act": ["gelu"]}, ["hidden_act", "['gelu']"]),
    "string use_bias": ({"use_bias": "yes"}, ["use_bias", "'yes'"]),
    "string eos": ({"eos_token_id": "0"}, ["eos_token_id", "'0'"]),
    "negative eos in list": ({"eos_token_id": [0, -1]}, ["eos_token_id", "[0, -1]"]),
    "eos past the vocabulary": (
        {"eos_token_id": 1024},
        ["eos_token_id", "1024", "vocabulary has 1024 tokens"],
    ),
    "eos in list past the vocabulary": (
        {"eos_token_id": [0, 5000]},
        ["eos_token_id", "[0, 5000]", "1024 tokens"],
    ),
    "quantization string": ({"quantization": "4bit"}, ["quantization", "'4bit'"]),
    "quantization no bits": ({"quantization": {"group_size": 64}}, ["quantization", "bits"]),
    "heads do not divide hidden": ({"num_attention_heads": 5}, ["num_attention_heads 5", "hidden_size 64"]),
    "kv heads do not divide heads": ({"num_key_value_heads": 3}, ["num_key_value_heads 3"]),
}


@pytest.mark.parametrize(("change", "names"), BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_bad_config_values(tmp_path: Path, tiny_path: Path, change: dict, names: list[str]) -> None:
    path = damaged(tiny_path, tmp_path / "bad", change)
    with pytest.raises(CheckpointError) as err:
        StarCoderEngine.load(path)
    message = str(err.value)
    assert str(path / "config.json") in message
    assert all(name in message for name in names), message
    assert "tokenizer" not in message  # refused as a config error, before the tokenizer loads
    assert "Fix config.json" in message


@pytest.mark.parametrize("config", [[1, 2], None, "starcoder2", 7], ids=["list", "null", "string", "number"])
def test_config_that_is_not_an_object(tmp_path: Path, tiny_path: Path, config: Any) -> None:
    path = damaged(tiny_path, tmp_path / "notdict", config)
    with pytest.raises(CheckpointError, match="not a JSON object") as err:
        StarCoderEngine.load(path)
    assert str(path / "config.json") in str(err.value)


@pytest.mark.parametrize(
    ("change", "name"),
    [
        ({"hidden_act": "swish"}, "'swish'"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "'yarn'"),
    ],
    ids=["swish", "yarn"],
)
def test_unsupported_settings(tmp_path: Path, tiny_path: Path, change: dict, name: str) -> None:
    path = damaged(tiny_path, tmp_path / "unsupported", change)
    with pytest.raises(UnsupportedModelError) as err:
        StarCoderEngine.load(path)
    assert name in str(err.value)
    assert str(path / "config.json") in str(err.value)


@pytest.mark.skipif(
    int(transformers.__version__.split(".")[0]) < 5, reason="transformers 5 type-checks configs"
)
@pytest.mark.parametrize(
    ("change", "key"),
    [({"initializer_range": "x"}, "initializer_range"), ({"bos_token_id": "0"}, "bos_token_id")],
)
def test_keys_only_transformers_checks_blame_the_config(
    tmp_path: Path, tiny_path: Path, change: dict, key: str
) -> None:
    # Keys the model does not use. With a tokenizer.json the tokenizer is loaded as it is, and they
    # are never read; with only vocab.json and merges.txt, transformers builds the tokenizer from
    # the config and type-checks them: the error then names config.json, not the tokenizer.
    from tokenizers import Tokenizer

    path = damaged(tiny_path, tmp_path / "hfconfig", change)
    engine = StarCoderEngine.load(path)
    assert engine.generate("def f():", max_tokens=2).completion_tokens == 2
    engine.close()
    Tokenizer.from_file(str(path / "tokenizer.json")).model.save(str(path))  # vocab.json, merges.txt
    (path / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError) as err:
        StarCoderEngine.load(path)
    assert str(path / "config.json") in str(err.value) and key in str(err.value)
    assert "Could not load the tokenizer" not in str(err.value)


# --- config.json against the safetensors headers, before the model is built ---------------------------


@pytest.mark.parametrize("layers", [10**5, 2**31 - 1])
def test_absurd_layer_count_fails_before_the_model_is_built(
    tmp_path: Path, tiny_path: Path, layers: int
) -> None:
    # Building 1e5 layers first took 50 s and 7 GB before failing; the headers say 2 layers.
    path = damaged(tiny_path, tmp_path / "layers", {"num_hidden_layers": layers})
    with pytest.raises(CheckpointError, match=f"num_hidden_layers is {layers}") as err:
        StarCoderEngine.load(path)
    assert "layers 0 to 1 (2 in all)" in str(err.value)
    assert str(path / "config.json") in str(err.value)


MISMATCHES = {
    "more layers": ({"num_hidden_layers": 3}, ["num_hidden_layers is 3", "2 in all"]),
    "fewer layers": ({"num_hidden_layers": 1}, ["num_hidden_layers is 1", "2 in all"]),
    "vocab": (
        {"vocab_size": 2048},
        ["model.embed_tokens.weight", "[1024, 64]", "[2048, 64]", "vocab_size 2048"],
    ),
    "hidden": ({"hidden_size": 128}, ["[1024, 64]", "[1024, 128]", "hidden_size 128"]),
    "kv heads": (
        {"num_key_value_heads": 4},
        ["k_proj.weight", "[32, 64]", "[64, 64]", "num_key_value_heads 4"],
    ),
    "intermediate": ({"intermediate_size": 128}, ["mlp.c_fc.weight", "[256, 64]", "intermediate_size 128"]),
}


@pytest.mark.parametrize(("change", "names"), MISMATCHES.values(), ids=MISMATCHES.keys())
def test_config_must_match_the_weights(
    tmp_path: Path, tiny_path: Path, change: dict, names: list[str]
) -> None:
    path = damaged(tiny_path, tmp_path / "mismatch", change)
    with pytest.raises(CheckpointError, match="does not belong to these weights") as err:
        StarCoderEngine.load(path)
    assert all(name in str(err.value) for name in names), str(err.value)


@pytest.fixture(scope="module")
def quantized_path(checkpoints: Path) -> Path:
    """mlx-community layout: packed uint32 weights, float16 scales and biases."""
    return build_starcoder2(checkpoints / "tiny-q4", quantize=4)


def test_quantized_checkpoint_still_loads(quantized_path: Path) -> None:
    engine = StarCoderEngine.load(quantized_path)
    try:
        assert engine.generate("def f():", max_tokens=2).completion_tokens == 2
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"num_hidden_layers": 10**5}, ["num_hidden_layers is 100000"]),
        ({"vocab_size": 2048}, ["model.embed_tokens.weight", "vocab_size 2048"]),  # packed: rows compared
        ({"hidden_size": 128}, ["model.norm.weight", "[64]", "[128]"]),  # found in unpacked norms
        ({"intermediate_size": 128}, ["mlp.c_fc.weight", "intermediate_size 128"]),
    ],
    ids=["layers", "vocab", "hidden", "intermediate"],
)
def test_quantized_config_must_match_the_weights(
    tmp_path: Path, quantized_path: Path, change: dict, names: list[str]
) -> None:
    path = damaged(quantized_path, tmp_path / "qmismatch", change)
    with pytest.raises(CheckpointError) as err:
        StarCoderEngine.load(path)
    assert all(name in str(err.value) for name in names), str(err.value)


def test_a_good_checkpoint_loads_after_failed_ones(tmp_path: Path, tiny_path: Path) -> None:
    # One failure in read_config (before the worker starts), one in load_model (on the worker).
    for i, change in enumerate(({"hidden_size": "64"}, {"num_hidden_layers": 10**5})):
        with pytest.raises(CheckpointError):
            StarCoderEngine.load(damaged(tiny_path, tmp_path / f"bad{i}", change))
    engine = StarCoderEngine.load(tiny_path)
    try:
        assert engine.generate("def f():", max_tokens=3).completion_tokens == 3
    finally:
        engine.close()


def test_tensor_the_config_needs_is_missing(tmp_path: Path) -> None:
    # A tied checkpoint has no lm_head; a config that unties it asks for one.
    tied = build_starcoder2(tmp_path / "tied", tie_word_embeddings=True)
    path = damaged(tied, tmp_path / "untied", {"tie_word_embeddings": False})
    with pytest.raises(CheckpointError, match=r"have no lm_head\.weight") as err:
        StarCoderEngine.load(path)
    assert str(path / "config.json") in str(err.value)
