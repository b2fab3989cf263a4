"""Our StarCoder2 against the reference: transformers' Starcoder2ForCausalLM, float32, on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import torch
from mlx_lm.models.cache import make_prompt_cache
from transformers import AutoModelForCausalLM

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.testing import build_starcoder2

TOLERANCE = 1e-4


def reference_logits(path: Path, ids: list[int]) -> np.ndarray:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def prompt_ids(n: int, seed: int = 0, vocab: int = 1024) -> list[int]:
    # Ordinary (non-special) tokens, so that the prompt is like text.
    return np.random.default_rng(seed).integers(40, vocab, size=n).tolist()


@pytest.mark.parametrize("length", [8, 64])  # the window is 16: 64 is 4x longer
def test_logits_match_transformers(window_path: Path, window_engine: StarCoderEngine, length: int) -> None:
    ids = prompt_ids(length)
    ours = window_engine.logits(ids)
    ref = reference_logits(window_path, ids)
    assert ours.shape == ref.shape == (length, 1024)
    assert np.abs(ours - ref).max() < TOLERANCE


def test_kv_cache_matches_full_pass(window_engine: StarCoderEngine) -> None:
    """Prefill a prefix, then feed tokens one at a time, past the window: same logits as one pass."""
    ids = prompt_ids(64, seed=3)
    full = window_engine.logits(ids)

    def stepwise() -> np.ndarray:
        model = window_engine.backend.model
        cache = make_prompt_cache(model)
        rows = [model(mx.array(ids[:10])[None], cache=cache)[0]]
        rows += [model(mx.array([t])[None], cache=cache)[0] for t in ids[10:]]
        return np.array(mx.concatenate(rows).astype(mx.float32))

    assert np.abs(window_engine.backend.call(stepwise) - full).max() < TOLERANCE


def test_greedy_generation_matches_transformers_past_the_window(
    window_path: Path, window_engine: StarCoderEngine
) -> None:
    ids = prompt_ids(12, seed=5)
    ours = window_engine.generate(ids, max_tokens=32)
    model = AutoModelForCausalLM.from_pretrained(window_path, dtype=torch.float32)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    ref = out[0, len(ids) :].tolist()
    assert len(ids) + 32 > 2 * window_engine.sliding_window  # the sequence runs well past the window
    assert ours.token_ids == ref[: len(ours.token_ids)]
    assert ours.completion_tokens == 32 or ours.finish_reason == "stop"


def test_stock_mlx_lm_module_diverges_past_the_window(window_path: Path) -> None:
    """Why this package ships its own StarCoder2: mlx-lm's ignores the sliding window."""
    from mlx_lm.utils import load_model

    stock, _ = load_model(window_path)
    ids = prompt_ids(64)
    stock_logits = np.array(stock(mx.array(ids)[None])[0])
    ref = reference_logits(window_path, ids)
    inside = np.abs(stock_logits[:16] - ref[:16]).max()
    past = np.abs(stock_logits[16:] - ref[16:]).max()
    assert past > 100 * max(inside, TOLERANCE)


@pytest.mark.parametrize(
    "variant",
    [
        "rope_parameters",  # transformers 5 writes rope_theta under rope_parameters
        "tied",
        "no_window",
    ],
)
def test_config_variants_match_transformers(tmp_path: Path, variant: str) -> None:
    path = build_starcoder2(
        tmp_path / variant,
        seed=7,
        sliding_window=0 if variant == "no_window" else 16,
        tie_word_embeddings=variant == "tied",
    )
    if variant == "rope_parameters":
        config = json.loads((path / "config.json").read_text())
        config["rope_parameters"] = {"rope_theta": 500.0, "rope_type": "default"}
        del config["rope_theta"]
        (path / "config.json").write_text(json.dumps(config))
    engine = StarCoderEngine.load(path)
    try:
        if variant == "rope_parameters":
            assert engine.backend.config.rope_base == 500.0
        ids = prompt_ids(40, seed=9)
        assert np.abs(engine.logits(ids) - reference_logits(path, ids)).max() < TOLERANCE
    finally:
        engine.close()
