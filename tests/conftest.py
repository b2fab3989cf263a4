"""Shared fixtures: small StarCoder2 checkpoints built offline once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.testing import INSTRUCT_CHAT_TEMPLATE, build_starcoder2

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
