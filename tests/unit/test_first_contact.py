"""What a new user meets first (issue 29, items 15 and 19): one notice at load when MLX would run a big
model on the CPU, naming the fast path; a remote engine that cannot fetch its tokenizer says
``tokenizer=``."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import mlx.core as mx
import pytest

from langchain_starcoder import StarCoderEngine, cli
from langchain_starcoder.engine import building
from langchain_starcoder.engine.building import SlowOnCPUNotice, parameter_count, slow_on_cpu
from langchain_starcoder.errors import ModelNotFoundError
from langchain_starcoder.loading import read_config
from langchain_starcoder.testing import PRESETS

ON_CPU = mx.default_device() == mx.cpu


def preset_config(name: str) -> dict:
    return {"model_type": "starcoder2", "tie_word_embeddings": True, **PRESETS[name]}


def test_the_decision_is_by_parameters_and_device() -> None:
    assert slow_on_cpu(building.SLOW_ON_CPU_PARAMETERS, on_cpu=True)
    assert not slow_on_cpu(building.SLOW_ON_CPU_PARAMETERS - 1, on_cpu=True)
    assert not slow_on_cpu(15_000_000_000, on_cpu=False)  # a GPU runs it at its own speed


def test_the_default_models_shape_counts_as_slow_and_the_test_presets_do_not() -> None:
    three_b = parameter_count(preset_config("3b"))
    assert 3.0e9 < three_b < 3.1e9  # starcoder2-3b: 3.03B
    assert slow_on_cpu(three_b, on_cpu=True)
    # A 4-bit copy runs the same shapes: counted unquantized, not by its packed words.
    assert parameter_count({**preset_config("3b"), "quantization": {"bits": 4, "group_size": 64}}) == three_b
    for small in ("tiny", "small"):
        assert not slow_on_cpu(parameter_count(preset_config(small)), on_cpu=True)


def test_the_count_is_the_checkpoints(tiny_path: Path, tiny_engine: StarCoderEngine) -> None:
    from mlx.utils import tree_flatten

    loaded = sum(a.size for _, a in tree_flatten(tiny_engine.backend.model.parameters()))
    assert parameter_count(read_config(tiny_path)) == loaded


def load_notices(path: Path) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        StarCoderEngine.load(path).close()
    return [w for w in caught if issubclass(w.category, SlowOnCPUNotice)]


def test_a_small_model_loads_without_the_notice(tiny_path: Path) -> None:
    assert load_notices(tiny_path) == []


def test_a_model_counted_as_big_gets_one_notice_naming_the_fast_path(
    tiny_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(building, "SLOW_ON_CPU_PARAMETERS", parameter_count(read_config(tiny_path)))
    notices = load_notices(tiny_path)
    assert len(notices) == (1 if ON_CPU else 0)
    if notices:
        message = str(notices[0].message)
        assert str(tiny_path) in message and "MLX runs it on the CPU" in message
        assert 'backend="llama.cpp"' in message and "--backend llama.cpp" in message
        assert "pip install -e '.[llama-cpp]'" in message  # the extra, as a checkout installs it
        # A float32 checkpoint on Linux's reference BLAS: OpenBLAS is named too.
        hint = building._reference_blas_float32(read_config(tiny_path))
        assert ("LANGCHAIN_STARCODER_BLAS=openblas" in message) == hint


def test_the_openblas_hint_is_for_unquantized_float32_on_the_reference_blas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    assert building._reference_blas_float32({"torch_dtype": "float32"})
    assert not building._reference_blas_float32({"torch_dtype": "bfloat16"})
    assert not building._reference_blas_float32({"quantization": {"bits": 4, "group_size": 64}})
    monkeypatch.setattr(sys, "platform", "darwin")  # MLX uses Accelerate there
    assert not building._reference_blas_float32({"torch_dtype": "float32"})
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr("langchain_starcoder._blas.active_blas", lambda: {"path": "libopenblas.so"})
    assert not building._reference_blas_float32({"torch_dtype": "float32"})


def test_the_notice_is_one_note_line_on_the_command_line(
    tiny_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setattr(building, "SLOW_ON_CPU_PARAMETERS", 1)
    assert cli.main(["generate", "--model", str(tiny_path), "--prompt", "def f():", "--max-tokens", "2"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "MLX runs it on the CPU" in line]
    assert notes == ([notes[0]] if ON_CPU else [])
    if ON_CPU:
        assert notes[0].startswith("langchain-starcoder: note: ") and 'backend="llama.cpp"' in notes[0]


# --- a remote engine's tokenizer -------------------------------------------------------------------


def test_a_tokenizer_that_cannot_be_fetched_names_tokenizer_in_the_error() -> None:
    """Offline (the tests run with HF_HUB_OFFLINE=1), the served name is no source for the tokenizer."""
    with pytest.raises(ModelNotFoundError) as caught:
        StarCoderEngine.connect("http://127.0.0.1:9", model="bigcode/not-in-any-cache")
    message = str(caught.value)
    assert "Could not fetch the tokenizer of 'bigcode/not-in-any-cache' from the hub" in message
    assert "Pass tokenizer=" in message and "--tokenizer" in message


def test_the_command_line_says_tokenizer_too(capsys) -> None:
    served = ["--base-url", "http://127.0.0.1:9", "--model", "bigcode/not-in-any-cache"]
    assert cli.main(["generate", *served, "--prompt", "x"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("langchain-starcoder: error: Could not fetch the tokenizer")
    assert "--tokenizer" in line
