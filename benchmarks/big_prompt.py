"""One huge text prompt against the server: the time to its 413 and the server's memory (peak and after).

    python -m benchmarks.big_prompt --mb 40            # the serve command's defaults
    python -m benchmarks.big_prompt --mb 3 --path /tokenize

The server (the tiny test checkpoint) runs in a child process whose resident memory is sampled every
5 ms with psutil; one JSON line is printed.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

SERVE = """
import sys, uvicorn
from langchain_starcoder import StarCoderEngine
from langchain_starcoder.server import create_app
try:
    from langchain_starcoder.server import BoundedConfig as Config
except ImportError:  # a server without the bounds
    Config = uvicorn.Config
app = create_app(StarCoderEngine.load(sys.argv[1]))
uvicorn.Server(Config(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")).run()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=40.0, help="prompt size in MB (default 40)")
    parser.add_argument("--path", default="/v1/completions", help="/v1/completions (default) or /tokenize")
    args = parser.parse_args()

    from langchain_starcoder.testing import build_starcoder2

    with tempfile.TemporaryDirectory() as folder, socket.socket() as s:
        checkpoint = build_starcoder2(Path(folder) / "tiny")
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        child = subprocess.Popen([sys.executable, "-c", SERVE, str(checkpoint), str(port)])
        try:
            print(json.dumps(_measure(child, f"http://127.0.0.1:{port}", args.mb, args.path)))
        finally:
            child.terminate()
            child.wait(timeout=60)


def _measure(child: subprocess.Popen, url: str, mb: float, path: str) -> dict[str, float | int]:
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline and child.poll() is None, "the server did not start"
        time.sleep(0.1)
    process = psutil.Process(child.pid)
    before = process.memory_info().rss
    peak, sampling = before, True

    def sample() -> None:
        nonlocal peak
        while sampling:
            peak = max(peak, process.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    text = "x = 1\n" * int(mb * 1e6 / 6)
    fields = {"content": text} if path == "/tokenize" else {"prompt": text, "max_tokens": 4}
    body = json.dumps(fields).encode()
    started = time.perf_counter()
    headers = {"content-type": "application/json"}
    reply = httpx.post(f"{url}{path}", content=body, headers=headers, timeout=900)
    seconds = time.perf_counter() - started
    time.sleep(1.0)  # what the server keeps once it has answered
    sampling = False
    sampler.join()
    return {
        "prompt_mb": mb,
        "status": reply.status_code,
        "seconds_to_answer": round(seconds, 3),
        "rss_before_mb": before // 2**20,
        "rss_peak_mb": peak // 2**20,
        "rss_after_mb": process.memory_info().rss // 2**20,
    }


if __name__ == "__main__":
    main()
