"""The server's bounds on what one client can take: the request body's size, a text prompt too long for
the context window (refused before it is tokenized), a request's deadline and the number of connections,
on a real uvicorn server (the serve command's config) bound to 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from langchain_starcoder import StarCoderEngine
from langchain_starcoder._tokens import max_text_chars
from langchain_starcoder.server import BoundedConfig, create_app
from langchain_starcoder.server.limits import (
    MAX_CONTEXT_FILES,
    MAX_MESSAGES,
    MAX_PROMPTS,
    MAX_RESPONSE_FIELDS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
)
from langchain_starcoder.testing.servers import wait_healthy

PROMPT = "def count_items(items):\n    "


@contextlib.contextmanager
def _serving(app: Any, **bounds: Any) -> Iterator[tuple[str, uvicorn.Server]]:
    """``app`` served as ``serve`` serves it (BoundedConfig) in a thread, on a free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(BoundedConfig(app, host="127.0.0.1", port=port, log_level="warning", **bounds))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive()


@pytest.fixture(scope="module")
def limited(tiny_engine: StarCoderEngine) -> Iterator[str]:
    """A server whose body limit is 64 KiB."""
    with _serving(create_app(tiny_engine, max_body_bytes=64 * 1024)) as (url, _):
        yield url


def _post(url: str, content: bytes, **headers: str) -> httpx.Response:
    return httpx.post(
        url, content=content, headers={"content-type": "application/json", **headers}, timeout=60
    )


# --- the body limit -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize", "/infill"])
def test_a_body_over_the_limit_gets_413_at_once_and_the_server_keeps_serving(limited, path):
    big = json.dumps({"prompt": "x" * 200_000, "content": "x" * 200_000, "input_prefix": "x"}).encode()
    started = time.perf_counter()
    reply = _post(f"{limited}{path}", big)
    assert reply.status_code == 413, reply.text
    assert time.perf_counter() - started < 5  # refused on its Content-Length, not after reading it
    error = reply.json()["error"]
    assert error["code"] == "request_too_large" and "--max-body-mb" in error["message"]
    assert str(64 * 1024) in error["message"]
    ok = _post(f"{limited}/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 2}).encode())
    assert ok.status_code == 200, ok.text


def test_a_chunked_body_is_refused_while_it_streams_in(limited):
    """No Content-Length: the server counts as it reads, and stops at the limit."""

    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(2_500):  # 40 MB, if it were all kept
            yield b"x" * (16 * 1024)
        yield b'"}'

    with httpx.Client(timeout=60) as client:
        reply = client.post(f"{limited}/v1/completions", content=chunks())
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"
    assert _post(f"{limited}/health", b"").status_code in (200, 405)


def test_the_limit_is_4_mib_by_default_and_can_be_raised(tiny_engine):
    prefix = "x = 1\n" * 40_000  # 240 KB: over 64 KiB, under 1 MiB; /infill keeps what fits
    body = json.dumps({"input_prefix": prefix, "n_predict": 2}).encode()
    with _serving(create_app(tiny_engine, max_body_bytes=1024 * 1024)) as (url, _):
        reply = _post(f"{url}/infill", body)
        assert reply.status_code == 200 and reply.json()["truncated"] is True
    with _serving(create_app(tiny_engine)) as (url, _):
        assert _post(f"{url}/infill", body).status_code == 200
        huge = b'{"input_prefix": "' + b"x" * (4 * 2**20) + b'"}'
        assert _post(f"{url}/infill", huge).status_code == 413


@pytest.mark.parametrize("bad", [0, -1, 1.5, None])
def test_create_app_refuses_a_bad_body_limit(tiny_engine, bad):
    with pytest.raises(ValueError, match="max_body_bytes"):
        create_app(tiny_engine, max_body_bytes=bad)


# --- text that cannot fit the context window is refused before it is tokenized ------------------------


def test_a_text_prompt_longer_than_the_context_can_hold_is_refused_without_tokenizing(tiny_engine):
    longest = max_text_chars(tiny_engine.tokenizer, 1)
    assert longest is not None and longest < 64
    cannot_fit = "x = 1\n" * (longest * tiny_engine.context_window // 6 + 10)  # under the body limit
    calls = []
    encode = tiny_engine.encode

    def spy(text: str, **kwargs: Any) -> list[int]:
        calls.append(len(text))
        return encode(text, **kwargs)

    with _serving(create_app(tiny_engine)) as (url, _):
        tiny_engine.encode = spy  # type: ignore[method-assign]
        try:
            requests = [
                ("/v1/completions", {"prompt": cannot_fit, "max_tokens": 2}),
                ("/v1/completions", {"prompt": [PROMPT, cannot_fit], "max_tokens": 2}),
                ("/tokenize", {"content": cannot_fit}),
            ]
            for path, body in requests:
                started = time.perf_counter()
                reply = _post(f"{url}{path}", json.dumps(body).encode())
                assert reply.status_code == 413, reply.text
                assert time.perf_counter() - started < 5
                error = reply.json()["error"]
                assert error["code"] == "context_length_exceeded"
                assert f"{len(cannot_fit)} characters" in error["message"]
                assert f"context window of {tiny_engine.context_window}" in error["message"]
            assert all(n < len(cannot_fit) for n in calls)  # never tokenized whole
            ok = _post(f"{url}/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 2}).encode())
            assert ok.status_code == 200
        finally:
            del tiny_engine.encode


def test_chat_messages_too_long_for_the_context_are_refused_before_tokenizing(chat_path):
    engine = StarCoderEngine.load(chat_path)
    try:
        longest = max_text_chars(engine.tokenizer, 1)
        content = "y" * (longest * engine.context_window // 2 + 1)
        messages = [{"role": "user", "content": content}, {"role": "user", "content": content}]
        with _serving(create_app(engine)) as (url, _):
            reply = _post(f"{url}/v1/chat/completions", json.dumps({"messages": messages}).encode())
            assert reply.status_code == 413 and reply.json()["error"]["param"] == "messages"
    finally:
        engine.close()


# --- list fields: a count each, under the body limit ------------------------------------------------------

CHUNK = {"filename": "a.py", "text": "x = 1\n"}


def _stops(count: int) -> list[str]:
    return [f"zq{i}" for i in range(count)]


def _list_fields(count: dict[str, int]) -> list[tuple[str, dict[str, Any], str]]:
    """Requests whose list fields hold ``count[param]`` items: (path, body, param)."""
    infill = {"input_prefix": PROMPT, "n_predict": 2}
    return [
        ("/infill", {**infill, "input_extra": [CHUNK] * count["input_extra"]}, "input_extra"),
        ("/infill", {**infill, "stop": _stops(count["stop"])}, "stop"),
        ("/infill", {**infill, "response_fields": ["content"] * count["response_fields"]}, "response_fields"),
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "stop": _stops(count["stop"])}, "stop"),
        ("/completion", {"prompt": PROMPT, "n_predict": 2, "stop": _stops(count["stop"])}, "stop"),
        ("/v1/completions", {"prompt": [PROMPT] * count["prompt"], "max_tokens": 1}, "prompt"),
        ("/detokenize", {"tokens": [5] * count["tokens"]}, "tokens"),
    ]


def _limits(engine: StarCoderEngine, over: int) -> dict[str, int]:
    most = {
        "input_extra": MAX_CONTEXT_FILES,
        "stop": MAX_STOP_STRINGS,
        "response_fields": MAX_RESPONSE_FIELDS,
        "prompt": MAX_PROMPTS,
        "tokens": engine.context_window,
    }
    return {param: n + over for param, n in most.items()}


def test_list_fields_over_their_count_get_a_clear_400_before_any_work(limited, tiny_engine, backend_spy):
    """Under the body limit, many tiny items cost work each (80,000 input_extra chunks: 18.6 s of CPU)."""
    seen = backend_spy(tiny_engine).generations
    limits = _limits(tiny_engine, 0)
    for path, body, param in _list_fields(_limits(tiny_engine, 1)):
        reply = _post(f"{limited}{path}", json.dumps(body).encode())
        assert reply.status_code == 400, (path, param, reply.text)
        error = reply.json()["error"]
        assert error["param"] == param and error["code"] == "array_above_max_length"
        assert f"{param} has {limits[param] + 1} " in error["message"]
        assert f"Send at most {limits[param]}." in error["message"]
    assert seen == []  # refused before the engine saw anything


def test_list_fields_at_their_count_are_served(limited, tiny_engine):
    for path, body, param in _list_fields(_limits(tiny_engine, 0)):
        reply = _post(f"{limited}{path}", json.dumps(body).encode())
        assert reply.status_code == 200, (path, param, reply.text)


@pytest.mark.parametrize("path", ["/v1/completions", "/infill", "/completion"])
def test_a_stop_string_over_the_length_limit_is_refused(limited, path):
    """Text that could start a stop string is held back and checked again at every token."""
    body = {"prompt": PROMPT, "input_prefix": PROMPT, "max_tokens": 2, "n_predict": 2}
    reply = _post(f"{limited}{path}", json.dumps({**body, "stop": ["#" * (MAX_STOP_CHARS + 1)]}).encode())
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "stop" and error["code"] == "string_above_max_length"
    assert f"{MAX_STOP_CHARS + 1} characters" in error["message"] and str(MAX_STOP_CHARS) in error["message"]
    ok = _post(f"{limited}{path}", json.dumps({**body, "stop": "#" * MAX_STOP_CHARS}).encode())
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize(
    ("path", "prompt"),
    [
        ("/v1/completions", lambda window: [10**9] * (window + 1)),
        ("/v1/completions", lambda window: [[5], [10**9] * (window + 1)]),
        ("/completion", lambda window: [10**9, ""] * (window // 2 + 1)),
    ],
    ids=["ids", "a list of id prompts", "completion pieces"],
)
def test_token_ids_that_cannot_fit_the_context_are_refused_before_each_is_checked(
    limited, tiny_engine, path, prompt
):
    """A list of ids longer than the context window gets the context's 413 at once, not after every id
    was checked (these ids are outside the vocabulary: checked first, they would get a 400)."""
    window = tiny_engine.context_window
    body = {"prompt": prompt(window), "max_tokens": 1, "n_predict": 1}
    reply = _post(f"{limited}{path}", json.dumps(body).encode())
    assert reply.status_code == 413, reply.text
    error = reply.json()["error"]
    assert (
        error["code"] == "context_length_exceeded"
        and f"context window of {window} tokens" in error["message"]
    )


def test_more_chat_messages_than_the_limit_are_refused(chat_path):
    engine = StarCoderEngine.load(chat_path)
    try:
        message = {"role": "user", "content": "hi"}
        with _serving(create_app(engine)) as (url, _):
            body = {"messages": [message] * (MAX_MESSAGES + 1), "max_tokens": 1}
            reply = _post(f"{url}/v1/chat/completions", json.dumps(body).encode())
            assert reply.status_code == 400 and reply.json()["error"]["param"] == "messages", reply.text
            assert f"Send at most {MAX_MESSAGES}." in reply.json()["error"]["message"]
            body = {"messages": [message] * 3, "max_tokens": 1}
            assert _post(f"{url}/v1/chat/completions", json.dumps(body).encode()).status_code == 200
    finally:
        engine.close()


# --- connections: a request deadline, a connection limit -----------------------------------------------


def _slow_clients(url: str, count: int) -> list[socket.socket]:
    """``count`` connections that start a request and never finish its headers (slowloris)."""
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for _ in range(count):
        s = socket.create_connection((host, int(port)), timeout=10)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        socks.append(s)
    return socks


def _closed_by_server(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        return s.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_good_client_is_served_while_slow_clients_hold_every_connection(tiny_engine):
    with _serving(create_app(tiny_engine), max_connections=16, request_timeout=60) as (url, server):
        # asyncio accepts a whole backlog before the protocol can close anything: it must be small.
        assert server.config.backlog <= 16
        slow = _slow_clients(url, 40)  # more than the limit, and each keeps its request open
        try:
            time.sleep(0.2)
            assert len(server.server_state.connections) <= 16 + 1  # the file descriptors stay bounded
            for _ in range(3):
                started = time.perf_counter()
                assert httpx.get(f"{url}/health", timeout=10).status_code == 200
                assert time.perf_counter() - started < 5
            body = {"prompt": PROMPT, "max_tokens": 2}
            assert _post(f"{url}/v1/completions", json.dumps(body).encode()).status_code == 200
            # The oldest slow clients made room: the server closed them.
            assert _closed_by_server(slow[0], within=5)
        finally:
            for s in slow:
                s.close()


def test_a_request_that_does_not_arrive_in_time_is_closed(tiny_engine):
    with _serving(create_app(tiny_engine), request_timeout=0.5) as (url, _):
        (headers,) = _slow_clients(url, 1)
        started = time.perf_counter()
        assert _closed_by_server(headers, within=10)
        assert 0.4 < time.perf_counter() - started < 5
        # Headers in, but the body never comes: closed too.
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as body:
            body.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            assert _closed_by_server(body, within=10)
        headers.close()
        # A client that is quick is served, and a long answer is not cut by the deadline.
        reply = _post(f"{url}/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 300}).encode())
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] > 0


def test_when_every_connection_serves_a_request_a_new_one_gets_503(tiny_engine):
    """Connections whose requests are in (headers read) are not closed to make room."""
    with _serving(create_app(tiny_engine), max_connections=2, request_timeout=60) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        busy = []
        for _ in range(2):  # the headers are in; the handler waits for the rest of the body
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            busy.append(s)
        try:
            time.sleep(0.2)
            with socket.create_connection((host, int(port)), timeout=10) as extra:
                extra.settimeout(10)
                assert extra.recv(1024).startswith(b"HTTP/1.1 503")
            assert not any(_closed_by_server(s, within=0.2) for s in busy)
        finally:
            for s in busy:
                s.close()
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200  # room again once they leave


# --- the serve command's flags ---------------------------------------------------------------------------


def test_serve_flags_set_the_bounds(tiny_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [
        sys.executable,
        "-m",
        "langchain_starcoder",
        "serve",
        "--model",
        str(tiny_path),
        "--port",
        str(port),
        "--max-body-mb",
        "0.01",
        "--request-timeout",
        "3",
        "--max-connections",
        "4",
        "--keep-alive-timeout",
        "0.5",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url)
        reply = _post(f"{url}/tokenize", json.dumps({"content": "x" * 20_000}).encode())  # over 0.01 MiB
        assert reply.status_code == 413 and "10485 bytes" in reply.json()["error"]["message"]
        slow = _slow_clients(url, 8)  # twice the limit
        try:
            assert httpx.get(f"{url}/health", timeout=10).status_code == 200
            assert all(_closed_by_server(s, within=5) for s in slow)  # made room, or too slow
        finally:
            for s in slow:
                s.close()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:  # a kept-alive connection
            idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while b'{"status":"ok"}' not in answer:
                answer += idle.recv(4096)
            started = time.perf_counter()
            assert _closed_by_server(idle, within=2.5)  # before the 3 s request timeout
            assert 0.3 < time.perf_counter() - started < 2.5
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


@pytest.mark.parametrize("flag", ["--max-body-mb", "--request-timeout", "--max-connections"])
def test_serve_refuses_a_bound_that_is_not_positive(flag):
    argv = [sys.executable, "-m", "langchain_starcoder", "serve", "--model", "unused", flag, "0"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f"argument {flag}: expected a" in result.stderr and "above 0, got '0'" in result.stderr
