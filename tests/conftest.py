"""Shared fixtures: small StarCoder2 checkpoints built offline once per test session."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.gguf_format.cache import CACHE_ENV
from langchain_starcoder.testing import INSTRUCT_CHAT_TEMPLATE, build_starcoder2
from langchain_starcoder.testing.vllm_server import VLLMServer

#: The context of the checkpoint vLLM serves (the small preset's is 2,048).
VLLM_CONTEXT = 16384

# Tests never touch the network: the hub client must fail fast instead of trying.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def _prompt_caches_off_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``serve`` keeps prompt caches in the user's cache folder by default: in tests (and their
    subprocesses) they go to a temporary folder instead."""
    os.environ["LANGCHAIN_STARCODER_PROMPT_CACHE_DIR"] = str(tmp_path_factory.mktemp("prompt-cache-home"))


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="session")
def tiny_path(checkpoints: Path) -> Path:
    """The "tiny" preset: 2 layers, hidden 64, vocab 1024, window 512, context 2048."""
    return build_starcoder2(checkpoints / "tiny")


@pytest.fixture(scope="session")
def small_path(checkpoints: Path) -> Path:
    """The "small" preset: head_dim 64, so a quantized KV cache (kv_bits) can be used."""
    return build_starcoder2(checkpoints / "small", preset="small")


@pytest.fixture(scope="session")
def window_path(checkpoints: Path) -> Path:
    """A tiny checkpoint whose sliding window (16) is much shorter than test prompts."""
    return build_starcoder2(checkpoints / "window16", sliding_window=16, seed=1)


@pytest.fixture(scope="session")
def chat_path(checkpoints: Path) -> Path:
    """A tiny instruct checkpoint with a chat template shaped like starcoder2-15b-instruct's."""
    return build_starcoder2(checkpoints / "chat", chat_template=INSTRUCT_CHAT_TEMPLATE, seed=2)


def clean_copy(source: Path, dest: Path) -> Path:
    """A copy of ``source`` with the output rows of control tokens and of tokens that are not UTF-8 on
    their own set to zero, so its greedy text is always valid UTF-8 and runs to ``max_tokens``, as a
    trained model's mostly does. Random weights otherwise write stray bytes in most generations,
    whose ids llama-server does not stream (see RemoteBackend's token_bytes), and llama-server ends
    any generation at ``<fim_pad>`` (in its end-of-generation set), where a plain completion goes on."""
    import mlx.core as mx

    from langchain_starcoder.engine import _token_bytes
    from langchain_starcoder.loading import load_tokenizer, read_config

    path = Path(shutil.copytree(source, dest))
    tokenizer = load_tokenizer(path, read_config(path))
    broken = [i for b, i in _token_bytes(tokenizer).items() if not _is_utf8(b)]
    rows = sorted({*broken, *tokenizer.all_special_ids})
    weights = mx.load(str(path / "model.safetensors"))
    head = np.array(weights["lm_head.weight"])
    head[rows] = 0.0
    weights["lm_head.weight"] = mx.array(head)
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "pt"})
    return path


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.fixture(scope="session")
def clean_path(tiny_path: Path, checkpoints: Path) -> Path:
    """The tiny checkpoint, cleaned (:func:`clean_copy`): what the real llama-server serves."""
    return clean_copy(tiny_path, checkpoints / "tiny-clean")


@pytest.fixture(scope="session")
def vllm_path(small_path: Path, checkpoints: Path) -> Path:
    """The small checkpoint, cleaned (:func:`clean_copy`): what the real vLLM serves (its CPU attention
    takes head size 64, not the tiny preset's 16, which kills its engine on the first request), with a
    context of VLLM_CONTEXT tokens: a generation of thousands outlasts a slow first chunk there."""
    path = clean_copy(small_path, checkpoints / "small-clean")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": VLLM_CONTEXT}))
    return path


@pytest.fixture(scope="session")
def vllm_launched(
    vllm_path: Path, pytestconfig: pytest.Config, request: pytest.FixtureRequest
) -> Iterator[VLLMServer]:
    """A real vLLM server (the CPU build in .venv-vllm), launched once per session: stopped at the end."""
    server = VLLMServer(vllm_path, venv=pytestconfig.rootpath / ".venv-vllm", max_model_len=VLLM_CONTEXT)
    server.launch()
    request.session.vllm_server = server  # for the failure reports
    yield server
    server.stop()


@pytest.fixture(scope="session", autouse=True)
def _launch_vllm_early(request: pytest.FixtureRequest) -> None:
    """vLLM loads for about a minute: when the session holds tests marked ``vllm``, it loads while
    the tests before them run."""
    if any(item.get_closest_marker("vllm") for item in request.session.items):
        # A launch that fails (vLLM not installed) fails the vllm tests, which get the same error
        # from the fixture, not every test of the session.
        with contextlib.suppress(Exception):
            request.getfixturevalue("vllm_launched")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failed test against vLLM shows the end of the server's log."""
    report = yield
    server = getattr(item.session, "vllm_server", None)
    if report.failed and server is not None and item.get_closest_marker("vllm"):
        report.sections.append(("vLLM's log (end)", server.log_tail()))
    return report


@pytest.fixture
def vllm_server(vllm_launched: VLLMServer) -> VLLMServer:
    """The session's vLLM server, ready (and started again if a fault test stopped it)."""
    if vllm_launched.proc is None or vllm_launched.proc.poll() is not None:
        vllm_launched.launch()
    vllm_launched.wait()
    return vllm_launched


@pytest.fixture(scope="module")
def gguf_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The GGUF cache in a temporary folder for one test module (engines find it through the environment)."""
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("gguf-cache")
        patch.setenv(CACHE_ENV, str(path))
        yield path


@pytest.fixture(scope="session")
def tiny_engine(tiny_path: Path) -> StarCoderEngine:
    engine = StarCoderEngine.load(tiny_path)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def window_engine(window_path: Path) -> StarCoderEngine:
    engine = StarCoderEngine.load(window_path)
    yield engine
    engine.close()


class BackendSpy:
    """What an engine hands its backend (the ids the model is fed): every generation, its prompt, and
    how many generations each submit held. The lists are live: they fill as the engine works."""

    def __init__(self) -> None:
        self.generations: list = []
        self.prompts: list[list[int]] = []
        self.calls: list[int] = []

    def take(self) -> list[list[int]]:
        """The prompts so far; then start afresh."""
        prompts = list(self.prompts)
        for recorded in (self.generations, self.prompts, self.calls):
            recorded.clear()
        return prompts


@pytest.fixture
def backend_spy(monkeypatch: pytest.MonkeyPatch):
    """``backend_spy(engine)`` records what ``engine`` submits from then on (the backend still runs)."""

    def watch(engine: StarCoderEngine) -> BackendSpy:
        spy = BackendSpy()
        submit = engine.backend.submit

        def recording(generations):
            spy.generations.extend(generations)
            spy.prompts.extend(list(g.prompt) for g in generations)
            spy.calls.append(len(generations))
            return submit(generations)

        monkeypatch.setattr(engine.backend, "submit", recording)
        return spy

    return watch
