"""An mlx-lm adapter served by a real llama-server with ``--lora`` (the managed backend's child) over the
float32 base GGUF: its log-probs are MLX's with the adapter unfused and the fused model's GGUF on llama.cpp
(1e-4), its greedy tokens MLX's, and at scale 0 it is the base.

llama.cpp is run in float32 throughout (``-fa off -ctk f32 -ctv f32``: by default its CPU attention rounds
K, V and Q to float16, 1.5e-3 off MLX here), and MLX is given ggml's GELU, a table of float16 inputs to
float16 outputs: measured, the two then agree within 1e-5 on the base."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.backends.managed_llama import LlamaServerProcess
from langchain_starcoder.errors import InvalidParameterError
from langchain_starcoder.finetune.export import fuse_adapter, to_gguf_lora
from langchain_starcoder.gguf_format import convert_to_gguf, llama_binary
from langchain_starcoder.loading import load_model
from langchain_starcoder.loading.adapter import apply_adapter, read_adapter
from langchain_starcoder.testing.adapters import build_adapter

PROMPTS = ([5, 17, 300, 42, 901, 7], list(range(100, 160)), [3, 3, 3, 800, 801])
VOCAB = 1024  # the tiny preset's: every token's log-prob comes back
FLOAT32 = ("-fa", "off", "-ctk", "f32", "-ctv", "f32")


@pytest.fixture(scope="module")
def files(clean_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The base and the adapter's fused model as float32 GGUF files, the adapter and its GGUF file."""
    root = tmp_path_factory.mktemp("lora-llama")
    # strong enough to move log-probs by ~0.5-0.9: stronger ones sometimes tip a GELU input to the next
    # float16 in ggml's table, one value ~1e-4 off (measured: at most 4e-4 with moves of 3-5)
    adapter = build_adapter(clean_path, root / "adapter", rank=4, scale=2.0, strength=0.05)
    fused = fuse_adapter(clean_path, adapter, root / "fused")
    return {
        "adapter": adapter,
        "base": convert_to_gguf(clean_path, root / "base.gguf", outtype="f32"),
        "fused": convert_to_gguf(fused, root / "fused.gguf", outtype="f32"),
        "lora": to_gguf_lora(adapter, root / "adapter.gguf", base=root / "base.gguf"),
    }


def _server(gguf: Path, lora: tuple[Path, ...] = ()) -> LlamaServerProcess:
    server = LlamaServerProcess(
        llama_binary("llama-server"),
        gguf,
        alias="tiny",
        threads=2,
        slots=1,
        context=2048,
        server_args=FLOAT32,
        startup_timeout=120,
        lora=lora,
    )
    server.start()
    return server


@pytest.fixture(scope="module")
def servers(files: dict[str, Path]) -> Iterator[dict[str, LlamaServerProcess]]:
    started: dict[str, LlamaServerProcess] = {}
    try:
        started["base"] = _server(files["base"])
        started["fused"] = _server(files["fused"])
        started["lora"] = _server(files["base"], (files["lora"],))
        yield started
    finally:
        for server in started.values():
            server.stop()


def _post(server: LlamaServerProcess, body: dict) -> dict:
    headers = {"Authorization": f"Bearer {server.api_key}"}
    response = httpx.post(f"{server.url}/completion", json=body, headers=headers, timeout=60)
    response.raise_for_status()
    return response.json()


def llama_logprobs(server: LlamaServerProcess, ids: list[int], **more: object) -> np.ndarray:
    """llama.cpp's log-probabilities of every next token after ``ids`` (from its raw logits)."""
    body = {"prompt": ids, "n_predict": 1, "n_probs": VOCAB, "temperature": 0, "cache_prompt": False}
    top = _post(server, {**body, "post_sampling_probs": False, **more})["completion_probabilities"][0]
    out = np.full(VOCAB, np.nan)
    for entry in top["top_logprobs"]:
        out[entry["id"]] = entry["logprob"]
    assert not np.isnan(out).any()
    return out


def ggml_gelu(x: mx.array) -> mx.array:
    """ggml's CPU GELU: the tanh form looked up for x rounded to float16, the result a float16."""
    return nn.gelu_approx(x.astype(mx.float16).astype(mx.float32)).astype(mx.float16).astype(mx.float32)


def mlx_model(model: Path, adapter: Path | None = None) -> object:
    """The float32 MLX model (with the adapter unfused), its GELU ggml's."""
    loaded = load_model(model, quantize=None, group_size=64, dtype="float32")
    if adapter is not None:
        apply_adapter(loaded.model, loaded.args, read_adapter(adapter), str(model))
    for layer in loaded.model.model.layers:
        layer.mlp.act = ggml_gelu
    return loaded.model


def mlx_logprobs(model: object, ids: list[int]) -> np.ndarray:
    logits = np.array(model(mx.array([ids]))[0, -1], dtype=np.float64)  # type: ignore[operator]
    return logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())


def test_llama_cpp_with_the_gguf_adapter_is_mlx_unfused_and_fused(
    clean_path: Path, files: dict[str, Path], servers: dict[str, LlamaServerProcess]
) -> None:
    adapted, base = mlx_model(clean_path, files["adapter"]), mlx_model(clean_path)
    for ids in PROMPTS:
        got = llama_logprobs(servers["lora"], ids)
        np.testing.assert_allclose(llama_logprobs(servers["base"], ids), mlx_logprobs(base, ids), atol=1e-4)
        assert np.abs(got - llama_logprobs(servers["base"], ids)).max() > 0.3  # the adapter acts
        np.testing.assert_allclose(got, mlx_logprobs(adapted, ids), atol=1e-4)
        np.testing.assert_allclose(got, llama_logprobs(servers["fused"], ids), atol=1e-4)


def test_llama_cpp_with_the_adapter_decodes_as_mlx_does(
    clean_path: Path, files: dict[str, Path], servers: dict[str, LlamaServerProcess]
) -> None:
    adapted = mlx_model(clean_path, files["adapter"])
    for ids in PROMPTS[:2]:
        want = list(ids)
        for _ in range(16):
            want.append(int(np.argmax(mlx_logprobs(adapted, want))))
        body = {
            "prompt": ids,
            "n_predict": 16,
            "temperature": 0,
            "return_tokens": True,
            "cache_prompt": False,
        }
        assert _post(servers["lora"], body)["tokens"] == want[len(ids) :]


def test_the_adapter_at_scale_zero_is_the_base(servers: dict[str, LlamaServerProcess]) -> None:
    for ids in PROMPTS:
        off = llama_logprobs(servers["lora"], ids, lora=[{"id": 0, "scale": 0.0}])
        np.testing.assert_allclose(off, llama_logprobs(servers["base"], ids), atol=1e-6)


def test_the_llama_cpp_engine_runs_the_adapter_with_lora_over_the_base(
    clean_path: Path, files: dict[str, Path], servers: dict[str, LlamaServerProcess], tmp_path: Path
) -> None:
    """``load(backend="llama.cpp", adapter_path=)``: the base GGUF with the adapter's GGUF by ``--lora``
    (converted once, by digest), decoding as the fused model's server does; DoRA is refused by name."""
    engine = StarCoderEngine.load(
        clean_path,
        backend="llama.cpp",
        adapter_path=files["adapter"],
        outtype="f32",
        server_args=FLOAT32,
        cache_dir=tmp_path,
        slots=1,
    )
    try:
        args = engine.backend.server.proc.args
        lora = Path(args[args.index("--lora") + 1])
        assert lora.parent == tmp_path and engine.adapter.digest in lora.name
        for ids in PROMPTS[:2]:
            body = {"prompt": ids, "n_predict": 12, "temperature": 0, "return_tokens": True}
            want = _post(servers["fused"], {**body, "cache_prompt": False})["tokens"]
            assert engine.generate(ids, max_tokens=12).token_ids == want
    finally:
        engine.close()
    dora = build_adapter(clean_path, tmp_path / "dora", method="dora", rank=4)
    with pytest.raises(InvalidParameterError, match="--fused"):
        StarCoderEngine.load(clean_path, backend="llama.cpp", adapter_path=dora, cache_dir=tmp_path)
