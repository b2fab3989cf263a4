"""The Jupyter server extension's configuration (``StarCoderJupyter`` traitlets) and its one engine: made
from the configuration on first use, the same for every request, released when the server stops, and,
for a model that cannot be had, an error that says how to fix it (never random weights unasked)."""

from __future__ import annotations

from pathlib import Path

import pytest
from traitlets import TraitError
from traitlets.config import Config

from langchain_starcoder.editor.statuses import RequestError, status_of
from langchain_starcoder.jupyter.completer import FIX, NOTICE, Completer, EngineSettings, NoModelError
from langchain_starcoder.jupyter.config import StarCoderJupyter
from langchain_starcoder.testing import MODEL_ENV


def test_the_traitlets_are_the_engines_settings() -> None:
    config = Config()
    config.StarCoderJupyter.model = "/models/starcoder2"
    config.StarCoderJupyter.backend = "llama.cpp"
    config.StarCoderJupyter.gguf_file = "q4.gguf"
    config.StarCoderJupyter.offline_test_model = True
    settings = StarCoderJupyter(config=config).engine_settings()
    assert settings == EngineSettings(
        model="/models/starcoder2", backend="llama.cpp", gguf_file="q4.gguf", offline_test_model=True
    )
    assert StarCoderJupyter().engine_settings() == EngineSettings()  # random weights: never by default


@pytest.mark.parametrize(("trait", "value"), [("backend", "torch"), ("base_url", "file:///etc/passwd")])
def test_a_bad_setting_is_refused_when_the_server_starts(trait: str, value: str) -> None:
    config = Config()
    config.StarCoderJupyter[trait] = value
    with pytest.raises(TraitError):
        StarCoderJupyter(config=config)


def test_a_model_that_cannot_be_had_is_a_503_saying_how_to_fix_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MODEL_ENV, str(tmp_path / "not-this-either"))
    completer = Completer(str(tmp_path), EngineSettings(model=str(tmp_path / "missing")))
    for _ in range(2):  # each request is told, and the completer stays usable
        with pytest.raises(NoModelError) as caught:
            completer.engine()
        status = status_of(caught.value)  # what the handler answers
        assert status.status == 503 and str(tmp_path / "missing") in status.message and FIX in status.message
        assert caught.value.fields == status.fields == {"code": "no_model", "notice": NOTICE}
    assert len(NOTICE) <= 140  # JupyterLab's notification shows 140 characters


def test_one_engine_for_every_request_released_by_close(tiny_path: Path, tmp_path: Path) -> None:
    completer = Completer(str(tmp_path), EngineSettings(model=str(tiny_path)))
    engine = completer.engine()
    assert completer.engine() is engine
    closed: list[bool] = []
    close = engine.backend.close
    engine.backend.close = lambda: (closed.append(True), close())[1]  # type: ignore[method-assign]
    completer.close()
    assert closed == [True]
    with pytest.raises(RequestError) as caught:
        completer.engine()  # a request while the server stops: refused, nothing loaded again
    assert caught.value.status == 503
