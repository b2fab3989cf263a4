"""The remote backend's vLLM protocol (``/v1/completions`` with ``return_token_ids``) where it differs
from llama.cpp's, against the session's real vLLM server (tests/conftest.py; the tests both servers
share are in test_remote.py).

A stub on 127.0.0.1 remains for what a real vLLM 0.32 cannot show: a server older than 0.10.2, which
streams no ``token_ids`` (``return_token_ids`` came then), and one that runs other ids than it was sent
(vLLM runs a list of ids as given; a proxy that re-tokenizes would not).
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from langchain_starcoder import ContextLengthError, StarCoderEngine
from langchain_starcoder.backends.remote import ServerError
from langchain_starcoder.testing.vllm_server import VLLMServer

CONTEXT = 2048  # the stub's
GREEDY = {"max_tokens": 16, "temperature": 0.0}


# --- the real server ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local(vllm_path: Path) -> Iterator[StarCoderEngine]:
    engine = StarCoderEngine.load(vllm_path)
    yield engine
    engine.close()


@pytest.mark.vllm
def test_a_400_is_one_clear_error_and_leaves_it_usable(
    vllm_server: VLLMServer, vllm_path: Path, local: StarCoderEngine
) -> None:
    """vLLM takes temperatures up to 2 (this package and llama.cpp any): its 400 says so."""
    engine = StarCoderEngine.connect(vllm_server.url, model="tiny", tokenizer=vllm_path, max_retries=0)
    try:
        with pytest.raises(
            ServerError, match=r"answered 400 to /v1/completions: temperature must be in \[0, 2\], got 2.5"
        ):
            engine.generate("def f():", max_tokens=4, temperature=2.5)
        got, want = engine.generate("def f():", **GREEDY), local.generate("def f():", **GREEDY)
        assert (got.text, got.token_ids) == (want.text, want.token_ids)
    finally:
        engine.close()


@pytest.mark.vllm
def test_past_the_sliding_window_it_equals_the_local_engine(
    vllm_server: VLLMServer, vllm_path: Path, local: StarCoderEngine, tmp_path: Path
) -> None:
    """vLLM's StarCoder2 keeps the sliding window (512 tokens in the test checkpoint), as the local
    engine does (llama.cpp and mlx-lm ignore it): greedy stays equal on prompts past it, where
    attention over the whole prompt answers otherwise."""
    config = json.loads((vllm_path / "config.json").read_text())
    unwindowed = Path(shutil.copytree(vllm_path, tmp_path / "unwindowed"))
    (unwindowed / "config.json").write_text(json.dumps({**config, "sliding_window": None}))
    engine = StarCoderEngine.connect(vllm_server.url, model="tiny", tokenizer=vllm_path)
    whole = StarCoderEngine.load(unwindowed)
    try:
        differs = []
        for seed in range(3):
            prompt = "".join(f"def f{seed}_{i}(x):\n    return x * {i}\n" for i in range(50))
            assert config["sliding_window"] + 200 < len(local.encode(prompt)) < 2000
            got, want = engine.generate(prompt, max_tokens=24), local.generate(prompt, max_tokens=24)
            assert (got.text, got.token_ids) == (want.text, want.token_ids)
            differs.append(whole.generate(prompt, max_tokens=24).token_ids != want.token_ids)
        assert any(differs)  # the window matters for these prompts
    finally:
        engine.close()
        whole.close()


@pytest.mark.vllm
def test_a_shorter_served_context_is_the_window(
    vllm_server: VLLMServer, vllm_path: Path, local: StarCoderEngine, tmp_path: Path
) -> None:
    """A checkpoint whose context is longer than ``--max-model-len`` gets the server's: a longer
    prompt is refused here, before a request, and the rest works."""
    served = vllm_server.max_model_len
    longer = Path(shutil.copytree(vllm_path, tmp_path / "longer"))
    config = json.loads((longer / "config.json").read_text())
    (longer / "config.json").write_text(json.dumps({**config, "max_position_embeddings": served * 4}))
    engine = StarCoderEngine.connect(vllm_server.url, model="tiny", tokenizer=longer)
    try:
        assert engine.context_window == served
        with pytest.raises(ContextLengthError):
            engine.generate("x " * served, max_tokens=8)
        got, want = engine.generate("def f():", **GREEDY), local.generate("def f():", **GREEDY)
        assert got.token_ids == want.token_ids
    finally:
        engine.close()


# --- what a real vLLM 0.32 cannot show: a stub ----------------------------------------------------


class VLLMStub:
    """Answers ``/v1/models`` and streams ``/v1/completions`` as vLLM does: the ids of "abc" over and
    over, up to ``max_tokens``, as an old vLLM (``mode`` "old": no ``token_ids``) or a server that
    re-tokenized the prompt ("retokenized": its echo lacks the first id) would."""

    def __init__(self, ids: list[int], mode: str) -> None:
        self.ids = ids
        self.mode = mode
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                card = {"id": "tiny", "object": "model", "owned_by": "vllm", "max_model_len": CONTEXT}
                data = json.dumps({"object": "list", "data": [card]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for event in stub.events(body):
                    self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        count = body["max_tokens"]
        head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "tiny"}
        prompt = body["prompt"][1:] if self.mode == "retokenized" else body["prompt"]
        for i in range(count):
            choice: dict[str, Any] = {"index": 0, "text": "?", "logprobs": None, "finish_reason": None}
            if self.mode != "old":
                choice["token_ids"] = [self.ids[i % len(self.ids)]]
            if i == 0:
                choice["prompt_token_ids"] = prompt
            if i == count - 1:
                choice["finish_reason"] = "length"
            yield {**head, "choices": [choice], "usage": None}
        usage = {"prompt_tokens": len(prompt), "completion_tokens": count}
        yield {**head, "choices": [], "usage": usage}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("old", r"did not stream token ids .* needs vLLM >= 0\.10\.2 \(return_token_ids\)"),
        ("retokenized", r"ran other prompt ids than were sent"),
    ],
)
def test_what_no_real_vllm_does_is_refused(
    tiny_engine: StarCoderEngine, tiny_path: Path, mode: str, message: str
) -> None:
    stub = VLLMStub([tiny_engine.encode(c)[0] for c in "abc"], mode)
    engine = StarCoderEngine.connect(stub.url, model="tiny", tokenizer=tiny_path, timeout=5, max_retries=0)
    try:
        with pytest.raises(ServerError, match=message):
            engine.generate("def f():", max_tokens=3)
        stub.mode = "ok"
        assert engine.generate("def f():", max_tokens=3).text == "abc"
    finally:
        engine.close()
        stub.close()
