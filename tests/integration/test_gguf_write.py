"""Checkpoint folders -> GGUF files (``gguf_format.write``, ``langchain-starcoder convert DIR out.gguf``):
llama.cpp's layout for both families, checked by loading the file in our own GGUF loader (logits equal
to the source's) and in a real ``llama-server`` (greedy tokens equal to the local MLX engine's), in
bounded memory (one tensor at a time)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import clean_copy
from test_remote import GREEDY, PROMPTS

from langchain_starcoder import StarCoderEngine, cli
from langchain_starcoder.errors import CheckpointError, InvalidParameterError
from langchain_starcoder.gguf_format import convert_to_gguf, read_header, write_gguf
from langchain_starcoder.testing import PRESETS, build_gpt_bigcode, build_starcoder2
from langchain_starcoder.testing.gguf import LlamaServer

IDS = [5, 17, 300, 42, 99, 7, 512, 3, 64, 250, 11, 800]


def _types(path: Path) -> dict[str, str]:
    return {name: t.type_name for name, t in read_header(path).tensors.items()}


def _logits(path: Path | str, **load: object) -> np.ndarray:
    engine = StarCoderEngine.load(path, **load)
    try:
        return engine.logits(IDS)
    finally:
        engine.close()


@pytest.mark.parametrize("family", ["starcoder2", "gpt_bigcode"])
def test_f32_file_loads_with_the_sources_logits(family: str, tmp_path: Path) -> None:
    build = build_starcoder2 if family == "starcoder2" else build_gpt_bigcode
    src = build(tmp_path / family)
    out = convert_to_gguf(src, tmp_path / f"{family}.gguf", outtype="f32")
    types = _types(out)
    assert set(types.values()) == {"F32"}
    arch = "starcoder2" if family == "starcoder2" else "starcoder"
    assert read_header(out).metadata["general.architecture"] == arch
    np.testing.assert_allclose(_logits(out), _logits(src), atol=1e-5)


def test_outtypes_type_two_d_weights_only(tmp_path: Path) -> None:
    src = build_starcoder2(tmp_path / "tiny")
    want = {"f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0"}
    for outtype, kind in want.items():
        types = _types(convert_to_gguf(src, tmp_path / f"{outtype}.gguf", outtype=outtype))
        assert {t for n, t in types.items() if n.endswith(".bias") or "norm" in n} == {"F32"}
        assert {t for n, t in types.items() if n.endswith(".weight") and "norm" not in n} == {kind}
    # Our loader keeps Q8_0 and Q4_0 quantized: logits near the float32 source's, fewer bits further off.
    ref = _logits(src)
    error = {t: float(np.abs(_logits(tmp_path / f"{t}.gguf") - ref).max()) for t in want}
    assert error["f16"] < 0.01 and error["q8_0"] < 0.1
    assert error["f16"] < error["q8_0"] < error["q4_0"] < 1.0


def test_mlx_quantized_and_bfloat16_checkpoints_are_read(tmp_path: Path) -> None:
    quantized = build_starcoder2(tmp_path / "q4", preset="small", quantize=4)
    out = convert_to_gguf(quantized, tmp_path / "q4.gguf", outtype="f32")
    # Dequantized exactly: the same function the MLX model computes (float32 compute).
    np.testing.assert_allclose(_logits(out), _logits(quantized), atol=2e-4)
    bf16 = build_starcoder2(tmp_path / "bf16", dtype="bfloat16")
    np.testing.assert_allclose(
        _logits(convert_to_gguf(bf16, tmp_path / "bf16.gguf", outtype="f32")), _logits(bf16), atol=1e-5
    )


def test_sliding_window_is_recorded_for_our_loader(tmp_path: Path) -> None:
    src = build_starcoder2(tmp_path / "w16", sliding_window=16)
    out = convert_to_gguf(src, tmp_path / "w16.gguf", outtype="f32")
    assert read_header(out).metadata["starcoder2.attention.sliding_window"] == 16
    engine = StarCoderEngine.load(out)
    assert engine.sliding_window == 16
    engine.close()


def test_peak_memory_is_about_one_tensor(tmp_path: Path) -> None:
    """40 layers of 4 MiB tensors: writing holds one tensor (and its encoding), not the 170 MiB model."""
    src = build_starcoder2(tmp_path / "deep", preset="small", num_layers=40)
    model_bytes = sum(f.stat().st_size for f in src.glob("*.safetensors"))
    tracemalloc.start()
    try:
        write_gguf(src, tmp_path / "deep.gguf", ftype="F16")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    largest = max(int(np.prod(t.shape)) * 4 for t in read_header(tmp_path / "deep.gguf").tensors.values())
    assert model_bytes > 100 * 2**20
    assert peak < 4 * largest + (8 << 20), (peak, largest, model_bytes)


def test_mlx_quantized_weights_are_dequantized_a_few_rows_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 4-bit checkpoint with 64 MiB (float32) MLP weights written F16: about the one F16 tensor being
    written, not the four float32 temporaries a whole-tensor unpacking makes."""
    wide = {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
    }
    monkeypatch.setitem(PRESETS, "wide-mlp", {**PRESETS["small"], **wide})
    src = build_starcoder2(tmp_path / "q4", preset="wide-mlp", num_layers=1, quantize=4)
    tracemalloc.start()
    try:
        write_gguf(src, tmp_path / "q4.gguf", ftype="F16")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    largest = 2048 * 8192 * 4
    assert peak < largest * 3 // 4 + (24 << 20), (peak, largest)


def test_bad_input_is_refused_clearly(tmp_path: Path) -> None:
    src = build_starcoder2(tmp_path / "tiny")
    with pytest.raises(InvalidParameterError, match="f32, f16, q8_0, q4_0"):
        convert_to_gguf(src, tmp_path / "x.gguf", outtype="q5_k")
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        convert_to_gguf(tmp_path / "nowhere", tmp_path / "x.gguf", outtype="f16")
    (src / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(CheckpointError):
        convert_to_gguf(src, tmp_path / "x.gguf", outtype="f16")
    assert not (tmp_path / "x.gguf").exists()
    multi_head = build_gpt_bigcode(tmp_path / "mha", multi_query=False)
    with pytest.raises(CheckpointError, match="one KV head"):
        convert_to_gguf(multi_head, tmp_path / "mha.gguf", outtype="f16")


def test_cli_convert_writes_gguf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = build_starcoder2(tmp_path / "tiny")
    assert cli.main(["convert", str(src), str(tmp_path / "tiny.gguf"), "--outtype", "q8_0"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "tiny.gguf")
    assert gguf.GGUFReader(tmp_path / "tiny.gguf").get_tensor(0).tensor_type.name in {"Q8_0", "F32"}
    assert cli.main(["convert", str(src), str(tmp_path / "bad.gguf"), "--outtype", "q3"]) != 0


@pytest.mark.parametrize("family", ["starcoder2", "gpt_bigcode"])
def test_llama_server_greedy_equals_the_source(
    family: str,
    clean_path: Path,
    tmp_path: Path,
) -> None:
    """The written file served by a real llama-server: greedy tokens equal to the local MLX engine's."""
    if family == "starcoder2":
        src, local = clean_path, StarCoderEngine.load(clean_path)
    else:
        raw = StarCoderEngine.load(build_gpt_bigcode(tmp_path / "v1"))
        src = clean_copy(raw.path, tmp_path / "v1-clean")
        raw.close()
        local = StarCoderEngine.load(src)
    out = convert_to_gguf(src, tmp_path / f"{family}.gguf", outtype="f32")
    with LlamaServer(out) as server:
        remote = StarCoderEngine.connect(server.url, model="tiny", tokenizer=src, timeout=30)
        try:
            settings = GREEDY if family == "starcoder2" else {**GREEDY, "max_tokens": 8}
            for prompt in PROMPTS[:2]:
                got, want = remote.generate(prompt, **settings), local.generate(prompt, **settings)
                assert got.token_ids == want.token_ids
        finally:
            remote.close()
            local.close()
