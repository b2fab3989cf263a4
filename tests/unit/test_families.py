"""The engine's features, the same for both families: StarCoder2 and StarCoder (GPTBigCode).

Quantize on load, a quantized KV cache, prompt-cache reuse, batching (left-padded rows, where learned
positions must follow each row), stops and streaming, and the context limit.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from langchain_starcoder import ContextLengthError, StarCoderEngine
from langchain_starcoder.testing import build_gpt_bigcode, build_starcoder2

PROMPTS = [
    "def fibonacci(n):\n",
    "class Stack:\n    def push(self, item):",
    "import os\nfrom pathlib import Path\n\nresult = [x for x in os.listdir('.') if x]\n",
    "# 数据 处理 🚀\nresult = []",
    "SELECT",
]

#: Each family's builder of a "small" checkpoint (head_dim 64, widths divisible by 128).
BUILDERS: dict[str, Callable[..., Path]] = {
    "starcoder2": lambda path: build_starcoder2(path, preset="small", seed=4),
    "gpt_bigcode": lambda path: build_gpt_bigcode(path, preset="small", seed=4),
}


@pytest.fixture(scope="module", params=list(BUILDERS))
def family_path(request: pytest.FixtureRequest, checkpoints: Path) -> Path:
    return BUILDERS[request.param](checkpoints / f"family-{request.param}")


@pytest.fixture(scope="module")
def engine(family_path: Path) -> StarCoderEngine:
    engine = StarCoderEngine.load(family_path)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def uncached(family_path: Path) -> StarCoderEngine:
    engine = StarCoderEngine.load(family_path, max_prompt_caches=0)
    yield engine
    engine.close()


def test_batch_equals_each_alone(engine: StarCoderEngine, uncached: StarCoderEngine) -> None:
    """Prompts of different lengths share a left-padded batch; each row gets what it gets alone."""
    lengths = {len(engine.encode(p)) for p in PROMPTS}
    assert len(lengths) == len(PROMPTS)  # every row has its own padding
    batch = engine.generate_batch(PROMPTS, max_tokens=16)
    alone = [uncached.generate(p, max_tokens=16) for p in PROMPTS]
    assert [b.token_ids for b in batch] == [a.token_ids for a in alone]


def test_batch_in_small_prefill_steps(family_path: Path, uncached: StarCoderEngine) -> None:
    """Rows padded on the right while prefilled in steps, then rolled to the left: same tokens."""
    stepped = StarCoderEngine.load(family_path, prefill_step_size=5)
    try:
        batch = stepped.generate_batch(PROMPTS, max_tokens=10)
        assert [b.token_ids for b in batch] == [
            uncached.generate(p, max_tokens=10).token_ids for p in PROMPTS
        ]
    finally:
        stepped.close()


def test_batch_stops_each_on_its_own(engine: StarCoderEngine) -> None:
    full = engine.generate_batch(PROMPTS[:3], max_tokens=16)
    stop = full[1].text[4:7]
    got = engine.generate_batch(PROMPTS[:3], max_tokens=16, stop=[stop])
    for whole, part in zip(full, got, strict=True):
        cut = whole.text.find(stop)
        assert part.text == (whole.text if cut < 0 else whole.text[:cut])


def test_prompt_cache_reuse_is_exact(engine: StarCoderEngine, uncached: StarCoderEngine) -> None:
    engine.clear_cache()
    context = "".join(PROMPTS) * 3
    engine.generate(context + "def a():", max_tokens=6)
    second = engine.generate(context + "class B:", max_tokens=12)
    assert second.cached_tokens >= len(engine.encode(context)) - 2
    assert second.token_ids == uncached.generate(context + "class B:", max_tokens=12).token_ids


def test_stream_and_stops(engine: StarCoderEngine) -> None:
    whole = engine.generate(PROMPTS[0], max_tokens=20)
    assert "".join(c.text for c in engine.stream(PROMPTS[0], max_tokens=20)) == whole.text
    stop = whole.text[6:9]
    cut = engine.generate(PROMPTS[0], max_tokens=20, stop=[stop])
    assert cut.text == whole.text[: whole.text.find(stop)] and cut.stop_sequence == stop


def _stepwise_logits(engine: StarCoderEngine, ids: list[int], split: int) -> np.ndarray:
    """Logits of ``ids`` through the backend's own cache kind: a prefill, then one token a step."""
    model = engine.backend.model

    def run() -> np.ndarray:
        cache = engine.backend._new_cache()
        rows = [model(mx.array(ids[:split])[None], cache=cache)[0]]
        rows += [model(mx.array([t])[None], cache=cache)[0] for t in ids[split:]]
        return np.array(mx.concatenate(rows).astype(mx.float32))

    return engine.backend.call(run)


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_kv_cache(family_path: Path, engine: StarCoderEngine, bits: int) -> None:
    prompt = "".join(PROMPTS)
    quantized = StarCoderEngine.load(family_path, kv_bits=bits)
    try:
        ids = engine.encode(prompt)
        full, quant = engine.logits(ids), _stepwise_logits(quantized, ids, len(ids) // 2)
        # Measured on both families: 8 bits 0.03 off at most, 4 bits 0.5 with 80% of argmaxes kept.
        assert np.abs(full - quant).max() < {8: 0.1, 4: 1.0}[bits]
        assert (full.argmax(-1) == quant.argmax(-1)).mean() > {8: 0.95, 4: 0.7}[bits]
        got = quantized.generate(prompt, max_tokens=12)
        assert got.completion_tokens == 12
        again = quantized.generate(prompt, max_tokens=12)  # reuse of a quantized cache
        assert again.cached_tokens == again.prompt_tokens - 1 and again.token_ids == got.token_ids
    finally:
        quantized.close()


@pytest.mark.parametrize(("bits", "group_size"), [(8, 32), (8, 128), (4, 64)])
def test_quantize_on_load(family_path: Path, engine: StarCoderEngine, bits: int, group_size: int) -> None:
    quantized = StarCoderEngine.load(family_path, quantize=bits, group_size=group_size)
    try:
        layers = [
            m for _, m in tree_flatten(quantized.backend.model.leaf_modules(), is_leaf=nn.Module.is_module)
        ]
        linears = [m for m in layers if isinstance(m, nn.QuantizedLinear)]
        assert linears and all((m.bits, m.group_size) == (bits, group_size) for m in linears)
        assert not any(type(m) is nn.Linear for m in layers)
        ids = engine.encode("".join(PROMPTS))
        full, quant = engine.logits(ids), quantized.logits(ids)
        assert np.corrcoef(full.ravel(), quant.ravel())[0, 1] > {8: 0.999, 4: 0.95}[bits]
        assert quantized.generate(PROMPTS[0], max_tokens=8).completion_tokens == 8
    finally:
        quantized.close()


def test_context_limit(engine: StarCoderEngine) -> None:
    prompt = [100 + i % 900 for i in range(engine.context_window - 40)]
    with pytest.raises(ContextLengthError, match=str(engine.context_window)):
        engine.generate(prompt, max_tokens=41)
