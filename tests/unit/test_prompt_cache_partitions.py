"""The prompt cache's partitions (issue 38, tenants): a request reuses, and counts, only KV computed
under its own ``cache_salt`` (None is a partition of its own), in memory and on disk, with plain,
speculative and warm-up requests alike; a count no longer tells one partition another's prompt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from langchain_starcoder import StarCoderEngine, StarCoderLLM
from langchain_starcoder._registry import release_engines
from langchain_starcoder.backends.prompt_cache.disk import MIN_NEW_TOKENS
from langchain_starcoder.errors import InvalidParameterError
from langchain_starcoder.types import CachePartition, GenerationParams

PROMPT = "def area(radius):\n    return 3.14159 * radius * radius\n\ndef perimeter(radius):\n    return "
#: A victim's file: the attacker knows all of it but the PIN (issue 38, item 5).
SECRET = "# carol.py\nimport os\n\nPIN = '{}'\nACCOUNT = 'carol'\n\ndef login():\n    return check(PIN)\n"
#: Long enough for a file of its own on disk (MIN_NEW_TOKENS), and past the tiny model's window.
LONG = "".join(f"def handler_{i}(request):\n    return respond(request, code={i * 7})\n" for i in range(36))


@pytest.fixture
def engine(tiny_path: Path) -> Iterator[StarCoderEngine]:
    """An engine of its own, keeping enough caches that no test's entries evict another's."""
    engine = StarCoderEngine.load(tiny_path, max_prompt_caches=64)
    yield engine
    engine.close()


def cached(engine: StarCoderEngine, prompt: str, salt: str | None, **settings: object) -> int:
    return engine.generate(prompt, max_tokens=3, cache_salt=salt, **settings).cached_tokens


def test_the_setting_is_checked_and_names_a_partition() -> None:
    assert GenerationParams.create(cache_salt="a").partition == CachePartition("a") != CachePartition()
    assert GenerationParams.create().partition.is_default
    assert "salty" not in CachePartition("salty").digest != CachePartition().digest
    for bad in ("", 3, b"a", "\ud800"):
        with pytest.raises(InvalidParameterError, match="cache_salt"):
            GenerationParams.create(cache_salt=bad)


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "prompt-lookup"])
def test_only_the_same_salt_reuses(engine: StarCoderEngine, speculative: bool) -> None:
    settings = {"prompt_lookup_num_tokens": 4} if speculative else {}
    assert cached(engine, PROMPT, "alice", **settings) == 0
    prompt_tokens = len(engine.encode(PROMPT))
    assert cached(engine, PROMPT, "alice", **settings) == prompt_tokens - 1  # all but the last token
    assert cached(engine, PROMPT, "bob", **settings) == 0
    assert cached(engine, PROMPT, None, **settings) == 0  # None is a partition of its own
    assert cached(engine, PROMPT, None, **settings) == prompt_tokens - 1
    assert cached(engine, PROMPT, "bob", **settings) == prompt_tokens - 1  # each kept its own
    assert cached(engine, PROMPT, "alice", **settings) == prompt_tokens - 1


def test_a_warm_up_fills_only_its_own_partition(engine: StarCoderEngine) -> None:
    """A warm-up (one token, as the server's n_predict 0) caches for its salt alone."""
    engine.generate(PROMPT, max_tokens=1, cache_salt="alice")
    assert engine.generate(PROMPT + "2", max_tokens=1, cache_salt="bob").cached_tokens == 0
    assert engine.generate(PROMPT + "2", max_tokens=1, cache_salt="alice").cached_tokens > 0


def test_the_pin_oracle_answers_the_same_for_every_guess(engine: StarCoderEngine) -> None:
    """Issue 38 item 5 at the engine: the victim's prompt is cached under its salt; an attacker who
    guesses the PIN's first digit under another salt sees one count for every guess. Under the
    victim's own salt the right guess stands out: the count is an oracle there (the control)."""
    engine.generate(SECRET.format("2958"), max_tokens=3, cache_salt="alice")
    # Each guess: the known text up to the PIN, a digit, and the quote after it (a token of its own),
    # so a right digit would be a cached token (a prompt's last token never is).
    guesses = [SECRET.format(digit)[: SECRET.index("{") + 2] for digit in "0123456789"]
    head = SECRET[: SECRET.index("{")]
    engine.generate(head, max_tokens=1, cache_salt="mallory")  # the attacker's own copy of the known part
    counts = [cached(engine, guess, "mallory") for guess in guesses]
    assert len(set(counts)) == 1, counts
    own = [cached(engine, guess, "alice") for guess in guesses]
    assert own[2] > max(own[:2] + own[3:]), own


def test_the_bounds_stay_global(tiny_path: Path) -> None:
    engine = StarCoderEngine.load(tiny_path, max_prompt_caches=2)
    try:
        for salt in ("a", "b", "c", None):
            engine.generate(PROMPT, max_tokens=2, cache_salt=salt)
        assert len(engine.backend._prompt_caches) == 2  # one LRU for every partition
        assert cached(engine, PROMPT, "a") == 0  # the oldest went first
        assert cached(engine, PROMPT, None) > 0
    finally:
        engine.close()


def test_disk_files_are_kept_per_salt(tiny_path: Path, tmp_path: Path) -> None:
    """A file written under one salt is never read for another (nor for None), a new process's
    memory being empty; it records a digest, never the salt."""
    salt = "tenant-7f3a-secret-salt"
    first = StarCoderEngine.load(tiny_path, prompt_cache_dir=tmp_path)
    assert len(first.encode(LONG)) > MIN_NEW_TOKENS
    first.generate(LONG, max_tokens=3, cache_salt=salt)
    first.close()  # (the queued write lands first)
    (file,) = tmp_path.glob("*.safetensors")
    assert salt.encode() not in file.read_bytes()
    for other in ("another-salt", None):
        engine = StarCoderEngine.load(tiny_path, prompt_cache_dir=tmp_path)
        try:
            assert engine.generate(LONG, max_tokens=3, cache_salt=other).cached_tokens == 0
        finally:
            engine.close()
    again = StarCoderEngine.load(tiny_path, prompt_cache_dir=tmp_path)
    try:
        assert again.generate(LONG, max_tokens=3, cache_salt=salt).cached_tokens > MIN_NEW_TOKENS
    finally:
        again.close()
    assert len(list(tmp_path.glob("*.safetensors"))) == 3  # one per partition, none read across


def test_the_wrappers_pass_the_salt(tiny_path: Path) -> None:
    """A wrapper's ``cache_salt`` field, and a call's own, reach the engine."""
    llm = StarCoderLLM(model=str(tiny_path), max_tokens=2, cache_salt="alice")
    try:
        first = llm.generate([PROMPT]).generations[0][0].generation_info
        again = llm.generate([PROMPT]).generations[0][0].generation_info
        other = llm.generate([PROMPT], cache_salt="bob").generations[0][0].generation_info
        assert (first["cached_tokens"], other["cached_tokens"]) == (0, 0) and again["cached_tokens"] > 0
    finally:
        release_engines()
