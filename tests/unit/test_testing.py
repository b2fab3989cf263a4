"""The offline checkpoint builder (:mod:`langchain_starcoder.testing`): mlx-lm's quantized layout, one
layer in memory however deep the model, and a build that cannot fit refused before it starts."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import pytest

from langchain_starcoder import StarCoderEngine, cli, testing
from langchain_starcoder.testing import build_starcoder2, weights

ROOT = Path(__file__).resolve().parents[2]


def tensors(path: Path) -> dict[str, mx.array]:
    out: dict[str, mx.array] = {}
    for file in sorted(path.glob("model*.safetensors")):
        out.update(mx.load(str(file)))
    return out


@pytest.mark.parametrize(("bits", "group_size"), [(4, 64), (8, 32), (4, 128)])
def test_a_quantized_build_is_what_mlx_lm_makes_of_the_float_one(tmp_path: Path, bits, group_size) -> None:
    """The float checkpoint of the same seed, quantized by mlx-lm the way mlx_lm.convert does it, gives the
    same tensors, config and index (group 128 leaves the 64-wide tiny layers' inputs unquantized)."""
    from mlx_lm.utils import quantize_model, save_model

    from langchain_starcoder.models.starcoder2 import Model, ModelArgs

    ours = build_starcoder2(tmp_path / "ours", num_layers=3, quantize=bits, group_size=group_size, seed=4)
    float_path = build_starcoder2(tmp_path / "float", num_layers=3, seed=4)
    config = json.loads((float_path / "config.json").read_text())
    model = Model(ModelArgs.from_dict(config))
    model.load_weights(list(tensors(float_path).items()))
    model.set_dtype(mx.float16)
    model, qconfig = quantize_model(model, config, group_size=group_size, bits=bits)
    save_model(tmp_path / "mlx-lm", model)

    expected, got = tensors(tmp_path / "mlx-lm"), tensors(ours)
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        assert got[name].dtype == value.dtype and mx.array_equal(got[name], value).item(), name
    ours_config = json.loads((ours / "config.json").read_text())
    assert ours_config["quantization"] == qconfig["quantization"] == ours_config["quantization_config"]
    index = json.loads((ours / "model.safetensors.index.json").read_text())
    assert index == json.loads((tmp_path / "mlx-lm" / "model.safetensors.index.json").read_text())
    engine = StarCoderEngine.load(ours)
    try:
        assert len(engine.backend.model.layers) == 3
        assert engine.generate("def f(x):", max_tokens=4).completion_tokens == 4
    finally:
        engine.close()


def test_sharded_and_16_bit_builds_load_as_written(tmp_path: Path) -> None:
    path = build_starcoder2(tmp_path / "sharded", dtype="bfloat16", max_shard_bytes=100_000)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files == sorted(p.name for p in path.glob("model-*.safetensors"))
    loaded = tensors(path)
    assert set(loaded) == set(index["weight_map"])
    assert {v.dtype for v in loaded.values()} == {mx.bfloat16}
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in loaded.values())


# Built in a child process each, so that its peak resident memory is its own: 4 and 8 layers of a shape
# whose layer is 42 MB in float32 (the old builder held every layer, twice: +350 MB for 4 more).
PEAK_RSS = """
import resource, sys
from langchain_starcoder import testing
testing.PRESETS["wide"] = dict(testing.PRESETS["small"], hidden_size=1024, num_attention_heads=8,
                               intermediate_size=4096)
quantize = None if sys.argv[3] == "none" else int(sys.argv[3])
testing.build_starcoder2(sys.argv[1], preset="wide", num_layers=int(sys.argv[2]), quantize=quantize)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
LAYER_BYTES = 4 * (2 * 1024 * 1024 + 2 * 256 * 1024 + 2 * 1024 * 4096)


@pytest.mark.parametrize("quantize", ["none", "4"])
def test_peak_memory_grows_with_one_layer_not_with_the_model(tmp_path: Path, quantize: str) -> None:
    peaks = {}
    for layers in (4, 8):
        result = subprocess.run(
            [sys.executable, "-c", PEAK_RSS, str(tmp_path / f"m{layers}"), str(layers), quantize],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        peaks[layers] = int(result.stdout.split()[-1]) * 1024  # ru_maxrss is in KiB on Linux
    assert json.loads((tmp_path / "m8" / "config.json").read_text())["num_hidden_layers"] == 8
    # Four more layers are 168 MB of float32 weights; the peak may move by noise, not by them.
    assert peaks[8] - peaks[4] < LAYER_BYTES, (peaks, LAYER_BYTES)


def test_the_plan_counts_every_byte_written(tmp_path: Path) -> None:
    path = build_starcoder2(tmp_path / "q", preset="small", quantize=4)
    plan = weights.plan_weights(
        lambda draw: testing._starcoder2_weights(json.loads((path / "config.json").read_text()), draw),
        "float32",
        weights.Quantization(4, 64),
        None,
    )
    header_bytes = (path / "model.safetensors").stat().st_size - plan.disk_bytes
    assert 0 < header_bytes < 20_000  # the rest of the file is exactly the planned tensors


def test_a_build_that_cannot_fit_in_memory_is_refused_up_front(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(weights, "available_memory", lambda: 900 * 10**6)
    started = time.perf_counter()
    code = cli.main(["build-test-model", str(tmp_path / "m"), "--preset", "15b", "--quantize", "4"])
    err = capsys.readouterr().err
    assert code == 1 and time.perf_counter() - started < 5  # before a single layer is drawn
    (line,) = err.strip().splitlines()
    assert "needs about 4.5 GB of memory" in line and "0.9 GB is available" in line
    assert "15b StarCoder2 checkpoint (40 layers, 4-bit)" in line
    assert list(tmp_path.iterdir()) == []  # no folder, no staging folder


def test_a_build_that_cannot_fit_on_disk_is_refused_up_front(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(weights, "free_disk", lambda path: 5 * 10**9)
    started = time.perf_counter()
    code = cli.main(["build-test-model", str(tmp_path / "m"), "--preset", "3b"])
    err = capsys.readouterr().err
    assert code == 1 and time.perf_counter() - started < 5
    (line,) = err.strip().splitlines()
    assert "writes 12.2 GB" in line and "has 5.0 GB free" in line and "--quantize 4" in line
    assert list(tmp_path.iterdir()) == []
    # Weights a rebuild replaces count as free: a folder's own old build is no reason to refuse.
    old = build_starcoder2(tmp_path / "again", preset="small")
    monkeypatch.setattr(weights, "free_disk", lambda path: 0)
    monkeypatch.setattr(weights, "_OTHER_FILES", 0)
    build_starcoder2(old, preset="small", seed=1)
    with pytest.raises(testing.ResourceError, match="writes"):
        build_starcoder2(old, preset="small", num_layers=4)
