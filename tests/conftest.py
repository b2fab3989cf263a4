"""Shared fixtures: small StarCoder2 checkpoints built offline once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.testing import INSTRUCT_CHAT_TEMPLATE, build_starcoder2

# Tests never touch the network: the hub client must fail fast instead of trying.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


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
