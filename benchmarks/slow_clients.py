"""Slow clients against ``langchain-starcoder serve``: many connections that never finish their request
headers, then how long ``/health`` takes and how many files the server holds open.

    python -m benchmarks.slow_clients --count 2100

One JSON line is printed. The server (the tiny test checkpoint) runs with its defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2100, help="slow connections (default 2100)")
    args = parser.parse_args()

    from langchain_starcoder.testing import build_starcoder2  # imports mlx_lm, which sets the file limit

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this side holds every connection
    with tempfile.TemporaryDirectory() as folder, socket.socket() as s:
        checkpoint = build_starcoder2(Path(folder) / "tiny")
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        argv = [sys.executable, "-m", "langchain_starcoder", "serve", "--model", str(checkpoint)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        child = subprocess.Popen(
            [*argv, "--port", str(port), "--log-level", "error"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        try:
            print(json.dumps(_measure(child, port, args.count)))
        finally:
            child.terminate()
            child.wait(timeout=60)


def _measure(child: subprocess.Popen, port: int, count: int) -> dict[str, object]:
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline and child.poll() is None, "the server did not start"
        time.sleep(0.2)
    slow = []
    started = time.perf_counter()
    try:
        for _ in range(count):
            s = socket.socket()
            s.settimeout(10)
            try:
                s.connect(("127.0.0.1", port))
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
            except OSError:
                pass  # closed to make room: the server's choice
            slow.append(s)
        opened = time.perf_counter() - started
        time.sleep(1.0)
        files = len(os.listdir(f"/proc/{child.pid}/fd"))
        started = time.perf_counter()
        try:
            health: object = httpx.get(f"{url}/health", timeout=30).status_code
        except httpx.HTTPError as e:
            health = type(e).__name__
        return {
            "slow_connections": count,
            "seconds_to_open_them": round(opened, 2),
            "server_open_files": files,
            "health": health,
            "health_seconds": round(time.perf_counter() - started, 3),
        }
    finally:
        for s in slow:
            s.close()


if __name__ == "__main__":
    main()
