"""A real vLLM OpenAI server (its CPU build, from :mod:`.vllm_install`'s venv) on 127.0.0.1, for the
remote backend's tests and benchmarks: started in its own process group, stopped by its own pid and
group (vLLM's engine core is a child process), never left behind by an exiting Python."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from .servers import free_port
from .vllm_install import DEFAULT_VENV, is_installed, vllm_python

#: vLLM's CPU attention takes these head sizes only (another starts, then kills the engine on the
#: first request).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


# The process we start: it runs vLLM's server as its child, in one process group, and ends them all
# when asked (SIGTERM: vLLM's own shutdown, SIGKILL after 5 s), when vLLM exits (its engine core would
# stay), or when the caller dies, however it dies (Linux's PR_SET_PDEATHSIG sends the SIGTERM).
_SUPERVISOR = """
import contextlib, ctypes, os, signal, subprocess, sys

server = None

def end(*_):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if server is not None:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(5)
    os.killpg(0, signal.SIGKILL)

signal.signal(signal.SIGTERM, end)
if sys.platform == "linux":
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)
    if os.getppid() != int(os.environ["VLLM_SERVER_PARENT"]):
        os.killpg(0, signal.SIGKILL)  # the caller died before the line above
server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", *sys.argv[1:]])
server.wait()
os.killpg(0, signal.SIGKILL)
"""


def _running_in_group(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies do not: they hold no socket)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            state, _, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
            if int(group) == pgid and state != "Z":
                return True
    return False


class VLLMServer:
    """``python -m vllm.entrypoints.openai.api_server`` serving checkpoint folder ``model`` as ``name``
    (float32, prefix caching, ``cached_tokens`` in usage); its output goes to ``log``."""

    def __init__(
        self,
        model: Path,
        *,
        name: str = "tiny",
        venv: Path = DEFAULT_VENV,
        max_model_len: int = 2048,
        log: Path | None = None,
    ) -> None:
        config = json.loads((Path(model) / "config.json").read_text())
        head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        if head not in CPU_HEAD_SIZES:
            msg = (
                f"{model} has attention heads of size {head}; vLLM's CPU attention takes {CPU_HEAD_SIZES} "
                "only (another kills its engine on the first request): build it with another preset."
            )
            raise ValueError(msg)
        if not is_installed(venv):
            msg = (
                f"vLLM's CPU build is not installed in {venv}: run "
                f"`python -m langchain_starcoder.testing.vllm_install {venv}` first (minutes, once)."
            )
            raise RuntimeError(msg)
        self.max_model_len = max_model_len
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log or Path(model).with_name(f"{Path(model).name}-vllm.log")
        self.args = [
            str(vllm_python(venv)),
            "-c",
            _SUPERVISOR,
            "--model",
            str(model),
            "--served-model-name",
            name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "--max-model-len",
            str(max_model_len),
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--disable-uvicorn-access-log",
        ]
        self.env = {
            **os.environ,
            "VLLM_TARGET_DEVICE": "cpu",
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            # one core kept from its compute threads: its front answers while it generates
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "1",
        }
        self.proc: subprocess.Popen | None = None
        self.ready_seconds: float | None = None
        atexit.register(self.stop)

    def launch(self) -> None:
        """Start the server and return at once (it loads for about a minute): :meth:`wait` for it."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self.stop()  # a group left by a killed leader
        env = {**self.env, "VLLM_SERVER_PARENT": str(os.getpid())}
        with self.log.open("ab") as log:  # a file, not a pipe: a full pipe would stall the server
            self.proc = subprocess.Popen(
                self.args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self._launched = time.monotonic()

    def wait(self, timeout: float = 300) -> None:
        """Until ``/v1/models`` answers; an exit or ``timeout`` raises with the log's end."""
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                msg = f"vLLM exited ({self.proc.returncode}) while loading:\n{self.log_tail()}"
                self.stop()
                raise RuntimeError(msg)
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    self.ready_seconds = time.monotonic() - self._launched
                    return
            time.sleep(0.5)
        self.stop()
        msg = f"vLLM did not answer within {timeout} s:\n{self.log_tail()}"
        raise RuntimeError(msg)

    def start(self) -> None:
        self.launch()
        self.wait()

    def stop(self, kill: bool = False) -> None:
        """End the server and everything in its process group: SIGTERM to our process (vLLM shuts
        its engine down), or SIGKILL to the group with ``kill`` or after 30 s."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL) if kill else proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        # Our process is gone; vLLM's may still be dying, its port still open: wait them out.
        # (The port too: right after a kill a connect was seen reset, not refused, with the group gone.)
        deadline = time.monotonic() + 30
        while (_running_in_group(proc.pid) or _accepts(self.port)) and time.monotonic() < deadline:
            time.sleep(0.05)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples on ``/metrics`` whose labels include ``labels``, e.g.
        ``metric("vllm:request_success_total", finished_reason="abort")``."""
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        wanted = [f'{key}="{value}"' for key, value in labels.items()]
        samples = [
            line.rsplit(maxsplit=1)[-1]
            for line in text.splitlines()
            if line.startswith((f"{name}{{", f"{name} ")) and all(w in line for w in wanted)
        ]
        if not samples:
            msg = f"vLLM's /metrics has no {name}"
            raise KeyError(msg)
        return sum(float(s) for s in samples)

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _accepts(port: int) -> bool:
    """Whether something still accepts connections on 127.0.0.1:``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True
