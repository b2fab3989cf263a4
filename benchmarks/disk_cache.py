"""Prompt caches on disk (issue 22): time to first token of an infill sharing a 2,000-token repository
context in a NEW process, with the cache file on disk against a cold prefill and against an in-memory
hit; bytes on disk per cached token; the longest pause a write causes a concurrent request.

Each measured process loads the engine and answers one short unrelated request first (not timed, and
too short to be written), so both sides pay the same first-call costs before the timed infill.

Run alone: ``python -m benchmarks.disk_cache``; in the suite: ``--only disk_cache``.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .harness import NARROW, REPO, Row, Section

ITEM = 14
SUFFIX = "\n    return result\n"


def _requests(engine: Any, context_tokens: int, count: int) -> dict[str, Any]:
    """The infills of bench_cache: one long context file, a short head, a different tail each."""
    from .common import code_tokens

    return {
        "context": code_tokens(engine, context_tokens, seed=7),
        "other_context": code_tokens(engine, context_tokens, seed=8),
        "head": code_tokens(engine, 40, seed=11),
        "tails": [code_tokens(engine, 24, seed=100 + i) for i in range(count)],
    }


def _infill(engine: Any, texts: dict[str, Any], tail: str, context: str = "context") -> Any:
    from langchain_starcoder.fim import ContextFile

    files = [ContextFile("app/util.py", texts[context])]
    return engine.infill(
        texts["head"] + tail,
        SUFFIX,
        context_files=files,
        repo_name="acme/app",
        file_path="app/main.py",
        max_tokens=1,
    )


def _timed(engine: Any, texts: dict[str, Any], tail: str) -> dict[str, float]:
    start = time.perf_counter()
    done = _infill(engine, texts, tail)
    return {
        "seconds": time.perf_counter() - start,
        "cached": done.cached_tokens,
        "prompt": done.prompt_tokens,
    }


# --- the measured processes ------------------------------------------------------------------------


def task_ttft(args: dict[str, Any]) -> dict[str, Any]:
    """A new process: one infill (from the folder, or cold without one), then another from memory."""
    from langchain_starcoder import StarCoderEngine

    engine = StarCoderEngine.load(args["checkpoint"], prompt_cache_dir=args.get("folder"))
    engine.generate("def warm_up():\n    return 1\n", max_tokens=2)  # first-call costs, not timed
    engine.clear_cache()
    texts = args["texts"]
    first = _timed(engine, texts, texts["tails"][args["tail"]])
    memory = _timed(engine, texts, texts["tails"][args["tail"] + 1])  # same context, another ending
    engine.close()
    return {"first": first, "memory": memory}


def task_stall(args: dict[str, Any]) -> dict[str, Any]:
    """Short requests back to back while a long one's cache is copied out and written (or not)."""
    from langchain_starcoder import StarCoderEngine
    from langchain_starcoder.backends.prompt_cache.disk import _snapshot

    engine = StarCoderEngine.load(args["checkpoint"], prompt_cache_dir=args.get("folder"))
    engine.generate("def warm_up():\n    return 1\n", max_tokens=2)
    texts = args["texts"]
    _infill(engine, texts, texts["tails"][0])
    if engine.backend._disk is not None:
        engine.backend._disk.flush()
    # The worker's part of a write, timed alone: copying the arrays out of MLX.
    entry = max(engine.backend._prompt_caches._entries, key=lambda e: len(e.tokens))
    copy = engine.backend.call(lambda: _time(lambda: _snapshot(entry.cache, len(entry.tokens))))
    _infill(engine, texts, texts["tails"][0], "other_context")  # with a folder its write is now queued
    with _short_requests(engine) as spans:
        write_started = time.perf_counter()
        if engine.backend._disk is not None:
            engine.backend._disk.flush()
        write_ended = time.perf_counter()
        write_seconds = write_ended - write_started
        time.sleep(max(0.0, 1.0 - write_seconds))  # short requests for at least a second in all
    files = sorted(Path(args["folder"]).glob("*.safetensors")) if args.get("folder") else []
    engine.close()
    latencies = [end - start for start, end in spans]
    during = [end - start for start, end in spans if start < write_ended] or latencies[:1]
    return {
        "latencies": latencies,
        "during_write": during,
        "write_seconds": write_seconds,
        "copy_seconds": copy,
        "file_bytes": files[0].stat().st_size if files else 0,
        "file_tokens": len(entry.tokens),
    }


def task_stall_3b(args: dict[str, Any]) -> dict[str, Any]:
    """A cache of starcoder2-3b's size (30 layers, 2 KV heads x 128, float32) for ``tokens`` tokens,
    offered to a folder on the engine's worker while short requests run back to back."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from langchain_starcoder import StarCoderEngine
    from langchain_starcoder.backends.prompt_cache import CacheLayout, DiskPromptCache
    from langchain_starcoder.types import CachePartition

    engine = StarCoderEngine.load(args["checkpoint"])
    engine.generate("def warm_up():\n    return 1\n", max_tokens=2)
    n, layers = args["tokens"], 30
    layout = CacheLayout(layers, 2, 128, None, 64, max_tokens=16384)
    disk = DiskPromptCache(Path(args["folder"]), "0" * 40, 1 << 40, layout)

    def make() -> list[Any]:
        cache = [KVCache() for _ in range(layers)]
        for c in cache:
            c.update_and_fetch(mx.random.normal((1, 2, n, 128)), mx.random.normal((1, 2, n, 128)))
        mx.eval([(c.keys, c.values) for c in cache])
        return cache

    cache = engine.backend.call(make)
    with _short_requests(engine) as spans:
        time.sleep(1.0)  # short requests alone first
        started = time.perf_counter()
        copy = engine.backend.call(lambda: _time(lambda: disk.offer(list(range(n)), cache, CachePartition())))
        disk.flush()
        ended = time.perf_counter()
        time.sleep(0.5)
    nbytes = sum(p.stat().st_size for p in Path(args["folder"]).glob("*.safetensors"))
    disk.close()
    engine.close()
    before = [e - s for s, e in spans if e < started]
    during = [e - s for s, e in spans if e >= started and s <= ended]
    return {
        "before": before,
        "during": during,
        "copy_seconds": copy,
        "write_seconds": ended - started,
        "file_bytes": nbytes,
    }


@contextlib.contextmanager
def _short_requests(engine: Any) -> Iterator[list[tuple[float, float]]]:
    """Short requests back to back on a thread while the block runs; the (start, end) of each."""
    short = [engine.encode(f"x_{i} = {i}\n") for i in range(4)]
    spans: list[tuple[float, float]] = []
    stop = threading.Event()

    def hammer() -> None:
        i = 0
        while not stop.is_set():
            start = time.perf_counter()
            engine.generate(short[i % 4], max_tokens=1)
            spans.append((start, time.perf_counter()))
            i += 1

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        yield spans
    finally:
        stop.set()
        thread.join()


def _time(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _run(task: str, args: dict[str, Any]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.disk_cache", task, json.dumps(args)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, check=False, timeout=1800)
    if proc.returncode != 0:
        msg = f"benchmark process {task} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
        raise RuntimeError(msg)
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the section -----------------------------------------------------------------------------------


def bench_disk_cache(ctx: Any) -> Section:
    """Issue 22: a new process's time to first token with the prompt cache on disk, cold, in memory."""
    from langchain_starcoder import StarCoderEngine

    section = Section("disk_cache", ITEM, "Prompt caches on disk")
    shape = ctx.checkpoints.shape(NARROW)
    checkpoint = ctx.checkpoints.get(NARROW)
    engine = StarCoderEngine.load(checkpoint)
    texts = _requests(engine, ctx.size(2000, 2000, 300), 2 * (ctx.reps + ctx.warmup) + 2)
    engine.close()
    with tempfile.TemporaryDirectory(dir=ctx.checkpoints.workdir) as tmp:
        folder = str(Path(tmp) / "prompt-cache")
        made = _run("ttft", {"checkpoint": str(checkpoint), "folder": folder, "texts": texts, "tail": 0})
        samples: dict[str, list[float]] = {"disk": [], "cold": [], "memory": []}
        cached: list[int] = []
        for rep in range(ctx.reps + ctx.warmup):  # a new process for each, disk and cold in turn
            tail = 2 + 2 * rep
            disk = _run(
                "ttft", {"checkpoint": str(checkpoint), "folder": folder, "texts": texts, "tail": tail}
            )
            cold = _run("ttft", {"checkpoint": str(checkpoint), "texts": texts, "tail": tail})
            if rep >= ctx.warmup:
                samples["disk"].append(disk["first"]["seconds"])
                samples["cold"].append(cold["first"]["seconds"])
                samples["memory"].append(disk["memory"]["seconds"])
                cached.append(disk["first"]["cached"])
        with_write = _run(
            "stall", {"checkpoint": str(checkpoint), "folder": str(Path(tmp) / "stall"), "texts": texts}
        )
        without = _run("stall", {"checkpoint": str(checkpoint), "texts": texts})
        big = _run(
            "stall_3b",
            {
                "checkpoint": str(checkpoint),
                "folder": str(Path(tmp) / "3b"),
                "tokens": ctx.size(2000, 2000, 300),
            },
        )
    describe = shape.describe()
    section.rows.append(
        Row(
            ITEM,
            "Prompt cache on disk",
            "time to first token, new process",
            "cache file on disk",
            "cold prefill",
            samples["disk"],
            samples["cold"],
            "s",
            describe,
            ("<=", 0.1),
        )
    )
    section.rows.append(
        Row(
            ITEM,
            "Prompt cache on disk",
            "time to first token",
            "cache file, new process",
            "in-memory hit",
            samples["disk"],
            samples["memory"],
            "s",
            describe,
        )
    )
    section.rows.append(
        Row(
            ITEM,
            "Prompt cache on disk",
            "short request latency",
            "during a cache write",
            "no disk cache",
            with_write["latencies"],
            without["latencies"],
            "s",
            describe,
            note="max in notes",
        )
    )
    per_token = with_write["file_bytes"] / max(with_write["file_tokens"], 1)
    prompt = made["first"]["prompt"]
    section.rows.append(
        Row(
            ITEM,
            "Prompt cache on disk",
            "short request latency",
            "during a 3b-sized write",
            "just before it",
            big["during"],
            big["before"],
            "s",
            "3b KV shape (30 layers), float32",
            note="max in notes",
        )
    )
    section.data.update(
        prompt_tokens=prompt,
        cached_tokens=statistics.median(cached),
        bytes_per_token=per_token,
        write_seconds=with_write["write_seconds"],
        copy_seconds=with_write["copy_seconds"],
        max_latency_writing=max(with_write["during_write"]),
        max_latency_without=max(without["latencies"]),
        write_3b=big,
    )
    section.notes += [
        f"{prompt}-token repository-level infill (max_tokens=1); in the new process "
        f"{statistics.median(cached):.0f} tokens came from the file written by an earlier process.",
        f"Bytes on disk per cached token: {per_token:,.0f} (the KV arrays, float32, plus a header of "
        "the token ids).",
        f"A write: {with_write['copy_seconds'] * 1e3:.1f} ms on the worker copying the arrays out of MLX "
        f"(the only part that holds up requests), {with_write['write_seconds'] * 1e3:.1f} ms until the "
        "file was on disk (writer thread). Short max_tokens=1 requests sent back to back meanwhile: the "
        f"longest of the {len(with_write['during_write'])} that started during the write took "
        f"{max(with_write['during_write']) * 1e3:.1f} ms; the longest of {len(without['latencies'])} "
        f"without a disk cache {max(without['latencies']) * 1e3:.1f} ms.",
        f"starcoder2-3b's KV shape (30 layers, float32), {ctx.size(2000, 2000, 300)} tokens, "
        f"{big['file_bytes'] / 2**20:.0f} MiB: {big['copy_seconds'] * 1e3:.0f} ms on the worker, "
        f"{big['write_seconds'] * 1e3:.0f} ms until on disk; short requests meanwhile: longest "
        f"{max(big['during'], default=float('nan')) * 1e3:.0f} ms of {len(big['during'])}, against "
        f"{max(big['before'], default=float('nan')) * 1e3:.0f} ms of {len(big['before'])} just before.",
    ]
    return section


def main() -> None:
    if len(sys.argv) == 3:  # a measured process
        task = {"ttft": task_ttft, "stall": task_stall, "stall_3b": task_stall_3b}[sys.argv[1]]
        print(json.dumps(task(json.loads(sys.argv[2]))))
        return
    from .common import Context
    from .harness import Checkpoints

    workdir = REPO / ".bench-work"
    section = bench_disk_cache(Context(Checkpoints(workdir)))
    print(json.dumps(section.to_json(), indent=2))


if __name__ == "__main__":
    main()
