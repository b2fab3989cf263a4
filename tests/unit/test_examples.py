"""examples/quickstart.py, async_streaming.py and chat_instruct.py, run on built checkpoints."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from langchain_starcoder import ChatStarCoder, UnsupportedModelError
from langchain_starcoder.testing import INSTRUCT_CHAT_TEMPLATE

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> ModuleType:
    """Import an example script afresh (its module-level paths read $HOME at import)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tmp_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME in a temporary folder, so offline fallbacks write nothing to the real ~/.cache."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


# --- quickstart ------------------------------------------------------------------------------------------


def test_quickstart_on_a_local_checkpoint(capsys, monkeypatch, tiny_path, tiny_engine):
    quickstart = load_example("quickstart")
    monkeypatch.setattr(sys, "argv", ["quickstart.py", "--model", str(tiny_path), "--max-tokens", "12"])
    quickstart.main()
    out = capsys.readouterr().out
    prompt = "def fibonacci(n):\n    "
    expected = tiny_engine.generate(prompt, max_tokens=12, stop=["\ndef ", "\nclass "])
    assert (
        out == f"{prompt}{expected.text}\n\n[{expected.finish_reason}: {expected.completion_tokens} tokens]\n"
    )


def test_quickstart_falls_back_offline_to_a_built_checkpoint(tmp_home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HOME=str(tmp_home), HF_HUB_OFFLINE="1")  # the hub cache is under the new HOME too
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), "--max-tokens", "6"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    offline = tmp_home / ".cache" / "langchain-starcoder" / "offline-tiny"
    assert f"Using an offline checkpoint with random weights at {offline}" in result.stdout
    assert (offline / "config.json").is_file()
    assert re.search(r"\[(stop|length): \d+ tokens\]", result.stdout)


# --- async streaming ---------------------------------------------------------------------------------------


def labelled_chunks(out: str) -> dict[str, list[str]]:
    chunks: dict[str, list[str]] = {}
    for line in out.splitlines():
        m = re.match(r"\[\s*(\w+)\] (.*)$", line)
        if m:
            chunks.setdefault(m.group(1), []).append(ast.literal_eval(m.group(2)))
    return chunks


def test_async_streaming_prints_labelled_chunks(capsys, tiny_path, tiny_engine):
    example = load_example("async_streaming")
    texts = example.main(["--model", str(tiny_path), "--max-tokens", "10"])
    out = capsys.readouterr().out
    assert set(texts) == set(example.REQUESTS)
    chunks = labelled_chunks(out)
    assert set(chunks) == set(example.REQUESTS)
    for label, prompt in example.REQUESTS.items():
        expected = tiny_engine.generate(prompt, max_tokens=10, stop=["\ndef ", "\nclass "]).text
        assert texts[label] == expected
        assert "".join(chunks[label]) == expected  # the labelled chunks add up to the completion
        assert f"=== {label} ===\n{prompt}{expected}" in out
    assert len(chunks["fib"]) > 1  # streamed, not printed once at the end
    assert re.search(r"The event loop ticked \d+ times", out)


def test_async_streaming_falls_back_offline(capsys, tmp_home):
    example = load_example("async_streaming")
    texts = example.main(["--max-tokens", "4"])
    out = capsys.readouterr().out
    assert "Using an offline checkpoint" in out
    assert str(tmp_home) in str(example.OFFLINE_MODEL)
    assert (example.OFFLINE_MODEL / "config.json").is_file()
    assert set(texts) == set(example.REQUESTS)


# --- chat with an instruct checkpoint ----------------------------------------------------------------


def test_chat_instruct_streams_two_turns(capsys, chat_path):
    example = load_example("chat_instruct")
    answers = example.main(["--model", str(chat_path), "--max-tokens", "12"])
    out = capsys.readouterr().out
    assert len(answers) == 2
    first = [SystemMessage(example.SYSTEM), HumanMessage(example.QUESTIONS[0])]
    expected = ChatStarCoder(model=str(chat_path), max_tokens=12).invoke(first)
    assert answers[0].content == expected.content
    for question, answer in zip(example.QUESTIONS, answers, strict=True):
        assert f">>> {question}" in out
        assert answer.content in out
        assert answer.usage_metadata["output_tokens"] > 0
    # The second prompt begins with the first exchange, which the prompt cache already holds.
    first_prompt = answers[0].usage_metadata["input_tokens"]
    second = answers[1].usage_metadata
    assert second["input_tokens"] > first_prompt
    assert second["input_token_details"]["cache_read"] >= first_prompt - 1
    assert f"({second['input_token_details']['cache_read']} from the prompt cache)" in out


def test_chat_instruct_needs_a_template_for_a_base_model(capsys, tiny_path, tmp_path):
    example = load_example("chat_instruct")
    with pytest.raises(UnsupportedModelError, match="chat template"):
        example.main(["--model", str(tiny_path), "--max-tokens", "4"])
    template = tmp_path / "template.jinja"
    template.write_text(INSTRUCT_CHAT_TEMPLATE, encoding="utf-8")
    answers = example.main(["--model", str(tiny_path), "--max-tokens", "4", "--chat-template", str(template)])
    assert len(answers) == 2
    assert all(1 <= a.usage_metadata["output_tokens"] <= 4 for a in answers)


def test_chat_instruct_falls_back_offline(capsys, tmp_home):
    example = load_example("chat_instruct")
    answers = example.main(["--max-tokens", "4"])
    out = capsys.readouterr().out
    assert "Using an offline instruct checkpoint" in out
    assert str(tmp_home) in str(example.OFFLINE_MODEL)
    config = (example.OFFLINE_MODEL / "tokenizer_config.json").read_text()
    assert "### Instruction" in config  # built with the instruct chat template
    assert len(answers) == 2
