"""The generation engine: threads, prompt-cache reuse, stops, UTF-8 streaming, sampling, batching."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from langchain_starcoder import ContextLengthError, FIMRequest, InvalidParameterError, StarCoderEngine
from langchain_starcoder.decoding.grammar import GrammarCheck
from langchain_starcoder.decoding.middle import MiddleGate
from langchain_starcoder.decoding.overlap import OverlapTrim
from langchain_starcoder.decoding.sink import TextStream
from langchain_starcoder.decoding.stops import StopStrings
from langchain_starcoder.engine import GenerationParams
from langchain_starcoder.engine.prepare import prepare
from langchain_starcoder.testing import build_starcoder2

PROMPTS = [
    "def fibonacci(n):\n",
    "class Stack:\n    def push(self, item):",
    "import os\nfrom pathlib import Path\n\n",
    "function add(a, b) {",
    "# 数据 处理 🚀\nresult = []",
    "for i in range(10):\n    total +=",
    "SELECT name FROM users WHERE",
    "fn main() {\n    let x =",
]


@pytest.fixture(scope="module")
def uncached(tiny_path: Path) -> StarCoderEngine:
    """The same checkpoint with prompt-cache reuse turned off, as the reference."""
    engine = StarCoderEngine.load(tiny_path, max_prompt_caches=0)
    yield engine
    engine.close()


def test_greedy_is_argmax_of_logits(tiny_engine: StarCoderEngine) -> None:
    ids = tiny_engine.encode(PROMPTS[0])
    first = tiny_engine.generate(ids, max_tokens=1).token_ids[0]
    assert first == int(np.argmax(tiny_engine.logits(ids)[-1]))


def test_eight_threads_get_what_they_get_alone(
    tiny_engine: StarCoderEngine, uncached: StarCoderEngine
) -> None:
    alone = [uncached.generate(p, max_tokens=24).token_ids for p in PROMPTS]
    barrier = threading.Barrier(len(PROMPTS))

    def run(prompt: str) -> list[int]:
        barrier.wait()
        return tiny_engine.generate(prompt, max_tokens=24).token_ids

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(run, PROMPTS))
    assert together == alone


class _CountingModel:
    """A model that counts its forward passes (and is otherwise the model)."""

    def __init__(self, model: object) -> None:
        self.model, self.calls = model, 0

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.calls += 1
        return self.model(*args, **kwargs)

    def __getattr__(self, name: str) -> object:
        return getattr(self.model, name)


@pytest.mark.parametrize("max_tokens", [1, 2, 7])
def test_no_forward_pass_past_the_last_token(tiny_path: Path, max_tokens: int) -> None:
    """A generation that ends at max_tokens costs its prompt and max_tokens - 1 decode steps: no step
    for a token nobody asked for (mlx-lm's generate_step alone runs one more)."""
    engine = StarCoderEngine.load(tiny_path, max_prompt_caches=0)
    reference = engine.generate(PROMPTS[0], max_tokens=max_tokens, temperature=0.0)
    counting = engine.backend.model = _CountingModel(engine.backend.model)
    completion = engine.generate(PROMPTS[0], max_tokens=max_tokens, temperature=0.0)
    engine.close()
    assert completion.finish_reason == "length" and completion.token_ids == reference.token_ids
    assert len(completion.token_ids) == max_tokens
    # mlx-lm feeds a prompt as two passes (all but its last token, then the last), then one a token.
    assert counting.calls == 2 + (max_tokens - 1)


# --- prompt-cache reuse --------------------------------------------------------------------------


def test_shared_prefix_is_not_prefilled_again(
    tiny_engine: StarCoderEngine, uncached: StarCoderEngine
) -> None:
    tiny_engine.clear_cache()
    context = "".join(PROMPTS) * 3
    first = tiny_engine.generate(context + "def a():", max_tokens=8)
    second = tiny_engine.generate(context + "class B:", max_tokens=8)
    shared = len(tiny_engine.encode(context))
    assert first.cached_tokens == 0
    assert shared - 2 <= second.cached_tokens < second.prompt_tokens  # BPE may merge across the seam
    assert second.prompt_tokens - second.cached_tokens <= len(tiny_engine.encode("class B:")) + 2
    assert second.token_ids == uncached.generate(context + "class B:", max_tokens=8).token_ids
    # The identical prompt again: everything but the last token comes from the cache.
    again = tiny_engine.generate(context + "class B:", max_tokens=8)
    assert again.cached_tokens == again.prompt_tokens - 1
    assert again.token_ids == second.token_ids


def test_a_short_request_never_destroys_a_long_context(
    tiny_engine: StarCoderEngine, uncached: StarCoderEngine
) -> None:
    tiny_engine.clear_cache()
    repo = "".join(PROMPTS) * 4
    first = tiny_engine.generate(repo + "def a():", max_tokens=6)
    other = tiny_engine.generate(repo[:40] + "unrelated", max_tokens=6)  # shares a short prefix
    again = tiny_engine.generate(repo + "def b():", max_tokens=6)
    assert first.cached_tokens == 0 and 0 < other.cached_tokens <= len(tiny_engine.encode(repo[:40]))
    assert again.cached_tokens >= len(tiny_engine.encode(repo)) - 2
    assert other.token_ids == uncached.generate(repo[:40] + "unrelated", max_tokens=6).token_ids
    assert again.token_ids == uncached.generate(repo + "def b():", max_tokens=6).token_ids


def test_reuse_past_the_sliding_window_is_exact(window_path: Path) -> None:
    reusing = StarCoderEngine.load(window_path)
    fresh = StarCoderEngine.load(window_path, max_prompt_caches=0)
    try:
        base = list(range(100, 160))  # 60 tokens, window 16
        for tail in ([7, 8, 9], [7, 8, 10, 11], [300]):
            got = reusing.generate(base + tail, max_tokens=12)
            assert got.token_ids == fresh.generate(base + tail, max_tokens=12).token_ids
        assert got.cached_tokens == 60
    finally:
        reusing.close()
        fresh.close()


def test_prompt_caches_are_bounded(tiny_path: Path) -> None:
    engine = StarCoderEngine.load(tiny_path, max_prompt_caches=2)
    try:
        for p in PROMPTS[:3]:
            engine.generate(p, max_tokens=2)
        assert engine.generate(PROMPTS[0], max_tokens=2).cached_tokens == 0  # evicted (LRU)
        assert engine.generate(PROMPTS[2], max_tokens=2).cached_tokens > 0
        one_cache = engine.prompt_cache_bytes / 2
        engine.clear_cache()
        assert engine.prompt_cache_bytes == 0
    finally:
        engine.close()
    small = StarCoderEngine.load(tiny_path, max_prompt_cache_bytes=int(one_cache * 1.5))
    try:
        for p in PROMPTS[:4]:
            small.generate(p, max_tokens=2)
            assert small.prompt_cache_bytes <= one_cache * 1.5
    finally:
        small.close()


# --- stop strings, EOS, length -------------------------------------------------------------------


def test_stop_string_across_tokens(tiny_engine: StarCoderEngine) -> None:
    full = tiny_engine.generate(PROMPTS[1], max_tokens=40)
    assert full.finish_reason == "length" and full.completion_tokens == 40
    # A stop that starts inside one token and ends inside a later one, at its first occurrence.
    ends = [len(tiny_engine.decode(full.token_ids[:k])) for k in range(1, 40)]
    start, stop = next(
        (a - 1, full.text[a - 1 : b + 1])
        for a, b in itertools.pairwise(ends)
        if 1 < a < b and full.text.find(full.text[a - 1 : b + 1]) == a - 1
    )
    got = tiny_engine.generate(PROMPTS[1], max_tokens=40, stop=["never-there", stop])
    assert got.text == full.text[:start]
    assert (got.finish_reason, got.stop_sequence) == ("stop", stop)
    chunks = list(tiny_engine.stream(PROMPTS[1], max_tokens=40, stop=[stop]))
    assert "".join(c.text for c in chunks) == got.text  # no chunk carries any part of the stop
    assert all(c.text for c in chunks[:-1]) and chunks[-1].finish_reason == "stop"


def test_stop_string_inside_one_token(tiny_engine: StarCoderEngine) -> None:
    full = tiny_engine.generate(PROMPTS[1], max_tokens=40)
    # A stop in the middle of a long token: the text before it, in the same token, must be kept.
    start = 0
    for t in full.token_ids:
        piece = tiny_engine.decode([t])
        if len(piece) >= 4 and full.text.find(piece[1:-1]) == start + 1:
            stop = piece[1:-1]
            break
        start += len(piece)
    else:
        pytest.fail("no suitable token in the output")
    got = tiny_engine.generate(PROMPTS[1], max_tokens=40, stop=[stop])
    assert got.text == full.text[: start + 1]
    streamed = "".join(c.text for c in tiny_engine.stream(PROMPTS[1], max_tokens=40, stop=[stop]))
    assert streamed == got.text


def test_stop_token_ids_and_eos(tiny_engine: StarCoderEngine) -> None:
    assert 0 in tiny_engine.eos_token_ids  # <|endoftext|> from tokenizer and config
    full = tiny_engine.generate(PROMPTS[2], max_tokens=20)
    target = full.token_ids[5]
    cut = full.token_ids.index(target)
    got = tiny_engine.generate(PROMPTS[2], max_tokens=20, stop_token_ids=[target])
    assert got.finish_reason == "stop" and got.stop_sequence is None
    assert got.token_ids == full.token_ids[: cut + 1]  # the stop token is counted, not shown
    assert got.text == tiny_engine.decode(full.token_ids[:cut])


def test_text_stream_stops_at_eos(tiny_engine: StarCoderEngine) -> None:
    stream = TextStream(
        tiny_engine.tokenizer, GenerationParams.create(stop_token_ids=tiny_engine.eos_token_ids)
    )
    text = "".join(stream.add(t) for t in tiny_engine.encode("x = 1"))
    assert stream.finish_reason is None
    text += stream.add(0)
    assert (stream.finish_reason, text) == ("stop", "x = 1")


def test_a_job_lists_the_filters_its_text_passes(tiny_engine: StarCoderEngine) -> None:
    """prepare picks each job's filters, in the order the text passes them: stop strings for a job
    that has some, a FIM middle's end and its suffix overlap (never under a constraint, where the
    grammar's verdict decides)."""
    parts = tiny_engine._parts

    def kinds(prompt: Any, **settings: Any) -> list[type]:
        return [type(f) for f in prepare(parts, prompt, settings).filters]

    fim = FIMRequest("def f(x):\n    ", "\n    return y\n", file_path="m.py")
    assert kinds("x = ") == [] and kinds([1, 2, 3], stop="\n") == [StopStrings]
    assert kinds(fim, stop=["\n\n"]) == [StopStrings, MiddleGate, OverlapTrim]
    untrimmed = dataclasses.replace(fim, end="none", trim_suffix_overlap=False)
    assert kinds(dataclasses.replace(fim, end="none")) == [OverlapTrim]
    assert kinds(dataclasses.replace(untrimmed, min_indent=4)) == [MiddleGate] and kinds(untrimmed) == []
    constrained = prepare(parts, fim, {"regex": "[a-z]+", "stop": "z"})
    assert [type(f) for f in constrained.filters] == [StopStrings, GrammarCheck]
    assert constrained.grammar is not None


# --- UTF-8 ---------------------------------------------------------------------------------------


def test_streamed_text_never_splits_characters(tiny_engine: StarCoderEngine) -> None:
    text = "注释: 数据处理 🚀🎉 café — naïve ✓ 你好世界"
    ids = tiny_engine.encode(text)
    assert len(ids) > len(text) // 2  # multi-byte characters span several tokens
    stream = TextStream(
        tiny_engine.tokenizer, GenerationParams.create(stop_token_ids=tiny_engine.eos_token_ids)
    )
    pieces = [stream.add(t) for t in ids] + [stream.finish("length")]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_stream_equals_generate(tiny_engine: StarCoderEngine) -> None:
    prompt = "# 数据 处理 🚀\n"
    whole = tiny_engine.generate(prompt, max_tokens=30)
    chunks = list(tiny_engine.stream(prompt, max_tokens=30))
    assert "".join(c.text for c in chunks) == whole.text
    assert [t for c in chunks for t in c.token_ids] == whole.token_ids
    last = chunks[-1]
    assert (last.prompt_tokens, last.completion_tokens, last.finish_reason) == (
        whole.prompt_tokens,
        whole.completion_tokens,
        whole.finish_reason,
    )


def test_leading_space_is_kept(tiny_engine: StarCoderEngine) -> None:
    """mlx-lm's detokenizer drops a completion's first space; in code it is content."""
    stream = TextStream(
        tiny_engine.tokenizer, GenerationParams.create(stop_token_ids=tiny_engine.eos_token_ids)
    )
    ids = tiny_engine.encode(" return x")
    assert "".join(stream.add(t) for t in ids) + stream.finish("length") == " return x"


# --- sampling ------------------------------------------------------------------------------------


def test_seed_makes_sampling_reproducible(tiny_engine: StarCoderEngine) -> None:
    a = tiny_engine.generate(PROMPTS[3], max_tokens=16, temperature=1.0, seed=11)
    b = tiny_engine.generate(PROMPTS[3], max_tokens=16, temperature=1.0, seed=11)
    c = tiny_engine.generate(PROMPTS[3], max_tokens=16, temperature=1.0, seed=12)
    greedy = tiny_engine.generate(PROMPTS[3], max_tokens=16)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids
    assert a.token_ids != greedy.token_ids


def test_top_k_one_is_greedy(tiny_engine: StarCoderEngine) -> None:
    greedy = tiny_engine.generate(PROMPTS[4], max_tokens=12)
    top1 = tiny_engine.generate(PROMPTS[4], max_tokens=12, temperature=2.0, top_k=1, seed=3)
    assert top1.token_ids == greedy.token_ids


def test_repetition_penalty_with_and_without_cache(
    tiny_engine: StarCoderEngine, uncached: StarCoderEngine
) -> None:
    prompt = PROMPTS[5] * 4
    plain = uncached.generate(prompt, max_tokens=24)
    penalised = uncached.generate(prompt, max_tokens=24, repetition_penalty=1.5)
    assert penalised.token_ids != plain.token_ids
    tiny_engine.generate(prompt[:-3], max_tokens=2)  # leaves a cache sharing most of the prompt
    reused = tiny_engine.generate(prompt, max_tokens=24, repetition_penalty=1.5)
    assert reused.cached_tokens > 0
    assert reused.token_ids == penalised.token_ids


# --- quantized KV cache --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_path(checkpoints: Path) -> Path:
    return build_starcoder2(checkpoints / "small-engine", preset="small")  # head_dim 64


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_kv_cache(small_path: Path, bits: int) -> None:
    prompt = "".join(PROMPTS)
    plain = StarCoderEngine.load(small_path)
    quantized = StarCoderEngine.load(small_path, kv_bits=bits)
    try:
        reference = plain.generate(prompt, max_tokens=16)
        got = quantized.generate(prompt, max_tokens=16)
        assert got.completion_tokens == 16
        # bytes per token: float32 keys and values against packed ones plus scales and biases
        ratio = quantized.prompt_cache_bytes / plain.prompt_cache_bytes
        assert ratio < {8: 0.35, 4: 0.2}[bits]
        assert sum(a == b for a, b in zip(got.token_ids, reference.token_ids, strict=True)) >= 4
        again = quantized.generate(prompt, max_tokens=16)  # reuse of a quantized cache
        assert again.cached_tokens == again.prompt_tokens - 1
        assert again.token_ids == got.token_ids
    finally:
        plain.close()
        quantized.close()


def test_kv_bits_needs_a_quantizable_head_dim(tiny_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="head dimension"):
        StarCoderEngine.load(tiny_path, kv_bits=8)  # tiny's head_dim is 16


# --- batching ------------------------------------------------------------------------------------


def test_batch_equals_each_alone(tiny_engine: StarCoderEngine, uncached: StarCoderEngine) -> None:
    batch = tiny_engine.generate_batch(PROMPTS, max_tokens=20)
    alone = [uncached.generate(p, max_tokens=20) for p in PROMPTS]
    assert [b.token_ids for b in batch] == [a.token_ids for a in alone]
    assert [b.text for b in batch] == [a.text for a in alone]
    assert [b.prompt_tokens for b in batch] == [a.prompt_tokens for a in alone]


def test_batch_stops_each_on_its_own(tiny_engine: StarCoderEngine) -> None:
    full = tiny_engine.generate_batch(PROMPTS[:3], max_tokens=20)
    stop = full[1].text[5:8]
    got = tiny_engine.generate_batch(PROMPTS[:3], max_tokens=20, stop=[stop])
    for whole, part in zip(full, got, strict=True):
        cut = whole.text.find(stop)
        if cut < 0:
            assert part.text == whole.text and part.finish_reason == "length"
        else:
            assert part.text == whole.text[:cut] and part.stop_sequence == stop


# --- async ---------------------------------------------------------------------------------------


async def test_async_agrees_and_keeps_the_loop_free(tiny_engine: StarCoderEngine) -> None:
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    chunks = [c async for c in tiny_engine.astream(PROMPTS[6] * 20, max_tokens=120)]
    done.set()
    await task
    assert ticks > 10
    whole = await tiny_engine.agenerate(PROMPTS[6] * 20, max_tokens=120)
    assert "".join(c.text for c in chunks) == whole.text
    assert whole.token_ids == tiny_engine.generate(PROMPTS[6] * 20, max_tokens=120).token_ids


# --- cancellation --------------------------------------------------------------------------------


def _last_cache_length(engine: StarCoderEngine) -> int:
    return engine.backend.call(lambda: len(engine.backend._prompt_caches._entries[-1].tokens))


def test_abandoned_stream_stops_generating(tiny_engine: StarCoderEngine) -> None:
    tiny_engine.clear_cache()
    prompt_len = len(tiny_engine.encode(PROMPTS[7]))
    for i, _ in enumerate(tiny_engine.stream(PROMPTS[7], max_tokens=1000)):
        if i == 2:
            break
    assert _last_cache_length(tiny_engine) < prompt_len + 12  # stopped within a few tokens
    after = tiny_engine.generate(PROMPTS[7], max_tokens=10)
    assert after.token_ids == tiny_engine.generate(PROMPTS[7], max_tokens=10).token_ids


async def test_cancelled_task_stops_generating(tiny_engine: StarCoderEngine) -> None:
    tiny_engine.clear_cache()
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in tiny_engine.astream(PROMPTS[0], max_tokens=1000):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    prompt_len = len(tiny_engine.encode(PROMPTS[0]))
    await asyncio.sleep(0.05)
    assert _last_cache_length(tiny_engine) < prompt_len + 40
    assert (await tiny_engine.agenerate(PROMPTS[0], max_tokens=5)).completion_tokens == 5


# --- limits and bad input ------------------------------------------------------------------------


def test_context_limit(tiny_engine: StarCoderEngine) -> None:
    prompt = [100 + i % 900 for i in range(2000)]
    with pytest.raises(ContextLengthError, match=r"2000.*100.*2048"):
        tiny_engine.generate(prompt, max_tokens=100)
    assert tiny_engine.generate(prompt, max_tokens=48).finish_reason in ("length", "stop")


@pytest.mark.parametrize(
    "params",
    [
        {"max_tokens": 0},
        {"max_tokens": -3},
        {"temperature": -0.1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -1},
        {"min_p": 1.0},
        {"repetition_penalty": 0},
        {"stop": [""]},
        {"seed": "x"},
    ],
)
def test_bad_parameters(tiny_engine: StarCoderEngine, params: dict) -> None:
    with pytest.raises(InvalidParameterError):
        tiny_engine.generate("def f():", **params)


@pytest.mark.parametrize("prompt", ["", "   \n\t", [], [5000], 42, "bad \ud800 surrogate"])
def test_bad_prompts(tiny_engine: StarCoderEngine, prompt: object) -> None:
    with pytest.raises(InvalidParameterError):
        tiny_engine.generate(prompt, max_tokens=4)  # type: ignore[arg-type]


def test_prompt_parsing_survives_split_special_tokens_elsewhere(tiny_engine: StarCoderEngine) -> None:
    """transformers flips its shared tokenizer's encode_special_tokens when anyone encodes with
    split_special_tokens=True; the engine's own encoders do not follow it."""
    hf = tiny_engine.tokenizer._tokenizer
    before = tiny_engine.encode("<file_sep>x = 1\n")
    try:
        hf.encode("<file_sep>x", split_special_tokens=True)
        assert tiny_engine.encode("<file_sep>x = 1\n") == before
        assert before[0] == tiny_engine.token_id("<file_sep>")
    finally:
        hf.backend_tokenizer.encode_special_tokens = False
