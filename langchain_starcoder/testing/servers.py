"""Our HTTP server, run for tests as ``serve`` runs it: in a thread, or as a ``serve`` child process."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from typing import Any

import httpx
import uvicorn

from ..server import BoundedConfig


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """A uvicorn server (BoundedConfig, as ``serve`` uses) on a free loopback port, in a thread."""

    def __init__(self, app: Any):
        self.port = free_port()
        config = BoundedConfig(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float = 120) -> None:
    """Wait until a ``serve`` child answers ``/health`` with 200; fail if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, "serve did not become healthy"
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        time.sleep(0.2)
