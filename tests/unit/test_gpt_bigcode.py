"""StarCoder (v1, GPTBigCode) against the reference: transformers' GPTBigCodeForCausalLM, float32, CPU.

Multi-query (StarCoder's one key/value head) and multi-head (``multi_query`` false) checkpoints, with
``n_inner`` null, through the public engine; plus checkpoints written by transformers itself, config
checks, and the context limit of learned positions.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import torch
from mlx_lm.models.cache import make_prompt_cache
from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM

from langchain_starcoder import (
    CheckpointError,
    ContextLengthError,
    StarCoderEngine,
    UnsupportedModelError,
)
from langchain_starcoder.testing import build_gpt_bigcode, copy_checkpoint

TOLERANCE = 1e-4
VARIANTS = {"multi_query": True, "multi_head": False}


def prompt_ids(n: int, seed: int = 0, vocab: int = 1024) -> list[int]:
    # Ordinary (non-special) tokens, so that the prompt is like text.
    return np.random.default_rng(seed).integers(40, vocab, size=n).tolist()


def reference(path: Path) -> GPTBigCodeForCausalLM:
    return GPTBigCodeForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def reference_logits(path: Path, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return reference(path)(torch.tensor([ids])).logits[0].numpy()


def assert_matches_transformers(path: Path, seed: int) -> None:
    """The checkpoint's logits on a 100-token prompt are within TOLERANCE of transformers'."""
    engine = StarCoderEngine.load(path)
    try:
        ids = prompt_ids(100, seed=seed)
        assert np.abs(engine.logits(ids) - reference_logits(path, ids)).max() < TOLERANCE
    finally:
        engine.close()


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def bigcode(request: pytest.FixtureRequest, checkpoints: Path) -> tuple[Path, StarCoderEngine]:
    """A tiny GPTBigCode checkpoint (n_inner null) and an engine on it."""
    path = build_gpt_bigcode(checkpoints / f"bigcode-{request.param}", multi_query=VARIANTS[request.param])
    assert json.loads((path / "config.json").read_text())["n_inner"] is None
    engine = StarCoderEngine.load(path)
    yield path, engine
    engine.close()


def test_logits_match_transformers(bigcode: tuple[Path, StarCoderEngine]) -> None:
    path, engine = bigcode
    ids = prompt_ids(100)
    ours, ref = engine.logits(ids), reference_logits(path, ids)
    assert ours.shape == ref.shape == (100, 1024)
    assert np.abs(ours - ref).max() < TOLERANCE


def test_kv_cache_matches_transformers(bigcode: tuple[Path, StarCoderEngine]) -> None:
    """Prefill 40 tokens, then one at a time: positions continue from the cache's offset."""
    path, engine = bigcode
    ids = prompt_ids(100, seed=3)

    def stepwise() -> np.ndarray:
        model = engine.backend.model
        cache = make_prompt_cache(model)
        rows = [model(mx.array(ids[:40])[None], cache=cache)[0]]
        rows += [model(mx.array([t])[None], cache=cache)[0] for t in ids[40:]]
        return np.array(mx.concatenate(rows).astype(mx.float32))

    assert np.abs(engine.backend.call(stepwise) - reference_logits(path, ids)).max() < TOLERANCE


def test_greedy_generation_matches_transformers(bigcode: tuple[Path, StarCoderEngine]) -> None:
    path, engine = bigcode
    ids = prompt_ids(100, seed=5)
    with torch.no_grad():
        out = reference(path).generate(
            torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    ref = out[0, len(ids) :].tolist()
    engine.clear_cache()
    fresh = engine.generate(ids, max_tokens=32)
    assert fresh.completion_tokens == 32 and fresh.token_ids == ref
    again = engine.generate(ids, max_tokens=32)  # from the prompt cache
    assert again.cached_tokens == len(ids) - 1 and again.token_ids == ref


def test_stock_mlx_lm_module_is_off(bigcode: tuple[Path, StarCoderEngine], tmp_path: Path) -> None:
    """Why this package ships its own GPTBigCode: mlx-lm 0.32's cannot build ``n_inner`` null, and
    with it set it runs erf GELU (and splits a multi-head ``c_attn`` wrongly)."""
    from mlx_lm.utils import load_model

    path, _ = bigcode
    with pytest.raises(TypeError):
        load_model(path)
    config = json.loads((path / "config.json").read_text())
    fixed = copy_checkpoint(path, tmp_path / "n_inner")
    (fixed / "config.json").write_text(json.dumps({**config, "n_inner": 4 * config["n_embd"]}))
    stock, _ = load_model(fixed)
    ids = prompt_ids(100)
    stock_logits = np.array(stock(mx.array(ids)[None])[0])
    assert np.abs(stock_logits - reference_logits(path, ids)).max() > 10 * TOLERANCE


@pytest.mark.parametrize("multi_query", [True, False], ids=["multi_query", "multi_head"])
def test_checkpoint_saved_by_transformers(tmp_path: Path, multi_query: bool) -> None:
    """transformers' own layout (tied ``lm_head``, its buffers, its config keys), initializer 0.1."""
    config = GPTBigCodeConfig(
        vocab_size=1024,
        n_positions=256,
        n_embd=64,
        n_layer=3,
        n_head=4,
        n_inner=None,
        multi_query=multi_query,
        initializer_range=0.1,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = GPTBigCodeForCausalLM(config).eval()
    model.save_pretrained(tmp_path, safe_serialization=True)
    tokenizer = build_gpt_bigcode(tmp_path / "tok")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer / name, tmp_path / name)
    engine = StarCoderEngine.load(tmp_path)
    try:
        assert engine.context_window == 256
        ids = prompt_ids(100, seed=11)
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0].numpy()
        assert np.abs(engine.logits(ids) - ref).max() < TOLERANCE
    finally:
        engine.close()


def test_context_window_is_n_positions(tmp_path: Path) -> None:
    """Learned positions end at ``n_positions``: a request past it is refused before any compute."""
    engine = StarCoderEngine.load(build_gpt_bigcode(tmp_path / "short", n_positions=64))
    try:
        assert engine.context_window == 64
        with pytest.raises(ContextLengthError, match=r"60.*8.*64"):
            engine.generate(prompt_ids(60), max_tokens=8)
        assert engine.generate(prompt_ids(56), max_tokens=8).completion_tokens <= 8
        # A batch whose rows each end at the last position, and one that would pass it.
        rows = [prompt_ids(56, seed=1), prompt_ids(40, seed=2)]
        batch = engine.generate_batch(rows, max_tokens=8)
        assert [b.token_ids for b in batch] == [engine.generate(r, max_tokens=8).token_ids for r in rows]
        with pytest.raises(ContextLengthError):
            engine.generate_batch([*rows, prompt_ids(57)], max_tokens=8)
        model = engine.backend.model
        with pytest.raises(ValueError, match="n_positions"):  # a direct call past the table
            engine.backend.call(lambda: model(mx.array(prompt_ids(65))[None]))
    finally:
        engine.close()


BAD_CONFIGS = {
    "missing n_embd": ({"n_embd": None}, CheckpointError, "n_embd"),
    "heads do not divide n_embd": ({"n_head": 5}, CheckpointError, "n_head 5"),
    "string n_inner": ({"n_inner": "256"}, CheckpointError, "n_inner"),
    "zero n_positions": ({"n_positions": 0}, CheckpointError, "n_positions"),
    "string multi_query": ({"multi_query": "yes"}, CheckpointError, "multi_query"),
    "cross attention": ({"add_cross_attention": True}, CheckpointError, "add_cross_attention"),
    "unknown activation": ({"activation_function": "swish"}, UnsupportedModelError, "swish"),
    "layers do not match the weights": ({"n_layer": 3}, CheckpointError, "n_layer is 3"),
    "n_inner does not match the weights": ({"n_inner": 128}, CheckpointError, "mlp.c_fc"),
    "multi-head config on multi-query weights": ({"multi_query": False}, CheckpointError, "c_attn"),
}


@pytest.mark.parametrize(("change", "error", "names"), BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_bad_configs(
    tmp_path: Path, checkpoints: Path, change: dict, error: type[Exception], names: str
) -> None:
    src = checkpoints / "bigcode-bad-src"
    if not src.exists():
        build_gpt_bigcode(src)
    path = copy_checkpoint(src, tmp_path / "bad")
    config = json.loads((path / "config.json").read_text())
    config = {k: v for k, v in {**config, **change}.items() if v is not None}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(error, match=names):
        StarCoderEngine.load(path)


def test_quantized_copy_and_info(tmp_path: Path) -> None:
    """``quantize`` writes an mlx-community-style GPTBigCode checkpoint that loads; ``info`` reads both."""
    from langchain_starcoder.checkpoints import checkpoint_info, format_info, quantize_checkpoint

    src = build_gpt_bigcode(tmp_path / "src", preset="small")
    dst = quantize_checkpoint(src, tmp_path / "q4", bits=4, group_size=64, progress=False)
    info = checkpoint_info(dst)
    assert (info["architecture"], info["kv_heads"], info["context_window"]) == ("gpt_bigcode", 1, 1024)
    assert info["quantization"]["bits"] == 4 and info["rope_theta"] is None
    assert "learned positions" in format_info(info) and "learned positions" in format_info(
        checkpoint_info(src)
    )
    engine = StarCoderEngine.load(dst)
    try:
        assert engine.generate("def f(x):", max_tokens=4).completion_tokens == 4
    finally:
        engine.close()


def test_tied_checkpoint_with_stored_head_and_mask_buffers(tmp_path: Path) -> None:
    """Older GPTBigCode files also store the tied ``lm_head`` and the causal-mask buffers: dropped."""
    from safetensors.numpy import load_file, save_file

    path = build_gpt_bigcode(tmp_path / "tied", tie_word_embeddings=True, seed=9)
    weights = load_file(str(path / "model.safetensors"))
    assert "lm_head.weight" not in weights
    weights["lm_head.weight"] = weights["transformer.wte.weight"].copy()
    weights["transformer.bias"] = np.tril(np.ones((8, 8), dtype=bool))
    weights["transformer.h.0.attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    assert_matches_transformers(path, seed=2)


@pytest.mark.parametrize("activation", ["gelu_fast", "gelu_new", "gelu", "relu"])
def test_other_activations_match_transformers(tmp_path: Path, activation: str) -> None:
    """SantaCoder-era configs name other activations; transformers' gelu_fast is the tanh form too."""
    path = build_gpt_bigcode(tmp_path / activation, seed=10)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "activation_function": activation}))
    assert_matches_transformers(path, seed=4)
