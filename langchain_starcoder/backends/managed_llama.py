"""llama.cpp as a managed backend: a ``llama-server`` child on a loopback port with a random API key,
driven through the remote backend, restarted after it dies, and never outliving this process.

The key goes only to the child: it binds a port of its own choosing (``--port 0``) and says which in
its log, so no other process can take the port first and receive the key; the key reaches it through a
pipe, never argv or a file. Nothing of it is on disk: its log is a file without a name.

The child dies with us: on Linux the kernel sends it SIGKILL when its parent goes (``PR_SET_PDEATHSIG``,
set between fork and exec; it fires when the *thread* that forked exits, so every child is forked by
one daemon thread that lives as long as the process). A closed engine, a collected one and a normal
exit (Ctrl-C included) stop it through ``close`` and a finalizer.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx

from ..errors import EngineClosedError, InvalidParameterError, StarCoderError
from . import Generation
from .llama_options import LlamaCppOptions as LlamaCppOptions  # its documented home
from .llama_options import option_given
from .remote import RemoteBackend, ServerBackend

#: llama-server's log lines: where it listens (once the model is loaded), or the port it could not bind.
_LISTENING = re.compile(rb"listening on http://127\.0\.0\.1:(\d+)\b")
_NOT_BOUND = re.compile(r"couldn't bind HTTP server socket, hostname: \S+, port: (\d+)")


class LlamaServerError(StarCoderError):
    """The llama-server child could not start, or exited."""


# --- the child -------------------------------------------------------------------------------------


def _die_with_parent(prctl: Any, parent: int) -> None:
    """In the child, before exec: SIGKILL when the parent goes (Linux)."""
    prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took hold
        os._exit(1)


class _Spawner:
    """Forks every child from one daemon thread, so PR_SET_PDEATHSIG fires only when the process ends."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="starcoder-llama-spawner", daemon=True).start()

    def _run(self) -> None:
        while True:
            job, done = self._jobs.get()
            try:
                done.set_result(job())
            except BaseException as e:
                done.set_exception(e)

    def popen(self, args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        done: Future[subprocess.Popen[bytes]] = Future()
        self._jobs.put((lambda: subprocess.Popen(args, **kwargs), done))
        return done.result()


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _popen(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    global _spawner
    if not sys.platform.startswith("linux"):
        return subprocess.Popen(args, **kwargs)
    with _spawner_lock:
        _spawner = _spawner or _Spawner()
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    return _spawner.popen(args, preexec_fn=functools.partial(_die_with_parent, prctl, os.getpid()), **kwargs)


def _key_pipe(key: str) -> int:
    """The read end of a pipe that holds ``key``, closed for writing: the child reads it once, as a file
    (``/dev/fd/N``), and then nothing holds the key but the child."""
    read, write = os.pipe()
    with os.fdopen(write, "wb") as pipe:
        pipe.write(key.encode() + b"\n")  # far below a pipe's buffer: never blocks
    return read


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a child: SIGTERM, then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


#: LlamaServerProcess's keyword settings (what a server of the same model with other adapters keeps).
_SETTINGS = ("alias", "threads", "slots", "context", "server_args", "startup_timeout")


class LlamaServerProcess:
    """One ``llama-server`` child serving ``gguf`` as ``alias`` on 127.0.0.1 (see the module docs)."""

    def __init__(
        self,
        binary: Path,
        gguf: Path,
        *,
        alias: str,
        threads: int,
        slots: int,
        context: int,
        server_args: Sequence[str],
        startup_timeout: float,
        lora: Sequence[Path] = (),
    ) -> None:
        self.binary, self.gguf, self.alias = binary, gguf, alias
        self.lora = tuple(lora)  # GGUF adapters applied at scale 1 (a request's ``lora`` field may change it)
        self.threads, self.slots, self.context = threads, slots, context
        self.server_args, self.startup_timeout = tuple(server_args), startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.api_key = ""
        self._log: Any = None  # the child's stdout and stderr: a file without a name
        self._log_lock = threading.Lock()  # a restart swaps the log while a request may read its tail
        self._scanned = 0  # how far the log was searched for the port
        self._finalizer: weakref.finalize | None = None

    def with_lora(self, lora: Sequence[Path]) -> LlamaServerProcess:
        """A server, not started, of this one's binary, model and settings with the GGUF adapters ``lora``."""
        settings = {name: getattr(self, name) for name in _SETTINGS}
        return LlamaServerProcess(self.binary, self.gguf, **settings, lora=lora)

    def start(self) -> None:
        """Start the child and wait until it listens and answers ``/health``; on failure say why,
        from its log."""
        # hex: a url-safe key may begin with '-', which a command line reads as a flag
        self.api_key = secrets.token_hex(32)
        with self._log_lock:
            if self._log is not None:
                self._log.close()
            # a file, not a pipe (a full pipe would stall the server), with no name to leave behind
            self._log = tempfile.TemporaryFile(prefix="starcoder-llama-")  # noqa: SIM115 (lives with the child)
            self._scanned = 0
        key = _key_pipe(self.api_key)
        port = () if option_given(self.server_args, "--port") else ("--port", "0")  # 0: it picks a free one
        args = [
            str(self.binary),
            "-m",
            str(self.gguf),
            "--alias",
            self.alias,
            "--host",
            "127.0.0.1",
            *port,
            "--api-key-file",
            f"/dev/fd/{key}",
            "-t",
            str(self.threads),
            "-np",
            str(self.slots),
            "-c",
            str(self.slots * self.context),
            "--no-webui",
            "--metrics",
            *(arg for path in self.lora for arg in ("--lora", str(path))),
            *self.server_args,
        ]
        try:
            self.proc = _popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=self._log,
                pass_fds=(key,),
                start_new_session=True,
            )
        finally:
            os.close(key)
        # A Ctrl-C reaches only us (own session); exit and garbage collection stop the child.
        self._finalizer = weakref.finalize(self, _stop, self.proc)
        try:
            self.url = self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> str:
        """The child's URL once its log says where it listens and it answers ``/health``: the port is
        the one it bound itself (until it exits, no other process can hold it)."""
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout
        url = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LlamaServerError(self._exit_message())
            if not url and (port := self._listening_port()):
                url = f"http://127.0.0.1:{port}"
            if url:
                with contextlib.suppress(httpx.HTTPError):  # no key sent: /health is public
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        return url
            time.sleep(0.05)
        unsaid = "" if url else " and its log never said where it listens ('listening on http://...')"
        msg = (
            f"llama-server did not become ready within {self.startup_timeout:g} s (llama_cpp "
            f"startup_timeout){unsaid}: {self.log_tail()}"
        )
        raise LlamaServerError(msg)

    def _listening_port(self) -> int | None:
        """The port the child's log says it listens on, searched in the lines added since the last look."""
        data = self._read_log(self._scanned)
        whole_lines = data.rfind(b"\n") + 1
        found = _LISTENING.search(data, 0, whole_lines)
        self._scanned += whole_lines
        return int(found[1]) if found else None

    def _exit_message(self) -> str:
        assert self.proc is not None
        tail = self.log_tail()
        if taken := _NOT_BOUND.search(tail):
            return (
                f"llama-server could not listen on 127.0.0.1:{taken[1]}: the port is taken by another "
                "process. Leave --port out of llama_cpp server_args (the child then takes a free port of "
                "its own), or name a free one."
            )
        return f"llama-server exited with code {self.proc.returncode} while starting: {tail}"

    def _read_log(self, start: int = 0, *, last: int | None = None) -> bytes:
        """The log's bytes from ``start``, or its ``last`` bytes."""
        with self._log_lock:
            if self._log is None or self._log.closed:
                return b""
            fd = self._log.fileno()
            size = os.fstat(fd).st_size
            start = max(size - last, 0) if last is not None else start
            return os.pread(fd, max(size - start, 0), start)

    def log_tail(self, chars: int = 1500) -> str:
        text = self._read_log(last=4 * chars).decode(errors="replace")[-chars:]
        return text.strip() or "(empty log)"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Stop the child (its log stays readable until the next start)."""
        if self._finalizer is not None:
            self._finalizer()  # runs _stop once
            self._finalizer = None


# --- the backend -----------------------------------------------------------------------------------


class ManagedLlamaBackend(ServerBackend):
    """The remote backend over a llama-server child this backend owns (see the module docs).

    ``connect(url, api_key)`` builds the remote backend over a started child. A child that exited is
    started again on the next call; a request it was running fails with a :class:`LlamaServerError`.
    """

    def __init__(
        self,
        server: LlamaServerProcess,
        connect: Callable[[str, str], RemoteBackend],
        *,
        name: str,
        path: Path | None,
        sliding_window: int | None,
        adapter: Any = None,
    ) -> None:
        super().__init__()
        self.name, self.path, self.sliding_window = name, path, sliding_window
        # the server (--lora) is this backend's alone: all its KV is computed under this adapter
        self.adapter = adapter
        self.server = server
        self._connect = connect
        self.restarts = 0
        self._remote = self._start()

    def with_adapter(self, adapter: Any, lora: Path) -> ManagedLlamaBackend:
        """A backend of its own llama-server over the same base GGUF with ``lora`` (``adapter`` as llama.cpp's
        GGUF adapter) at scale 1: the base file is mapped, so the page cache shares it between the two
        servers; its KV is all under the adapter. This backend is left as it is."""
        if self.adapter is not None:
            msg = (
                f"The llama.cpp engine for {self.name} runs the adapter {self.adapter.path} already; call "
                "with_adapter on an engine of the base model (loaded without adapter_path)."
            )
            raise InvalidParameterError(msg)
        return ManagedLlamaBackend(
            self.server.with_lora((lora,)),
            self._connect,
            name=self.name,
            path=self.path,
            sliding_window=self.sliding_window,
            adapter=adapter,
        )

    def _start(self) -> RemoteBackend:
        self.server.start()
        try:
            return self._connect(self.server.url, self.server.api_key)
        except BaseException:
            self.server.stop()
            raise

    @property
    def json_whitespace(self) -> str | None:
        return self._remote.json_whitespace

    def _live_remote(self) -> RemoteBackend:
        """The remote backend over a running child: a child that exited is started again."""
        with self._lock:
            if self._closed:
                msg = f"The llama.cpp engine for {self.name} is closed; load a new one."
                raise EngineClosedError(msg)
            if not self.server.alive:
                code = None if self.server.proc is None else self.server.proc.returncode
                self._remote.close()
                self.server.stop()
                try:
                    self._remote = self._start()
                except LlamaServerError as e:
                    msg = f"llama-server exited (code {code}) and could not be started again: {e}"
                    raise LlamaServerError(msg) from None
                self.restarts += 1
            return self._remote

    @property
    def vocab_size(self) -> int:
        return self._remote.vocab_size

    @property
    def context_window(self) -> int:
        return self._remote.context_window

    def submit(self, generations: Sequence[Generation]) -> Future[None]:
        remote = self._live_remote()
        inner = remote.submit(generations)
        done: Future[None] = Future()
        done.set_running_or_notify_cancel()

        def relay(f: Future[None]) -> None:
            error = f.exception()
            if error is None:
                done.set_result(None)
                return
            proc = self.server.proc
            if proc is not None and isinstance(error, ConnectionError):
                # A killed child's sockets close a moment before it can be reaped.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=2)
            if proc is not None and proc.poll() is not None:  # the child died under the request
                msg = (
                    f"llama-server (pid {proc.pid}) exited with code {proc.returncode} during the request; "
                    f"the next call starts it again. Its log ends: {self.server.log_tail(600)}"
                )
                error = LlamaServerError(msg)
            done.set_exception(error)

        inner.add_done_callback(relay)
        return done

    def _shut_down(self) -> None:
        """Cancel what runs, then stop the child."""
        self._remote.close()
        self.server.stop()
