"""Prompt lookup through every surface: LangChain, LlamaIndex and the HTTP server (a real uvicorn on
127.0.0.1) take ``prompt_lookup_num_tokens`` and report ``accepted_draft_tokens`` and ``draft_tokens``."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from langchain_starcoder import ChatStarCoder, StarCoderEngine, StarCoderLLM
from langchain_starcoder.llama_index import StarCoder
from langchain_starcoder.server import create_app
from langchain_starcoder.testing.servers import ServerThread

EDIT = "for i in range(10):\n    print(i)\n" * 3


def test_langchain_llm_reports_draft_counts(tiny_path: Path) -> None:
    fast = StarCoderLLM(model=str(tiny_path), max_tokens=40, prompt_lookup_num_tokens=8)
    plain = StarCoderLLM(model=str(tiny_path), max_tokens=40, prompt_lookup_num_tokens=0)
    got, want = fast.generate([EDIT]).generations[0][0], plain.generate([EDIT]).generations[0][0]
    assert got.text == want.text
    assert got.generation_info["accepted_draft_tokens"] > 0
    assert got.generation_info["draft_tokens"] >= got.generation_info["accepted_draft_tokens"]
    assert want.generation_info["accepted_draft_tokens"] == want.generation_info["draft_tokens"] == 0
    streamed = list(fast.stream(EDIT))
    assert "".join(streamed) == want.text
    # A call's own setting wins over the field.
    off = fast.generate([EDIT], prompt_lookup_num_tokens=0).generations[0][0]
    assert off.generation_info["draft_tokens"] == 0 and off.text == want.text


def test_chat_model_and_llama_index_take_the_field(tiny_path: Path) -> None:
    chat = ChatStarCoder(model=str(tiny_path), max_tokens=4, prompt_lookup_num_tokens=8)
    assert chat._identifying_params["prompt_lookup_num_tokens"] == 8
    llm = StarCoder(model=str(tiny_path), max_tokens=40, prompt_lookup_num_tokens=8)
    response = llm.complete(EDIT)
    assert response.raw["accepted_draft_tokens"] > 0
    assert response.raw["usage"]["accepted_draft_tokens"] == response.raw["accepted_draft_tokens"]
    assert response.raw["usage"]["draft_tokens"] == response.raw["draft_tokens"] > 0


@pytest.fixture(scope="module")
def server(tiny_engine: StarCoderEngine):
    running = ServerThread(create_app(tiny_engine, model_name="tiny", prompt_lookup_num_tokens=8))
    yield running.url
    running.stop()


def test_server_default_and_per_request_field(server: str, tiny_engine: StarCoderEngine) -> None:
    want = tiny_engine.generate(EDIT, max_tokens=40, prompt_lookup_num_tokens=0)
    body = {"model": "tiny", "prompt": EDIT, "max_tokens": 40, "temperature": 0}
    got = httpx.post(f"{server}/v1/completions", json=body, timeout=60).json()
    assert got["choices"][0]["text"] == want.text
    assert got["usage"]["accepted_draft_tokens"] > 0  # the server's --prompt-lookup 8
    off = httpx.post(f"{server}/v1/completions", json={**body, "prompt_lookup_num_tokens": 0}, timeout=60)
    assert off.json()["usage"]["draft_tokens"] == 0 and off.json()["choices"][0]["text"] == want.text
    bad = httpx.post(f"{server}/v1/completions", json={**body, "prompt_lookup_num_tokens": -2}, timeout=60)
    assert bad.status_code == 400 and "prompt_lookup_num_tokens" in bad.text
    llama = httpx.post(f"{server}/completion", json={"prompt": EDIT, "n_predict": 40}, timeout=60).json()
    assert llama["content"] == want.text


def test_serve_flag_is_validated() -> None:
    from langchain_starcoder.cli.parser import build_parser

    args = build_parser().parse_args(["serve", "--prompt-lookup", "6"])
    assert args.prompt_lookup == 6
