"""``serve`` whose model fails to load in the background (a damaged weight file, an adapter whose tensors do
not fit its own config) prints the reason in one line and exits 1, its port released and no child left; it
used to keep serving, every request answering 500. A library app (``create_app(loader)``) keeps answering 500
and calls ``app.state.on_load_error`` when set. A good load still serves: test_server.py's ``serve`` tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.errors import StarCoderError
from langchain_starcoder.server import create_app
from langchain_starcoder.testing import copy_checkpoint
from langchain_starcoder.testing.adapters import build_adapter
from langchain_starcoder.testing.servers import ServerThread, free_port

PREFIX = "langchain-starcoder: "


@pytest.fixture(scope="module")
def damaged(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint with its model.safetensors cut in half (an interrupted download)."""
    folder = copy_checkpoint(tiny_path, tmp_path_factory.mktemp("damaged") / "tiny")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    return folder


@pytest.fixture(scope="module")
def misfit(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter of the tiny checkpoint whose config says rank 8 of its rank-4 tensors: it reads and
    fits the base's config (the checks before serving pass), and fails only when loaded."""
    folder = build_adapter(tiny_path, tmp_path_factory.mktemp("misfit") / "adapter", rank=4)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["lora_parameters"]["rank"] = 8
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def serve(*args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run ``serve`` to its end (a generous bound: it must end by itself); its result and port."""
    port = free_port()
    argv = [sys.executable, "-m", "langchain_starcoder", "serve", *args, "--port", str(port)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    try:
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"serve kept running after its model failed to load:\n{e.stderr}")
    return result, port


def assert_failed_cleanly(result: subprocess.CompletedProcess[str], port: int, words: str) -> None:
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith(PREFIX)]
    assert len(errors) == 1 and errors[0].startswith(f"{PREFIX}error: "), result.stderr
    assert words in errors[0], result.stderr
    assert result.stderr.count(words) == 1, result.stderr  # said once, not logged first as well
    assert "Traceback" not in result.stderr
    with socket.create_server(("127.0.0.1", port)):  # the port is free again
        pass


def test_a_damaged_checkpoint_ends_serve_with_its_reason(damaged: Path) -> None:
    result, port = serve("--model", str(damaged), "--no-prompt-cache")
    assert_failed_cleanly(result, port, "model.safetensors is truncated or corrupted")
    assert "download it again" in result.stderr  # what to do


@pytest.mark.parametrize("named", [True, False], ids=["named", "bare"])
def test_an_adapter_that_does_not_fit_its_config_ends_serve(
    tiny_path: Path, misfit: Path, named: bool
) -> None:
    """Named (built once the base is ready: the server kept running) or bare (loaded with the model)."""
    adapter = f"mine={misfit}" if named else str(misfit)
    result, port = serve("--model", str(tiny_path), "--adapter", adapter, "--no-prompt-cache")
    assert_failed_cleanly(result, port, "the two files do not belong together")


def test_a_managed_llama_server_is_stopped_when_an_adapter_fails(
    tiny_path: Path, misfit: Path, gguf_cache: Path
) -> None:
    """On llama.cpp the base loads (a llama-server child starts), then the named adapter fails: the child
    is stopped before serve exits (no llama-server started since the test began is left running; a
    watcher polling serve's children could miss one that lived a fraction of a second)."""
    started = time.time()
    args = ["--model", str(tiny_path), "--backend", "llama.cpp", "--adapter", f"mine={misfit}"]
    result, port = serve(*args)
    assert_failed_cleanly(result, port, "the two files do not belong together")
    assert f"Loaded {tiny_path} on llama.cpp" in result.stderr  # its llama-server child ran
    left = [
        p.info
        for p in psutil.process_iter(["name", "create_time", "status", "pid"])
        if "llama-server" in (p.info["name"] or "")
        and p.info["create_time"] >= started
        and p.info["status"] != psutil.STATUS_ZOMBIE
    ]
    assert not left, left


def test_a_library_app_answers_500_and_calls_on_load_error(tiny_path: Path, misfit: Path) -> None:
    """``create_app(loader)``: the app keeps serving the reason (a library user may not want its process to
    stop) and hands the error to ``app.state.on_load_error``, once, when set."""
    called: list[BaseException] = []
    failed = threading.Event()
    app = create_app(lambda: StarCoderEngine.load(tiny_path), adapters={"mine": misfit})

    def on_load_error(error: BaseException) -> None:
        called.append(error)
        failed.set()

    app.state.on_load_error = on_load_error
    running = ServerThread(app)
    try:
        assert failed.wait(120), "on_load_error was not called"
        reply = httpx.get(f"{running.url}/health", timeout=30)
        assert reply.status_code == 500 and "do not belong together" in reply.text
    finally:
        running.stop()
    [error] = called
    assert isinstance(error, StarCoderError) and "do not belong together" in str(error)
