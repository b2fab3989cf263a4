"""The typed load options (``MLXOptions``, ``LlamaCppOptions``, ``RemoteOptions``): each refuses a bad
value when it is made; ``load``'s and ``connect``'s keyword form builds the same options, and refuses a
keyword of another backend, naming it, the backend chosen and the one that takes it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from langchain_starcoder import (
    InvalidParameterError,
    LlamaCppOptions,
    MLXOptions,
    RemoteOptions,
    StarCoderEngine,
)
from langchain_starcoder.backends import managed_llama
from langchain_starcoder.engine.options import load_options, misplaced, remote_options

# --- each options class checks its own fields --------------------------------------------------


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"quantize": 3}, "quantize"),
        ({"dtype": "float64"}, "dtype"),
        ({"group_size": 48, "quantize": 4}, "group_size"),
        ({"kv_bits": 2}, "kv_bits"),
        ({"max_prompt_caches": -1}, "max_prompt_caches must be an integer >= 0"),
        ({"max_prompt_cache_bytes": 1.5}, "max_prompt_cache_bytes must be an integer >= 0 or None"),
        ({"prefill_step_size": 0}, "prefill_step_size must be a positive integer or None"),
        ({"max_prompt_cache_dir_bytes": -1}, "max_prompt_cache_dir_bytes must be an integer >= 0"),
        ({"num_draft_tokens": 0}, "num_draft_tokens must be an integer from 1 to 64"),
        ({"num_draft_tokens": True}, "num_draft_tokens must be an integer"),
    ],
)
def test_bad_options(tiny_path: Path, options: dict, match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        MLXOptions(**options)
    with pytest.raises(InvalidParameterError, match=match):  # the keyword form: the same check
        StarCoderEngine.load(tiny_path, **options)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"slots": 0}, "slots"),
        ({"threads": 1.5}, "llama_cpp threads must be a whole number >= 1 or None"),
        ({"context": True}, "llama_cpp context must be a whole number"),
        ({"outtype": "q2_k"}, "outtype must be auto, f32, f16, q8_0 or q4_0"),
        ({"server_args": [1]}, "server_args must be strings"),
        *(
            ({"server_args": own}, f"server_args may not set {own[0].split('=')[0]}")
            for own in (
                ("--host", "0.0.0.0"),
                ("--api-key=x",),
                ("--api-key-file", "/tmp/k"),
            )
        ),
    ],
)
def test_bad_llama_cpp_options(tiny_path: Path, options: dict, match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        LlamaCppOptions(**options)
    with pytest.raises(InvalidParameterError, match=match):
        StarCoderEngine.load(tiny_path, backend="llama.cpp", llama_cpp=options)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"timeout": 0}, "timeout must be a positive number of seconds, not 0"),
        ({"timeout": True}, "timeout must be a positive number of seconds, not True"),
        ({"deadline": float("inf")}, "deadline must be a positive number of seconds, not inf"),
        ({"deadline": -1}, "deadline must be a positive number of seconds"),
        ({"max_retries": -1}, "max_retries must be an integer >= 0, not -1"),
        ({"max_retries": 1.0}, "max_retries must be an integer >= 0"),
        ({"max_concurrency": 0}, "max_concurrency must be an integer >= 1, not 0"),
    ],
)
def test_bad_remote_options(options: dict, match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        RemoteOptions(**options)
    with pytest.raises(InvalidParameterError, match=match):  # before the tokenizer or the server
        StarCoderEngine.connect("http://127.0.0.1:9", model="nowhere", **options)


def test_options_are_frozen_hashable_values_that_hide_the_key() -> None:
    assert MLXOptions(quantize=4) == MLXOptions(quantize=4) != MLXOptions(quantize=8)
    assert len({MLXOptions(), MLXOptions(), LlamaCppOptions(), RemoteOptions()}) == 3
    assert LlamaCppOptions(server_args=["--cache-ram", "0"]).server_args == ("--cache-ram", "0")
    assert hash(LlamaCppOptions(server_args=["-v"])) == hash(LlamaCppOptions(server_args=("-v",)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        MLXOptions().quantize = 4  # type: ignore[misc]
    assert "sk-secret" not in repr(RemoteOptions(api_key="sk-secret"))


def test_the_server_settings_are_the_managed_servers() -> None:
    """LlamaCppOptions has every field of the managed server's settings, with its default."""
    server = {f.name: f.default for f in dataclasses.fields(managed_llama.LlamaCppOptions)}
    ours = {f.name: f.default for f in dataclasses.fields(LlamaCppOptions)}
    assert server.items() <= ours.items()
    assert set(ours) - set(server) == {"revision", "gguf_file", "adapter_path"}


# --- the keyword form builds the same options ----------------------------------------------------


def test_keywords_build_the_typed_options() -> None:
    assert load_options() == MLXOptions()
    assert load_options(quantize=4, kv_bits=8, revision="abc") == MLXOptions(
        quantize=4, kv_bits=8, revision="abc"
    )
    typed = LlamaCppOptions(gguf_file="m.gguf", threads=8, slots=2)
    assert (
        load_options(backend="llama.cpp", gguf_file="m.gguf", llama_cpp={"threads": 8, "slots": 2}) == typed
    )
    assert load_options(backend="llama.cpp", gguf_file="m.gguf", threads=8, slots=2) == typed
    server = managed_llama.LlamaCppOptions(threads=8, slots=2)
    assert load_options(backend="llama.cpp", gguf_file="m.gguf", llama_cpp=server) == typed
    assert load_options(options=typed) is typed
    assert load_options(options=typed, backend="llama.cpp") is typed
    assert remote_options(timeout=5, api_key="k") == RemoteOptions(timeout=5, api_key="k")


def test_a_setting_at_its_default_is_no_mismatch() -> None:
    """The wrappers pass every load field; with llama.cpp those of MLX are at their defaults."""
    settings = {
        "quantize": None,
        "dtype": "auto",
        "kv_bits": None,
        "gguf_file": None,
        "prompt_cache_dir": None,
    }
    assert load_options(backend="llama.cpp", **settings) == LlamaCppOptions()
    assert misplaced(LlamaCppOptions, settings) == {}
    assert misplaced(RemoteOptions, {**settings, "threads": None, "inexact_past_window": True}) == {}


@pytest.mark.parametrize(
    ("keywords", "match"),
    [
        (
            {"backend": "llama.cpp", "quantize": 4},
            r"\['quantize'\] apply to the MLX backend \(backend=\"mlx\", "
            r"MLXOptions\), not to backend=\"llama\.cpp\"",
        ),
        (
            {"backend": "llama.cpp", "kv_bits": 8, "dtype": "float16"},
            r"\['dtype', 'kv_bits'\] apply to the MLX",
        ),
        (
            {"backend": "llama.cpp", "prompt_cache_dir": "x"},
            r"\['prompt_cache_dir'\] apply to the MLX backend",
        ),
        ({"backend": "llama.cpp", "draft_model": "x"}, r"\['draft_model'\] apply to the MLX backend"),
        (
            {"threads": 2},
            r"\['threads'\] apply to the llama\.cpp backend \(backend=\"llama\.cpp\", "
            r"LlamaCppOptions\), not to backend=\"mlx\"",
        ),
        ({"inexact_past_window": True}, r"\['inexact_past_window'\] apply to the llama\.cpp backend"),
        ({"timeout": 5}, r"\['timeout'\] apply to a model served elsewhere \(StarCoderEngine\.connect"),
        (
            {"backend": "llama.cpp", "quantize": 4, "timeout": 5},
            r"\['quantize'\] apply to the MLX backend .*; "
            r"\['timeout'\] apply to a model served elsewhere .*, not to backend=\"llama\.cpp\"",
        ),
    ],
)
def test_a_keyword_of_another_backend_is_refused(tiny_path: Path, keywords: dict, match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        StarCoderEngine.load(tiny_path, **keywords)


def test_a_local_keyword_given_to_connect_is_refused() -> None:
    match = r"\['quantize'\] apply to the MLX backend .*, not to StarCoderEngine\.connect"
    with pytest.raises(InvalidParameterError, match=match):
        StarCoderEngine.connect("http://127.0.0.1:9", model="nowhere", quantize=4)


def test_bad_settings_are_refused(tiny_path: Path) -> None:
    """(From test_managed_llama: refused before the llama-server binary or the checkpoint is used.)"""
    with pytest.raises(InvalidParameterError, match=r'"mlx" or "llama\.cpp"'):
        StarCoderEngine.load(tiny_path, backend="vllm")
    with pytest.raises(InvalidParameterError, match="apply to the MLX backend"):
        StarCoderEngine.load(tiny_path, backend="llama.cpp", quantize=4)
    with pytest.raises(InvalidParameterError, match="slots"):
        StarCoderEngine.load(tiny_path, backend="llama.cpp", llama_cpp={"slots": 0})
    with pytest.raises(InvalidParameterError, match=r'apply to backend="llama\.cpp"'):
        StarCoderEngine.load(tiny_path, llama_cpp={"slots": 2})
    for own in (("--host", "0.0.0.0"), ("--api-key=x",), ("--api-key-file", "/tmp/k")):
        with pytest.raises(InvalidParameterError, match=f"server_args may not set {own[0].split('=')[0]}"):
            StarCoderEngine.load(tiny_path, backend="llama.cpp", llama_cpp={"server_args": own})


def test_options_and_keywords_do_not_mix(tiny_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match=r"not both: \['quantize'\] beside MLXOptions"):
        StarCoderEngine.load(tiny_path, options=MLXOptions(), quantize=4)
    with pytest.raises(
        InvalidParameterError, match=r"not both: \['backend=\"llama\.cpp\"'\] beside MLXOptions"
    ):
        StarCoderEngine.load(tiny_path, options=MLXOptions(), backend="llama.cpp")
    with pytest.raises(InvalidParameterError, match=r"not both: \['llama_cpp'\]"):
        StarCoderEngine.load(tiny_path, options=LlamaCppOptions(), llama_cpp={"slots": 2})
    with pytest.raises(InvalidParameterError, match=r"not both: \['timeout'\] beside RemoteOptions"):
        StarCoderEngine.connect("http://127.0.0.1:9", model="m", options=RemoteOptions(), timeout=5)
    with pytest.raises(
        InvalidParameterError, match="options must be MLXOptions or LlamaCppOptions, not RemoteOptions"
    ):
        StarCoderEngine.load(tiny_path, options=RemoteOptions())
    with pytest.raises(InvalidParameterError, match="options must be RemoteOptions, not MLXOptions"):
        StarCoderEngine.connect("http://127.0.0.1:9", model="m", options=MLXOptions())
    with pytest.raises(InvalidParameterError, match=r"\['threads'\] are given twice"):
        StarCoderEngine.load(tiny_path, backend="llama.cpp", threads=2, llama_cpp={"threads": 3})
    with pytest.raises(InvalidParameterError, match="llama_cpp must be a dict or LlamaCppOptions, not list"):
        StarCoderEngine.load(tiny_path, backend="llama.cpp", llama_cpp=[("threads", 2)])


def test_an_unknown_keyword_is_a_type_error(tiny_path: Path) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'quantise'"):
        StarCoderEngine.load(tiny_path, quantise=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'timeout_s'"):
        StarCoderEngine.connect("http://127.0.0.1:9", model="m", timeout_s=5)


# --- loading with typed options --------------------------------------------------------------------


def test_load_takes_typed_options(tiny_path: Path) -> None:
    engine = StarCoderEngine.load(
        tiny_path, options=MLXOptions(max_prompt_caches=1, max_prompt_cache_bytes=1000)
    )
    try:
        assert (engine.backend._prompt_caches.max_entries, engine.backend._prompt_caches.max_bytes) == (
            1,
            1000,
        )
        keyword = StarCoderEngine.load(tiny_path, max_prompt_caches=1, max_prompt_cache_bytes=1000)
        try:
            prompt = "def add(a, b):\n"
            assert (
                engine.generate(prompt, max_tokens=6).token_ids
                == keyword.generate(prompt, max_tokens=6).token_ids
            )
        finally:
            keyword.close()
    finally:
        engine.close()
