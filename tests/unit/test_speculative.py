"""Speculative decoding (prompt lookup, a draft model): the same greedy tokens, caches and text as
plain decoding, with the draft counts reported."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.backends.speculative import Acceptance, PassCosts, PromptLookup, _Shadow, decode
from langchain_starcoder.checkpoints import quantize_checkpoint
from langchain_starcoder.errors import InvalidParameterError
from langchain_starcoder.testing import build_gpt_bigcode

# Code that repeats itself, as an edit does: the tiny models' greedy output goes on repeating it
# for a while, so drafts from the prompt are often right (random weights copy only sometimes).
EDIT = "for i in range(10):\n    print(i)\n" * 3
AREA = "def area(width, height):\n    return width * height\n\n" * 2 + "def area(width, height):\n"
FRAGMENTS = [
    "def f(x):\n",
    "    return x + 1\n",
    "class A:\n",
    "    pass\n",
    "import os\n",
    "x = [1, 2, 3]\n",
]


def plain_and_speculative(engine: StarCoderEngine, prompt, n: int = 4, **settings):
    plain = engine.generate(prompt, prompt_lookup_num_tokens=0, **settings)
    fast = engine.generate(prompt, prompt_lookup_num_tokens=n, **settings)
    return plain, fast


@pytest.fixture(scope="module")
def engine(tiny_path: Path) -> StarCoderEngine:
    engine = StarCoderEngine.load(tiny_path, max_prompt_caches=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def bigcode(checkpoints: Path) -> StarCoderEngine:
    engine = StarCoderEngine.load(build_gpt_bigcode(checkpoints / "bigcode-spec"), max_prompt_caches=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def draft_copy(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 8-bit copy of the tiny checkpoint: a draft that mostly agrees with its float32 original."""
    return quantize_checkpoint(tiny_path, tmp_path_factory.mktemp("draft") / "q8", bits=8, progress=False)


# --- the same tokens ---------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=8),
    n=st.integers(1, 8),
    max_tokens=st.integers(1, 40),
)
def test_identical_ids_over_many_prompts(
    engine: StarCoderEngine, parts: list[str], n: int, max_tokens: int
) -> None:
    prompt = "".join(parts) * 2
    plain, fast = plain_and_speculative(engine, prompt, n, max_tokens=max_tokens)
    assert fast.token_ids == plain.token_ids
    assert (fast.text, fast.finish_reason) == (plain.text, plain.finish_reason)
    assert plain.accepted_draft_tokens == plain.draft_tokens == 0
    assert 0 <= fast.accepted_draft_tokens <= min(fast.draft_tokens, len(fast.token_ids))


def test_drafts_are_accepted_on_repeating_code(engine: StarCoderEngine) -> None:
    plain, fast = plain_and_speculative(engine, EDIT, 8, max_tokens=64)
    assert fast.token_ids == plain.token_ids
    assert fast.accepted_draft_tokens >= 16  # the tiny model's output repeats: most drafts hold


def test_gpt_bigcode_family(bigcode: StarCoderEngine) -> None:
    for prompt in (AREA, "".join(FRAGMENTS) * 2):
        plain, fast = plain_and_speculative(bigcode, prompt, 6, max_tokens=48)
        assert fast.token_ids == plain.token_ids
        assert fast.draft_tokens > 0


def test_past_the_sliding_window(window_path: Path) -> None:
    engine = StarCoderEngine.load(window_path, max_prompt_caches=0)
    try:
        prompt = "import os\nimport sys\n" * 6  # far longer than the window of 16
        assert len(engine.encode(prompt)) > 4 * engine.sliding_window
        plain, fast = plain_and_speculative(engine, prompt, 8, max_tokens=64)
        assert fast.token_ids == plain.token_ids and fast.draft_tokens > 0
    finally:
        engine.close()


def test_quantized_kv_cache(small_path: Path) -> None:
    engine = StarCoderEngine.load(small_path, kv_bits=8, max_prompt_caches=0)
    try:
        plain, fast = plain_and_speculative(engine, "def f(x):\n    return x + 1\n" * 3, 6, max_tokens=48)
        assert fast.token_ids == plain.token_ids and fast.accepted_draft_tokens > 0
    finally:
        engine.close()


# --- the KV cache left behind ------------------------------------------------------------------


def flat_state(engine: StarCoderEngine):
    """Each kept prompt cache: its tokens and every layer's keys and values up to its offset."""
    from mlx.utils import tree_flatten

    def read() -> list:
        return [
            (
                list(e.tokens),
                [
                    np.array(a[..., : c.offset, :])
                    for c in e.cache
                    for _, a in tree_flatten((c.keys, c.values))
                ],
            )
            for e in engine.backend._prompt_caches._entries
        ]

    return engine.backend.call(read)


@pytest.mark.parametrize("stop", [None, "ids", "string"])
def test_cache_left_behind_equals_a_plain_runs(tiny_path: Path, stop: str | None) -> None:
    plain_engine = StarCoderEngine.load(tiny_path)
    fast_engine = StarCoderEngine.load(tiny_path)
    try:
        reference = plain_engine.generate(EDIT, max_tokens=40, prompt_lookup_num_tokens=0)
        settings: dict = {"max_tokens": 40}
        if stop == "ids":  # a token the run reaches after some drafts
            ids = reference.token_ids
            settings["stop_token_ids"] = [next(t for j, t in enumerate(ids) if j >= 3 and t not in ids[:j])]
        elif stop == "string":
            settings["stop"] = [reference.text[len(reference.text) // 2 :][:3]]
        plain_engine.clear_cache()
        plain = plain_engine.generate(EDIT, prompt_lookup_num_tokens=0, **settings)
        fast = fast_engine.generate(EDIT, prompt_lookup_num_tokens=8, **settings)
        assert fast.token_ids == plain.token_ids and fast.draft_tokens > 0
        if stop:
            assert fast.finish_reason == "stop" and len(fast.token_ids) < 40
        (tokens, arrays), (plain_tokens, plain_arrays) = (
            flat_state(fast_engine)[0],
            flat_state(plain_engine)[0],
        )
        assert tokens == plain_tokens
        assert all(np.array_equal(a, b) for a, b in zip(arrays, plain_arrays, strict=True))
        # Reused: a longer prompt over the kept cache decodes as a fresh one does.
        longer = EDIT + "    return width * height\n"
        again = fast_engine.generate(longer, max_tokens=24, prompt_lookup_num_tokens=8)
        assert again.cached_tokens > 0
        assert (
            again.token_ids
            == plain_engine.generate(longer, max_tokens=24, prompt_lookup_num_tokens=0).token_ids
        )
    finally:
        plain_engine.close()
        fast_engine.close()


def test_every_stop_point_inside_accepted_runs(engine: StarCoderEngine) -> None:
    """decode() stopped after each token: the tokens so far, and a cache holding exactly them."""
    ids = engine.encode(EDIT)
    model = engine.backend.model

    def run(stop_at: int | None, k: int) -> tuple[list[int], int, int]:
        def go():
            from mlx_lm.models.cache import make_prompt_cache

            cache = make_prompt_cache(model)
            model(mx.array(ids[:-1])[None], cache=cache)
            seen: list[int] = []

            def emit(token: int) -> bool:
                seen.append(token)
                return len(seen) == stop_at

            out, accepted, _ = decode(
                model, cache, ids, max_tokens=32, drafter=PromptLookup(ids), k_max=k, costs=None, emit=emit
            )
            assert out == seen
            return out, cache[0].offset, accepted

        return engine.backend.call(go)

    full, offset, _ = run(None, 0)
    assert offset == len(ids) + len(full) - 1  # max_tokens: the last token was never fed
    assert run(None, 6)[:2] == (full, offset) and run(None, 6)[2] > 0
    for j in range(1, len(full)):
        assert run(j, 6)[:2] == (full[:j], len(ids) + j)  # like plain: the stop token was fed


# --- the text: streaming, stops, cancel, batches --------------------------------------------


def test_streaming_same_text_same_order(engine: StarCoderEngine) -> None:
    plain = [c.text for c in engine.stream(EDIT, max_tokens=48, prompt_lookup_num_tokens=0)]
    chunks = list(engine.stream(EDIT, max_tokens=48, prompt_lookup_num_tokens=8))
    assert "".join(c.text for c in chunks) == "".join(plain)
    assert [c.text for c in chunks if c.text] == [t for t in plain if t]
    assert (
        chunks[-1].accepted_draft_tokens > 0 and chunks[-1].draft_tokens >= chunks[-1].accepted_draft_tokens
    )


def test_stop_strings_inside_accepted_runs(engine: StarCoderEngine) -> None:
    reference = engine.generate(EDIT, max_tokens=48, prompt_lookup_num_tokens=0)
    for start in range(4, len(reference.text) - 4, 7):
        stop = reference.text[start : start + 3]
        plain, fast = plain_and_speculative(engine, EDIT, 8, max_tokens=48, stop=[stop])
        assert (fast.text, fast.token_ids, fast.stop_sequence) == (
            plain.text,
            plain.token_ids,
            plain.stop_sequence,
        )


def test_cancel_leaves_the_engine_usable(engine: StarCoderEngine) -> None:
    stream = engine.stream(EDIT, max_tokens=200, prompt_lookup_num_tokens=8)
    next(stream)
    stream.close()
    plain, fast = plain_and_speculative(engine, EDIT, 8, max_tokens=24)
    assert fast.token_ids == plain.token_ids


def test_batches_decode_without_speculation(engine: StarCoderEngine) -> None:
    prompts = [EDIT, "".join(FRAGMENTS)]
    batch = engine.generate_batch(prompts, max_tokens=24, prompt_lookup_num_tokens=8)
    assert [c.token_ids for c in batch] == [engine.generate(p, max_tokens=24).token_ids for p in prompts]
    assert all(c.draft_tokens == 0 for c in batch)


def test_sampling_and_penalties_decode_without_speculation(engine: StarCoderEngine) -> None:
    sampled = engine.generate(EDIT, max_tokens=16, temperature=0.8, seed=3, prompt_lookup_num_tokens=8)
    again = engine.generate(EDIT, max_tokens=16, temperature=0.8, seed=3, prompt_lookup_num_tokens=0)
    assert sampled.token_ids == again.token_ids and sampled.draft_tokens == 0
    penalised = engine.generate(EDIT, max_tokens=16, repetition_penalty=1.3, prompt_lookup_num_tokens=8)
    assert penalised.draft_tokens == 0


def test_bad_setting_is_refused(engine: StarCoderEngine) -> None:
    for bad in (-1, 1.5, "4", 1000):
        with pytest.raises(InvalidParameterError, match="prompt_lookup_num_tokens"):
            engine.generate(EDIT, prompt_lookup_num_tokens=bad)
    assert engine.generate(EDIT, max_tokens=2).completion_tokens == 2


# --- a draft model ----------------------------------------------------------------------------


def test_an_8bit_copy_drafts_with_identical_output(tiny_path: Path, draft_copy: Path, engine) -> None:
    drafted = StarCoderEngine.load(tiny_path, draft_model=draft_copy, num_draft_tokens=4)
    try:
        for prompt in ("".join(FRAGMENTS), EDIT, "class Stack:\n    def push(self, item):\n"):
            plain = engine.generate(prompt, max_tokens=40, prompt_lookup_num_tokens=0)
            fast = drafted.generate(prompt, max_tokens=40)
            assert fast.token_ids == plain.token_ids
            assert fast.accepted_draft_tokens >= 0.6 * len(fast.token_ids)  # the copy mostly agrees
            streamed = list(drafted.stream(prompt, max_tokens=40))
            assert [t for c in streamed for t in c.token_ids] == plain.token_ids
        # The kept cache (model and draft layers) serves the next request exactly.
        again = drafted.generate(EDIT + "    return", max_tokens=24)
        assert again.cached_tokens > 0
        assert (
            again.token_ids
            == engine.generate(EDIT + "    return", max_tokens=24, prompt_lookup_num_tokens=0).token_ids
        )
        sampled = drafted.generate(EDIT, max_tokens=8, temperature=0.7, seed=1)
        assert sampled.draft_tokens == 0  # sampling: no drafts, the same distribution
    finally:
        drafted.close()


def test_a_draft_with_another_vocabulary_is_refused(tiny_path: Path, tmp_path: Path) -> None:
    other = build_gpt_bigcode(tmp_path / "other")  # StarCoder (v1) spells its tokens otherwise
    with pytest.raises(InvalidParameterError, match="draft model"):
        StarCoderEngine.load(tiny_path, draft_model=other)
    with pytest.raises(InvalidParameterError, match="num_draft_tokens"):
        StarCoderEngine.load(tiny_path, draft_model=tiny_path, num_draft_tokens=0)


# --- the parts ------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    seq=st.lists(st.integers(0, 5), min_size=0, max_size=60), split=st.integers(0, 60), k=st.integers(1, 6)
)
def test_prompt_lookup_matches_a_full_scan(seq: list[int], split: int, k: int) -> None:
    """The incremental index drafts what a scan for the latest earlier 3-gram (else 2-gram) finds."""
    lookup = PromptLookup(seq[:split])
    lookup.extend(seq[split:])

    def scan() -> list[int]:
        for n in (3, 2):
            if len(seq) < n:
                continue
            starts = [i for i in range(len(seq) - n) if seq[i : i + n] == seq[len(seq) - n :]]
            if starts:
                copy = list(seq)
                at = starts[-1] + n
                for i in range(k):
                    copy.append(copy[at + i])
                return copy[len(seq) :]
        return []

    assert lookup.propose(k) == scan()


def test_costs_decide_where_drafts_pay() -> None:
    compute_bound = PassCosts(plain=1.0, single=1.02, per_draft=1.0)  # k tokens cost k steps
    memory_bound = PassCosts(plain=1.0, single=1.05, per_draft=0.05)  # k tokens cost about one
    assert not PassCosts(plain=1.0, single=1.02).never_pays(10)  # no verdict before drafts are timed
    assert compute_bound.never_pays(10) and not memory_bound.never_pays(10)
    assert memory_bound.gain(8, accept=0.9, match=0.9) > 2
    assert memory_bound.gain(8, accept=0.05, match=0.5) < 1  # open-ended text: plain steps win
    assert PassCosts().known is False and PassCosts().never_pays(10) is False  # unmeasured: try


def test_shadow_scores_drafts_while_decoding_plainly() -> None:
    stats = Acceptance()
    lookup = PromptLookup([1, 2, 3, 4, 5, 1, 2])
    shadow = _Shadow(lookup, 3, stats)
    for token in (3, 4, 5, 1, 9):  # after (1, 2, 3) it drafts 4 5 1: all three right, then 9
        lookup.extend([token])
        shadow.see(token)
    assert stats.right > 3.0 and stats.rate > 0.7


def test_a_verdict_against_drafting_is_probed_again(engine: StarCoderEngine) -> None:
    """Costs that say drafts never pay (a drafted token at 1 s) are re-timed after enough plain
    choices: drafts are verified again, the fresh timings replace the stale verdict, same tokens."""
    ids = engine.encode(EDIT)
    model = engine.backend.model

    def run(costs: PassCosts | None, k: int) -> tuple[list[int], int]:
        def go():
            from mlx_lm.models.cache import make_prompt_cache

            cache = make_prompt_cache(model)
            model(mx.array(ids[:-1])[None], cache=cache)
            out, _, drafted = decode(
                model,
                cache,
                ids,
                max_tokens=640,
                drafter=PromptLookup(ids),
                k_max=k,
                costs=costs,
                emit=lambda token: False,
            )
            return out, drafted

        return engine.backend.call(go)

    stale = PassCosts(plain=1e-3, single=1e-3, per_draft=1.0)
    assert stale.known and stale.gain(10, accept=1.0, match=1.0) < 0.01
    plain, _ = run(None, 0)
    out, drafted = run(stale, 10)
    assert out == plain
    assert drafted > 0 and stale.known and stale.per_draft < 0.5  # timed afresh: far below 1 s


def test_a_verdict_against_speculation_expires_ever_more_rarely() -> None:
    """never_pays (asked once a request) lets a request through to be probed afresh now and then,
    with gaps that double; until the fresh timings are in, requests go through."""
    costs = PassCosts(plain=1.0, single=1.02, per_draft=1.0)  # k tokens cost k steps

    def requests_until_one_goes_through() -> int:
        n = 1
        while costs.never_pays(10) and n < 10_000:  # bounded: a verdict that never expires fails
            n += 1
        assert not costs.known and not costs.never_pays(10)  # waited-pass timings dropped
        for _ in range(costs.needed):  # what the request's probes time
            costs.note(0, 1.02, pipelined=False)
            costs.note(4, 1.02 + 4.0, pipelined=False)
        return n

    assert [requests_until_one_goes_through() for _ in range(3)] == [128, 256, 512]
    assert costs.never_pays(10)  # the same verdict, from fresh timings


def test_costs_are_means_that_count_slow_passes() -> None:
    """A third of the steps slowed down (a busy machine) moves the cost a mean says, not a median's;
    the slowest eighth (a pause) is left out."""
    costs = PassCosts()
    for seconds in [1.0] * 20 + [3.0] * 8 + [100.0] * 4:
        costs.note(0, seconds, pipelined=True)
    assert costs.plain == pytest.approx((20 * 1.0 + 8 * 3.0) / 28)
