"""The shared engine registry: one load per checkpoint and settings, never a stale failure."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from langchain_starcoder import InvalidParameterError, MLXOptions, ModelNotFoundError, StarCoderEngine
from langchain_starcoder._registry import get_engine, peek_engine
from langchain_starcoder.testing import copy_checkpoint


def test_one_load_for_many_threads(tmp_path: Path, tiny_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = copy_checkpoint(tiny_path, tmp_path / "shared")
    loads = []
    real_load = StarCoderEngine.load.__func__

    def counting_load(cls, *args, **kwargs):
        loads.append(args)
        return real_load(cls, *args, **kwargs)

    monkeypatch.setattr(StarCoderEngine, "load", classmethod(counting_load))
    assert peek_engine(path) is None
    with ThreadPoolExecutor(4) as pool:
        engines = list(pool.map(lambda _: get_engine(path), range(4)))
    assert len(loads) == 1 and all(e is engines[0] for e in engines)
    assert peek_engine(path) is engines[0]
    assert get_engine(path, revision="other") is not engines[0]  # the revision is part of the key
    assert len(loads) == 2


def test_a_failed_load_is_not_remembered(tmp_path: Path, tiny_path: Path) -> None:
    path = tmp_path / "later"
    with pytest.raises(ModelNotFoundError):
        get_engine(path)
    copy_checkpoint(tiny_path, path)  # the folder appears: the next call loads it
    assert get_engine(path).generate("def f():", max_tokens=2).completion_tokens >= 1


def test_the_key_is_the_typed_options(tmp_path: Path, tiny_path: Path) -> None:
    """Keywords (defaults written out or left out) and the typed options they make are one engine."""
    path = copy_checkpoint(tiny_path, tmp_path / "keyed")
    engine = get_engine(path)
    assert get_engine(path, quantize=None, dtype="auto", backend="mlx") is engine
    assert get_engine(path, options=MLXOptions()) is engine
    assert peek_engine(path, options=MLXOptions(max_prompt_caches=4)) is engine
    assert peek_engine(path, max_prompt_caches=2) is None
    assert get_engine(path, options=MLXOptions(max_prompt_caches=2)) is get_engine(path, max_prompt_caches=2)
    assert get_engine(path, max_prompt_caches=2) is not engine
    with pytest.raises(InvalidParameterError, match=r"\['threads'\] apply to the llama\.cpp backend"):
        get_engine(path, threads=2)
