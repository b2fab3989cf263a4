"""``serve`` keeps prompt caches on disk by default: a restarted server starts warm. llama.vim's
``n_predict: 0`` request prefills the repository context of the file it names, and that is kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from langchain_starcoder.testing.servers import free_port, wait_healthy

MODULE = "".join(f"def handler_{i}(request):\n    return respond(request, code={i * 7})\n" for i in range(30))
PREFIX, SUFFIX = "from pkg.handlers import handler_3\n\n\ndef main():\n    ", "\n"


def serve(model: Path, repo: Path, cache_home: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "langchain_starcoder",
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--repo",
        str(repo),
        *flags,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(cache_home)}
    env.pop("LANGCHAIN_STARCODER_PROMPT_CACHE_DIR", None)  # conftest's: the default under XDG_CACHE_HOME here
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url)
    return proc, url


def infill(url: str, n_predict: int) -> dict:
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "file_path": "app/main.py"}
    body["n_predict"] = n_predict
    return httpx.post(f"{url}/infill", json=body, timeout=120).json()


def stop(proc: subprocess.Popen) -> str:
    proc.terminate()  # a graceful shutdown: the engine closes, its queued writes land
    _, err = proc.communicate(timeout=60)
    return err


def test_a_restarted_server_starts_warm(tiny_path: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "handlers.py").write_text(MODULE, encoding="utf-8")
    folder = tmp_path / "langchain-starcoder" / "prompt-cache"
    proc, url = serve(tiny_path, repo, tmp_path)
    try:
        warm_up = infill(url, 0)  # llama.vim: "cache this context", nothing generated
        assert warm_up["content"] == "" and warm_up["tokens_cached"] == 0
        assert warm_up["tokens_evaluated"] > 300  # the repository's file is in the prompt
    finally:
        err = stop(proc)
    assert f"Prompt caches are kept in {folder}" in err
    assert len(list(folder.glob("*.safetensors"))) == 1
    proc, url = serve(tiny_path, repo, tmp_path)
    try:
        answer = infill(url, 4)
        assert answer["tokens_cached"] == answer["tokens_evaluated"] - 1
    finally:
        stop(proc)
    proc, url = serve(tiny_path, repo, tmp_path / "off", "--no-prompt-cache")
    try:
        cold = infill(url, 4)
        assert cold["tokens_cached"] == 0 and cold["content"] == answer["content"]
    finally:
        stop(proc)
    assert not (tmp_path / "off").exists()
