"""Loading: quantization, dtypes, shards, the hub (mocked), and clear errors for bad checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from langchain_starcoder import (
    CheckpointError,
    InvalidParameterError,
    ModelNotFoundError,
    StarCoderEngine,
    StarCoderError,
    UnsupportedModelError,
)
from langchain_starcoder.testing import build_starcoder2, copy_checkpoint

IDS = np.random.default_rng(0).integers(40, 1024, size=48).tolist()


@pytest.fixture(scope="module")
def small_path(checkpoints: Path) -> Path:
    """Wide enough (hidden 256) for every quantization group size."""
    return build_starcoder2(checkpoints / "small", preset="small")


@pytest.fixture(scope="module")
def small_logits(small_path: Path) -> np.ndarray:
    engine = StarCoderEngine.load(small_path)
    try:
        return engine.logits(IDS)
    finally:
        engine.close()


def relative_error(engine: StarCoderEngine, reference: np.ndarray) -> float:
    logits = engine.logits(IDS)
    return float(np.linalg.norm(logits - reference) / np.linalg.norm(reference))


def quantized_layers(engine: StarCoderEngine) -> int:
    return sum(
        isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding)
        for _, m in engine.backend.model.named_modules()
    )


# Random Gaussian weights are the hardest case for quantization; measured relative logit errors on
# this checkpoint: 4-bit 0.21 / 0.25 / 0.26 and 8-bit 0.013 / 0.014 / 0.015 for groups 32 / 64 / 128.
BOUNDS = {4: 0.32, 8: 0.02}


@pytest.mark.parametrize("bits", [4, 8])
def test_quantize_on_load(small_path: Path, small_logits: np.ndarray, bits: int) -> None:
    errors = []
    for group_size in (32, 64, 128):
        engine = StarCoderEngine.load(small_path, quantize=bits, group_size=group_size)
        try:
            assert quantized_layers(engine) == 14  # 12 linears, the embedding and the head
            assert engine.backend.model.model.layers[0].mlp.c_fc.group_size == group_size
            # CPU policy: scales and biases computed in float32 (float16 is ~35x slower here)
            assert engine.backend.model.model.layers[0].mlp.c_fc.scales.dtype == mx.float32
            errors.append(relative_error(engine, small_logits))
        finally:
            engine.close()
    assert all(0 < e < BOUNDS[bits] for e in errors), errors
    assert errors[0] < errors[2]  # smaller groups are more precise


@pytest.mark.parametrize("bits", [4, 8])
def test_prequantized_checkpoint_loads_as_is(tmp_path: Path, small_logits: np.ndarray, bits: int) -> None:
    path = build_starcoder2(tmp_path / f"q{bits}", preset="small", quantize=bits)
    config = json.loads((path / "config.json").read_text())
    assert config["quantization"] == {"group_size": 64, "bits": bits, "mode": "affine"}
    engine = StarCoderEngine.load(path)
    try:
        assert quantized_layers(engine) == 14
        assert relative_error(engine, small_logits) < BOUNDS[bits]
        with pytest.raises(InvalidParameterError, match="already quantized"):
            StarCoderEngine.load(path, quantize=4)
    finally:
        engine.close()


@pytest.mark.parametrize(("dtype", "bound"), [("float16", 0.005), ("bfloat16", 0.02)])
def test_half_precision_checkpoints(
    tmp_path: Path, small_logits: np.ndarray, dtype: str, bound: float
) -> None:
    path = build_starcoder2(tmp_path / dtype, preset="small", dtype=dtype)
    auto = StarCoderEngine.load(path)
    kept = StarCoderEngine.load(path, dtype=dtype)
    try:
        assert auto.backend.model.model.norm.weight.dtype == mx.float32  # "auto" on the CPU
        assert kept.backend.model.model.norm.weight.dtype == getattr(mx, dtype)
        assert relative_error(auto, small_logits) < bound
        assert relative_error(kept, small_logits) < bound
    finally:
        auto.close()
        kept.close()


def test_sharded_checkpoint(tmp_path: Path, small_path: Path, small_logits: np.ndarray) -> None:
    path = build_starcoder2(tmp_path / "sharded", preset="small", max_shard_bytes=2_000_000)
    shards = sorted(p.name for p in path.glob("model-*.safetensors"))
    assert len(shards) > 2 and (path / "model.safetensors.index.json").is_file()
    engine = StarCoderEngine.load(path)
    try:
        assert np.array_equal(engine.logits(IDS), small_logits)
    finally:
        engine.close()
    (path / shards[1]).unlink()
    with pytest.raises(CheckpointError, match=shards[1]):
        StarCoderEngine.load(path)


# --- errors ----------------------------------------------------------------------------------


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="nowhere"):
        StarCoderEngine.load(tmp_path / "nowhere")


def test_other_architecture(tmp_path: Path, tiny_path: Path) -> None:
    path = copy_checkpoint(tiny_path, tmp_path / "llama")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(UnsupportedModelError, match="'llama'") as err:
        StarCoderEngine.load(path)
    assert str(path) in str(err.value)


def test_truncated_weights(tmp_path: Path, tiny_path: Path) -> None:
    path = copy_checkpoint(tiny_path, tmp_path / "truncated")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match="truncated or corrupted") as err:
        StarCoderEngine.load(path)
    assert str(weights) in str(err.value)


def test_garbage_weights(tmp_path: Path, tiny_path: Path) -> None:
    path = copy_checkpoint(tiny_path, tmp_path / "garbage")
    (path / "model.safetensors").write_bytes(b"\x00garbage" * 100)
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        StarCoderEngine.load(path)


@pytest.mark.parametrize("damage", ["folder", "symlink loop", "dangling symlink"])
def test_weights_that_are_not_files(tmp_path: Path, tiny_path: Path, damage: str) -> None:
    path = copy_checkpoint(tiny_path, tmp_path / "notfile")
    weights = path / "model.safetensors"
    weights.unlink()
    if damage == "folder":
        weights.mkdir()
    else:
        weights.symlink_to(weights if damage == "symlink loop" else path / "gone.safetensors")
    match = "is a folder" if damage == "folder" else "cannot be read"
    with pytest.raises(CheckpointError, match=match) as err:
        StarCoderEngine.load(path)
    assert str(weights) in str(err.value)


@pytest.fixture(scope="module")
def sharded_path(checkpoints: Path) -> Path:
    return build_starcoder2(checkpoints / "tiny-sharded", max_shard_bytes=200_000)


@pytest.mark.parametrize("damage", ["folder", "symlink loop"])
def test_shards_that_are_not_files(tmp_path: Path, sharded_path: Path, damage: str) -> None:
    path = copy_checkpoint(sharded_path, tmp_path / "shards")
    shard = sorted(path.glob("model-*.safetensors"))[1]
    shard.unlink()
    if damage == "folder":
        shard.mkdir()
    else:
        shard.symlink_to(shard)
    with pytest.raises(
        CheckpointError, match="is a folder" if damage == "folder" else "cannot be read"
    ) as err:
        StarCoderEngine.load(path)
    assert str(shard) in str(err.value)


@pytest.mark.parametrize(
    "index",
    [
        {"weight_map": ["model-00001-of-00002.safetensors"]},
        {"weight_map": {"model.norm.weight": 3}},
        {"metadata": {}},
        ["model-00001-of-00002.safetensors"],
    ],
    ids=["weight_map list", "file name not a string", "no weight_map", "index list"],
)
def test_damaged_shard_index(tmp_path: Path, sharded_path: Path, index: object) -> None:
    path = copy_checkpoint(sharded_path, tmp_path / "index")
    index_file = path / "model.safetensors.index.json"
    index_file.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="weight_map") as err:
        StarCoderEngine.load(path)
    assert str(index_file) in str(err.value)


def test_pickled_weights_are_refused(tmp_path: Path, tiny_path: Path) -> None:
    path = copy_checkpoint(tiny_path, tmp_path / "pickled")
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pickled"):
        StarCoderEngine.load(path)


def test_missing_tokenizer(tmp_path: Path, tiny_path: Path) -> None:
    path = copy_checkpoint(tiny_path, tmp_path / "notok")
    (path / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="no tokenizer"):
        StarCoderEngine.load(path)


def test_remote_code_is_never_run(tmp_path: Path, tiny_path: Path) -> None:
    path = copy_checkpoint(tiny_path, tmp_path / "remote")
    marker = tmp_path / "ran"
    (path / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_file": "evil.py"}))
    with pytest.raises(CheckpointError):
        StarCoderEngine.load(path)
    assert not marker.exists()


# --- the hub (mocked: nothing is downloaded in tests) ------------------------------------------


def test_hub_download_is_pinned_and_safetensors_only(tmp_path: Path, tiny_path: Path) -> None:
    snapshot = copy_checkpoint(tiny_path, tmp_path / "snapshot")
    with mock.patch("huggingface_hub.snapshot_download", return_value=str(snapshot)) as download:
        engine = StarCoderEngine.load("someone/starcoder2-tiny", revision="abc123")
    try:
        assert engine.generate("def f():", max_tokens=3).completion_tokens >= 1
    finally:
        engine.close()
    (args, kwargs) = download.call_args
    assert args == ("someone/starcoder2-tiny",)
    assert kwargs["revision"] == "abc123"
    assert "*.safetensors" in kwargs["allow_patterns"]
    assert not any(p.endswith((".bin", ".pt", ".pth", ".py")) for p in kwargs["allow_patterns"])


@pytest.mark.parametrize("error", ["offline", "missing", "halfway"])
def test_hub_failures_are_clear(error: str) -> None:
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

    raised = {
        "offline": LocalEntryNotFoundError("no connection"),
        "missing": RepositoryNotFoundError("404", response=mock.Mock(status_code=404, headers={})),
        "halfway": OSError("Connection reset by peer"),
    }[error]
    with (
        mock.patch("huggingface_hub.snapshot_download", side_effect=raised),
        pytest.raises(ModelNotFoundError, match="someone/model") as err,
    ):
        StarCoderEngine.load("someone/model")
    assert isinstance(err.value, StarCoderError)


def _hub_error(name: str) -> Exception:
    from huggingface_hub import errors

    response = mock.Mock(status_code=404, headers={})
    return {
        "revision": errors.RevisionNotFoundError("no such revision", response=response),
        "gated": errors.GatedRepoError("gated", response=response),
        "missing": errors.RepositoryNotFoundError("404", response=response),
        "invalid": errors.HFValidationError("bad id"),
        "offline": errors.LocalEntryNotFoundError("no connection"),
        "no file": errors.EntryNotFoundError("no such file"),
        "halfway": OSError("Connection reset by peer"),
    }[name]


@pytest.mark.parametrize(
    ("error", "says"),
    [
        ("revision", "no revision 'v9'"),
        ("gated", "is gated"),
        ("missing", "does not exist"),
        ("invalid", "nor a valid hub id"),
        ("offline", "cannot be reached"),
        ("halfway", "run again to resume"),
    ],
)
@pytest.mark.parametrize("kind", ["snapshot", "gguf file"])
def test_every_hub_failure_says_what_to_do_on_both_download_paths(error: str, says: str, kind: str) -> None:
    """One mapping serves the folder download and the GGUF file download; the hub's chained
    traceback is dropped (raised from None)."""
    target, call = {
        "snapshot": (
            "huggingface_hub.snapshot_download",
            lambda: StarCoderEngine.load("someone/model", revision="v9"),
        ),
        "gguf file": (
            "huggingface_hub.hf_hub_download",
            lambda: StarCoderEngine.load("someone/model", gguf_file="m.gguf", revision="v9"),
        ),
    }[kind]
    with (
        mock.patch(target, side_effect=_hub_error(error)),
        pytest.raises(ModelNotFoundError, match=says) as err,
    ):
        call()
    assert "someone/model" in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_a_missing_file_of_a_hub_repo_is_named() -> None:
    with (
        mock.patch("huggingface_hub.hf_hub_download", side_effect=_hub_error("no file")),
        pytest.raises(ModelNotFoundError, match=r"has no file 'm\.gguf'"),
    ):
        StarCoderEngine.load("someone/model", gguf_file="m.gguf")


def test_not_a_hub_id() -> None:
    with pytest.raises(ModelNotFoundError, match="not a hub id"):
        StarCoderEngine.load("./models/missing")


def test_tokenizer_encodes_as_its_tokenizer_json(tiny_engine: StarCoderEngine, tiny_path: Path) -> None:
    """Spaces before digits included: transformers' AutoTokenizer drops tokenizer.json's digit
    pre-tokenizer for StarCoder's GPT2Tokenizer class; the engine keeps the model's own."""
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(tiny_path / "tokenizer.json"))
    text = "x = [\n    1,\n    22,\n]  16\nfor i in range(10):\n    total += 3 * i  # 4 spaces\n"
    assert tiny_engine.encode(text) == reference.encode(text, add_special_tokens=False).ids
    assert tiny_engine.decode(tiny_engine.encode(text)) == text
