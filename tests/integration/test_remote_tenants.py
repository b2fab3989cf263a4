"""The prompt cache's partitions (``cache_salt``, issue 38) on the remote backend's real servers.

llama.cpp's ``llama-server`` has no salt (its slots and its RAM cache match by token prefix alone): a
request reuses its KV only while every request the backend sent was of one partition, and from the
first of a second partition on none does (backends/remote/shared_cache.py). vLLM partitions its own
prefix cache by ``cache_salt``, which it is sent. Each llama.cpp test runs its own server: what another
test left in a server's cache is not this backend's to know.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.backends import Generation
from langchain_starcoder.backends.remote.llama_cpp import LlamaCpp
from langchain_starcoder.backends.remote.shared_cache import SharedCache
from langchain_starcoder.backends.remote.vllm import VLLM
from langchain_starcoder.server import create_app
from langchain_starcoder.testing.gguf import LlamaServer, write_gguf
from langchain_starcoder.testing.servers import ServerThread
from langchain_starcoder.testing.vllm_server import VLLMServer
from langchain_starcoder.types import GenerationParams

PROMPT = "def area(radius):\n    return 3.14159 * radius * radius\n\ndef perimeter(radius):\n    return "
#: A victim's file: the attacker knows all of it but the PIN (issue 38, item 5).
SECRET = "# carol.py\nimport os\n\nPIN = '{}'\nACCOUNT = 'carol'\n\ndef login():\n    return check(PIN)\n"


@pytest.fixture(scope="module")
def tiny_gguf(clean_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(clean_path, tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf")


@pytest.fixture
def remote(tiny_gguf: Path, clean_path: Path) -> Iterator[StarCoderEngine]:
    """An engine on a llama-server of its own (a fresh cache)."""
    with LlamaServer(tiny_gguf) as server:
        engine = StarCoderEngine.connect(server.url, model="tiny", tokenizer=clean_path, timeout=30)
        yield engine
        engine.close()


def cached(engine: StarCoderEngine, prompt: str, salt: str | None) -> int:
    return engine.generate(prompt, max_tokens=3, cache_salt=salt).cached_tokens


def test_llama_cpp_reuses_only_while_one_partition_uses_it(remote: StarCoderEngine) -> None:
    n = len(remote.encode(PROMPT))
    first = remote.generate(PROMPT, max_tokens=3, cache_salt="alice")
    assert first.cached_tokens == 0
    assert cached(remote, PROMPT, "alice") == n - 1  # one partition so far: the server's cache serves it
    other = remote.generate(PROMPT, max_tokens=3, cache_salt="bob")
    assert other.cached_tokens == 0 and other.token_ids == first.token_ids  # prefilled, same answer
    for salt in ("alice", "bob", None, "alice"):  # two partitions came: none reuses any more
        assert cached(remote, PROMPT, salt) == 0


def test_the_pin_oracle_answers_the_same_for_every_guess(remote: StarCoderEngine) -> None:
    """Issue 38 item 5 on llama.cpp: after the victim's request, every guess of another partition
    finds nothing cached."""
    remote.generate(SECRET.format("2958"), max_tokens=3, cache_salt="alice")
    # Each guess: the known text up to the PIN, a digit, and the quote after it (a token of its own),
    # so a right digit would be a cached token (a prompt's last token never is).
    guesses = [SECRET.format(digit)[: SECRET.index("{") + 2] for digit in "0123456789"]
    assert [cached(remote, guess, "mallory") for guess in guesses] == [0] * 10


def test_this_packages_server_partitions_by_the_salt_it_is_sent(tiny_path: Path) -> None:
    """This package's server speaks llama.cpp's protocol and takes ``cache_salt``: the remote backend
    sends it there, and every partition keeps its own cache (nothing is turned off)."""
    engine = StarCoderEngine.load(tiny_path)
    running = ServerThread(create_app(engine, model_name="tiny"))
    remote = StarCoderEngine.connect(running.url, model="tiny", tokenizer=str(tiny_path), max_retries=0)
    try:
        n = len(remote.encode(PROMPT))
        assert cached(remote, PROMPT, "alice") == 0
        assert cached(remote, PROMPT, "alice") == n - 1
        assert cached(remote, PROMPT, "bob") == 0
        assert cached(remote, PROMPT, None) == 0
        assert cached(remote, PROMPT, "alice") == cached(remote, PROMPT, "bob") == n - 1
    finally:
        remote.close()
        running.stop()
        engine.close()


def generation(salt: str | None) -> Generation:
    return Generation([1, 2, 3], GenerationParams.create(cache_salt=salt), sink=None)  # type: ignore[arg-type]


def test_a_second_partition_waits_for_the_reusing_requests_to_settle() -> None:
    """The first request of a second partition is sent only once every reusing request sent before
    it has begun (its first chunk) or ended: the server could otherwise run it first and hand its
    KV to one of them."""
    shared = SharedCache()
    owner, newcomer = generation("alice"), generation("bob")
    assert shared.admit(owner)
    answer: list[bool] = []
    waiting = threading.Thread(target=lambda: answer.append(shared.admit(newcomer)))
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive() and not answer  # the owner's request has not settled
    shared.settle(owner)
    waiting.join(10)
    assert answer == [False] and shared.mixed
    assert not shared.admit(generation("alice"))  # no request reuses KV from now on
    # A cancelled request does not wait.
    late = SharedCache()
    assert late.admit(generation(None))
    cancelled = generation("bob")
    cancelled.cancelled.set()
    assert not late.admit(cancelled)


def test_the_bodies_carry_the_salt_where_the_server_takes_it() -> None:
    transport = SimpleNamespace(base_url="http://127.0.0.1:1")
    salted, plain = GenerationParams.create(cache_salt="s1"), GenerationParams.create()
    assert VLLM(transport, 100, "tiny").body([1, 2], salted)["cache_salt"] == "s1"  # type: ignore[arg-type]
    assert "cache_salt" not in VLLM(transport, 100, "tiny").body([1, 2], plain)  # type: ignore[arg-type]
    # llama-server ignores it (its cache_prompt says what may be reused); this package's own server takes it.
    assert "cache_salt" not in LlamaCpp(transport, 100, {}).body([1, 2], salted)  # type: ignore[arg-type]
    ours = LlamaCpp(transport, 100, {}, salted=True)  # type: ignore[arg-type]
    assert ours.body([1, 2], salted)["cache_salt"] == salted.partition.digest != "s1"
    assert "cache_salt" not in ours.body([1, 2], plain)
    long = GenerationParams.create(cache_salt="s" * 10_000)  # past what our server takes (256)
    assert len(ours.body([1, 2], long)["cache_salt"]) == 32


@pytest.mark.vllm
def test_vllm_partitions_by_the_salt(vllm_server: VLLMServer, vllm_path: Path) -> None:
    """Different salts never share vLLM's cached blocks, the same salt does. ``vllm_server``, not the
    launched one: an earlier test (a kill, a load that outran its wait) may have stopped it."""
    engine = StarCoderEngine.connect(vllm_server.url, model="tiny", tokenizer=vllm_path, timeout=60)
    try:
        prompt = "# tenants\n" + "".join(f"def tenant_{i}(salt):\n    return salt * {i}\n" for i in range(40))
        blocks = (len(engine.encode(prompt)) - 1) // 128 * 128  # vLLM's CPU build caches 128-token blocks
        assert blocks > 0
        assert cached(engine, prompt, "alice") == 0
        assert cached(engine, prompt, "alice") == blocks
        assert cached(engine, prompt, "bob") == 0
        assert cached(engine, prompt, None) == 0
        assert cached(engine, prompt, "bob") == blocks
    finally:
        engine.close()
