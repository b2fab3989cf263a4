"""Tenants (issue 38, items 3-5): each API key, and each ``cache_salt`` inside one, has a prompt cache of its
own, so the cached-token counts never tell one user what another has sent. A real uvicorn server over the
tiny checkpoint; the review's PIN oracle tried over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.errors import InvalidParameterError
from langchain_starcoder.server import create_app
from langchain_starcoder.server.tenants import MAX_SALT_CHARS
from langchain_starcoder.testing.servers import ServerThread

CAROL = "PIN = '2958'\n\n\ndef check(pin):\n    return pin == "
SUFFIX = "\n"
LONG_TEXT = "".join(f"def f_{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(40))


@pytest.fixture(scope="module")
def keyed(tiny_engine: StarCoderEngine) -> Iterator[str]:
    running = ServerThread(create_app(tiny_engine, api_key=["alice-key", "bob-key"]))
    yield running.url
    running.stop()


@pytest.fixture(scope="module")
def open_server(tiny_engine: StarCoderEngine) -> Iterator[str]:
    running = ServerThread(create_app(tiny_engine))
    yield running.url
    running.stop()


def _post(url: str, body: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    reply = httpx.post(url, json=body, headers=headers, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _infill(url: str, prefix: str, key: str | None = None, **more: Any) -> dict[str, Any]:
    body = {"input_prefix": prefix, "input_suffix": SUFFIX, "file_path": "carol.py", "n_predict": 2, **more}
    return _post(f"{url}/infill", body, key)


def _guesses(url: str, key: str | None, **more: Any) -> dict[str, int]:
    """The review's attack: B tries each first digit of A's PIN and reads ``tokens_cached``. B's first
    request primes B's own cache, so each guess shares as much with B's earlier ones."""
    _infill(url, "PIN = 'x", key, **more)
    return {digit: _infill(url, f"PIN = '{digit}", key, **more)["tokens_cached"] for digit in "0123456789"}


def test_another_key_learns_nothing_from_the_cached_counts(keyed, tiny_engine):
    tiny_engine.clear_cache()
    _infill(keyed, CAROL, "alice-key")
    # A's own cache serves A: the same request again is cached up to its last token.
    again = _infill(keyed, CAROL, "alice-key")
    assert again["tokens_cached"] >= again["tokens_evaluated"] - 1
    counts = _guesses(keyed, "bob-key")
    assert len(set(counts.values())) == 1, counts  # the right digit, 2, is not told apart


def test_another_cache_salt_learns_nothing_and_the_same_salt_shares(open_server, tiny_engine):
    """vLLM's ``cache_salt``: a server without keys (one tenant) still keeps two salts apart."""
    tiny_engine.clear_cache()
    _infill(open_server, CAROL, cache_salt="alice's salt")
    shared = _infill(open_server, "PIN = '2", cache_salt="alice's salt")  # the same salt: one cache
    counts = _guesses(open_server, None, cache_salt="bob's salt")
    assert len(set(counts.values())) == 1, counts
    assert shared["tokens_cached"] > counts["2"]


def test_the_unpartitioned_oracle_is_what_the_salt_closes(open_server, tiny_engine):
    """The premise: without keys or salts the one shared cache does tell the digit (so the tests above
    would see it, were the partition missing)."""
    tiny_engine.clear_cache()
    _infill(open_server, CAROL)
    counts = _guesses(open_server, None)
    assert counts["2"] > max(count for digit, count in counts.items() if digit != "2"), counts


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/completion"])
def test_every_generating_endpoint_keeps_tenants_caches_apart(keyed, tiny_engine, endpoint):
    tiny_engine.clear_cache()
    body: dict[str, Any] = {"prompt": LONG_TEXT, "max_tokens": 2, "n_predict": 2, "temperature": 0}

    def cached(key: str) -> int:
        got = _post(f"{keyed}{endpoint}", body, key)
        if endpoint == "/completion":
            return got["tokens_cached"]
        return got["usage"]["prompt_tokens_details"]["cached_tokens"]

    cached("alice-key")
    assert cached("bob-key") == 0
    assert cached("alice-key") > 0


@pytest.mark.parametrize(
    "salt", [5, "", "x" * (MAX_SALT_CHARS + 1), ["a"]], ids=["int", "empty", "long", "list"]
)
@pytest.mark.parametrize("endpoint", ["/v1/completions", "/infill", "/completion"])
def test_a_bad_cache_salt_is_a_400(open_server, endpoint, salt):
    body = {"prompt": "x = ", "input_prefix": "x = ", "max_tokens": 1, "n_predict": 1, "cache_salt": salt}
    reply = httpx.post(f"{open_server}{endpoint}", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "cache_salt"
    assert httpx.get(f"{open_server}/health", timeout=10).status_code == 200


def test_the_prompt_cache_on_disk_is_partitioned_too(tiny_path: Path, tmp_path: Path):
    """A long prompt's cache kept on disk by tenant A does not serve tenant B after the memory is cleared."""
    engine = StarCoderEngine.load(tiny_path, prompt_cache_dir=tmp_path / "caches")
    running = ServerThread(create_app(engine, api_key=["alice-key", "bob-key"]))
    try:
        body = {"prompt": LONG_TEXT, "max_tokens": 1, "temperature": 0}
        first = _post(f"{running.url}/v1/completions", body, "alice-key")
        assert first["usage"]["prompt_tokens"] >= 256  # long enough to be kept on disk
        engine.clear_cache()
        bob = _post(f"{running.url}/v1/completions", body, "bob-key")
        assert bob["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        engine.clear_cache()
        alice = _post(f"{running.url}/v1/completions", body, "alice-key")
        assert alice["usage"]["prompt_tokens_details"]["cached_tokens"] >= 256  # from A's file on disk
    finally:
        running.stop()
        engine.close()


@pytest.mark.parametrize("keys", [[1], b"key", 5], ids=["list of int", "bytes", "int"])
def test_keys_that_are_not_strings_are_refused_when_the_app_is_made(tiny_engine, keys):
    with pytest.raises(InvalidParameterError, match="api_key must be a string or a list of strings"):
        create_app(tiny_engine, api_key=keys)
