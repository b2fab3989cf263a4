"""Where a prompt-cache folder is given: the wrappers' ``prompt_cache_dir`` field and the command
line's ``--prompt-cache-dir`` (``serve``'s default folder is tested in tests/integration)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from langchain_starcoder import ChatStarCoder, StarCoderLLM, cli
from langchain_starcoder._registry import release_engines
from langchain_starcoder.cli.options import PROMPT_CACHE_ENV, default_prompt_cache_dir
from langchain_starcoder.llama_index import StarCoder

SHARED = "".join(f"def handler_{i}(request):\n    return respond(request, code={i * 7})\n" for i in range(36))


@pytest.fixture(autouse=True)
def _release() -> None:
    yield
    release_engines()  # each test's engines (and their folders) are its own


def test_the_llm_keeps_caches_in_its_folder(tiny_path: Path, tmp_path: Path) -> None:
    llm = StarCoderLLM(model=str(tiny_path), prompt_cache_dir=tmp_path, max_tokens=4)
    first = llm.invoke(SHARED)
    llm.engine.backend._disk.flush()  # written off the request's thread
    assert len(list(tmp_path.glob("*.safetensors"))) == 1
    assert "prompt_cache_dir" not in llm._identifying_params  # speed, not the answer: not a cache key
    release_engines()  # a new engine: its memory is empty, the folder is not
    again = StarCoderLLM(model=str(tiny_path), prompt_cache_dir=str(tmp_path), max_tokens=4)
    assert again.engine.generate(SHARED, max_tokens=4).cached_tokens > 0
    assert again.invoke(SHARED) == first


@pytest.mark.parametrize("wrapper", [StarCoderLLM, ChatStarCoder, StarCoder])
def test_every_wrapper_passes_the_folder_to_its_engine(wrapper, tiny_path: Path, tmp_path: Path) -> None:
    llm = wrapper(model=str(tiny_path), prompt_cache_dir=tmp_path)
    assert llm.engine.backend._disk.folder == tmp_path


def test_a_folder_with_a_remote_server_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="prompt_cache_dir"):
        StarCoderLLM(model="m", base_url="http://127.0.0.1:1", prompt_cache_dir=str(tmp_path))


def cached(err: str) -> int:
    m = re.search(r"prompt: \d+ tokens(?:, (\d+) cached)?", err)
    assert m, err
    return int(m.group(1) or 0)


def test_generate_and_infill_take_a_folder(
    capsys: pytest.CaptureFixture[str], tiny_path: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "cache"
    argv = ["generate", "--model", tiny_path, "--prompt-cache-dir", folder, "--max-tokens", "3"]
    assert cli.main([str(a) for a in [*argv, "--prompt", SHARED]]) == 0
    assert cached(capsys.readouterr().err) == 0
    assert cli.main([str(a) for a in [*argv, "--prompt", SHARED + "x = 1\n"]]) == 0  # a new engine
    assert cached(capsys.readouterr().err) > 0
    argv = ["infill", "--model", tiny_path, "--prompt-cache-dir", folder, "--max-tokens", "3"]
    for expect_hit in (False, True):
        assert cli.main([str(a) for a in [*argv, "--prefix", "# top\n" + SHARED, "--suffix", "\n"]]) == 0
        assert (cached(capsys.readouterr().err) > 0) is expect_hit


def test_a_damaged_file_is_one_note_line(
    capsys: pytest.CaptureFixture[str], tiny_path: Path, tmp_path: Path
) -> None:
    argv = [
        "generate",
        "--model",
        tiny_path,
        "--prompt-cache-dir",
        tmp_path,
        "--max-tokens",
        "3",
        "--prompt",
        SHARED,
    ]
    assert cli.main([str(a) for a in argv]) == 0
    (path,) = tmp_path.glob("*.safetensors")
    path.write_bytes(path.read_bytes()[:100])  # truncated
    capsys.readouterr()
    assert cli.main([str(a) for a in argv]) == 0
    err = capsys.readouterr().err
    assert f"note: Skipped and removed the prompt-cache file {path}" in err
    assert "Warning" not in err and cached(err) == 0


def test_serve_defaults_to_the_user_cache_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(PROMPT_CACHE_ENV, str(tmp_path / "given"))
    assert default_prompt_cache_dir() == tmp_path / "given"
    monkeypatch.delenv(PROMPT_CACHE_ENV)  # the tests' own setting (conftest): off the real home
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_prompt_cache_dir() == tmp_path / "langchain-starcoder" / "prompt-cache"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_prompt_cache_dir() == tmp_path / "home" / ".cache" / "langchain-starcoder" / "prompt-cache"


def test_serve_refuses_a_folder_and_no_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = cli.main(["serve", "--model", "unused", "--prompt-cache-dir", str(tmp_path), "--no-prompt-cache"])
    assert code != 0
    assert "--prompt-cache-dir DIR or --no-prompt-cache, not both" in capsys.readouterr().err
