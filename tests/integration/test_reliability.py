"""Reliability: many callers at once, long runs, faults. Each must end cleanly and stay correct."""

from __future__ import annotations

import asyncio
import random
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import psutil
import pytest

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.fim import ContextFile
from langchain_starcoder.testing import copy_checkpoint

SNIPPETS = [
    "def parse(line):\n    ",
    "class Queue:\n    def __init__(self):\n        ",
    "import json\n\ndef load(path):\n",
    "// 数据 🚀\nfunction sum(xs) {",
    "for (let i = 0; i < n; i++) {",
    "SELECT id, name FROM orders WHERE",
    "fn main() {\n    let total =",
    "#include <stdio.h>\nint main() {",
]


@dataclass(frozen=True)
class Request:
    kind: str  # generate | stream | infill | batch
    prompt: str
    max_tokens: int
    stop: tuple[str, ...]

    def run(self, engine: StarCoderEngine) -> list[tuple[str, list[int]]]:
        kw = {"max_tokens": self.max_tokens, "stop": self.stop}
        if self.kind == "stream":
            chunks = list(engine.stream(self.prompt, **kw))
            return [("".join(c.text for c in chunks), [t for c in chunks for t in c.token_ids])]
        if self.kind == "infill":
            c = engine.infill(self.prompt, "\n    return result\n", context_files=CONTEXT, **kw)
            return [(c.text, c.token_ids)]
        if self.kind == "batch":
            return [(c.text, c.token_ids) for c in engine.generate_batch([self.prompt, *SNIPPETS[:2]], **kw)]
        c = engine.generate(self.prompt, **kw)
        return [(c.text, c.token_ids)]

    async def arun(self, engine: StarCoderEngine) -> list[tuple[str, list[int]]]:
        kw = {"max_tokens": self.max_tokens, "stop": self.stop}
        if self.kind == "stream":
            chunks = [c async for c in engine.astream(self.prompt, **kw)]
            return [("".join(c.text for c in chunks), [t for c in chunks for t in c.token_ids])]
        if self.kind == "infill":
            c = await engine.ainfill(self.prompt, "\n    return result\n", context_files=CONTEXT, **kw)
            return [(c.text, c.token_ids)]
        if self.kind == "batch":
            done = await engine.agenerate_batch([self.prompt, *SNIPPETS[:2]], **kw)
            return [(c.text, c.token_ids) for c in done]
        c = await engine.agenerate(self.prompt, **kw)
        return [(c.text, c.token_ids)]


CONTEXT = [ContextFile("utils/io.py", "def read(path):\n    return open(path).read()\n")]


def make_requests(n: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    kinds = ["generate", "stream", "infill", "batch"]
    stops = [(), ("\n",), ("e", "xyz"), ("return",)]
    return [
        Request(
            rng.choice(kinds),
            rng.choice(SNIPPETS) * rng.randint(1, 3),
            rng.randint(1, 24),
            rng.choice(stops),
        )
        for _ in range(n)
    ]


@pytest.mark.timeout(600)
def test_sixteen_threads_and_sixteen_tasks(tiny_path: Path) -> None:
    requests = make_requests(200, seed=1)
    reference = StarCoderEngine.load(tiny_path, max_prompt_caches=0)
    try:
        alone = {r: r.run(reference) for r in set(requests)}
    finally:
        reference.close()

    engine = StarCoderEngine.load(tiny_path)
    threaded, tasked = requests[:100], requests[100:]
    results: dict[int, list[tuple[str, list[int]]]] = {}

    async def tasks() -> None:
        queue = list(enumerate(tasked, start=100))

        async def worker() -> None:
            while queue:
                i, r = queue.pop()
                results[i] = await r.arun(engine)

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(16))), timeout=300)

    try:
        loop_thread = threading.Thread(target=lambda: asyncio.run(tasks()))
        loop_thread.start()
        with ThreadPoolExecutor(16) as pool:
            futures = {i: pool.submit(r.run, engine) for i, r in enumerate(threaded)}
            for i, future in futures.items():
                results[i] = future.result(timeout=300)  # fails loudly rather than hangs
        loop_thread.join(timeout=300)
        assert not loop_thread.is_alive(), "the asyncio tasks did not finish"
    finally:
        engine.close()
    assert len(results) == 200
    mismatched = [i for i, r in enumerate(requests) if results[i] != alone[r]]
    assert mismatched == []


@pytest.mark.timeout(600)
def test_soak_memory_stays_bounded(tiny_path: Path) -> None:
    bound = 2 << 20  # 2 MiB of prompt caches
    engine = StarCoderEngine.load(tiny_path, max_prompt_caches=8, max_prompt_cache_bytes=bound)
    process = psutil.Process()
    rss, active, caches = [], [], []
    try:
        for r in make_requests(500, seed=2):
            if r.kind == "batch":
                r = Request("generate", r.prompt, r.max_tokens, r.stop)
            r.run(engine)
            rss.append(process.memory_info().rss)
            active.append(engine.backend.call(mx.get_active_memory))
            caches.append(engine.prompt_cache_bytes)
        assert max(caches) <= bound
        warm = 100  # after warm-up, nothing grows
        assert max(rss[warm:]) < max(rss[:warm]) + (64 << 20)
        assert max(active[warm:]) <= max(active[:warm]) + bound
        engine.clear_cache()
        assert engine.prompt_cache_bytes == 0
        assert engine.backend.call(mx.get_active_memory) < max(active)
        print(
            f"\nsoak: RSS high-water {max(rss) / 2**20:.0f} MiB, MLX active high-water "
            f"{max(active) / 2**20:.1f} MiB, prompt caches high-water {max(caches) / 2**20:.2f} MiB"
        )
    finally:
        engine.close()


def test_model_folder_deleted_after_loading(
    tmp_path: Path, tiny_path: Path, tiny_engine: StarCoderEngine
) -> None:
    path = copy_checkpoint(tiny_path, tmp_path / "doomed")
    engine = StarCoderEngine.load(path)
    try:
        before = engine.generate(SNIPPETS[0], max_tokens=12)
        shutil.rmtree(path)
        after = engine.generate(SNIPPETS[0] + "x", max_tokens=12)  # weights and tokenizer are in memory
        assert after.token_ids == tiny_engine.generate(SNIPPETS[0] + "x", max_tokens=12).token_ids
        assert before.token_ids == tiny_engine.generate(SNIPPETS[0], max_tokens=12).token_ids
    finally:
        engine.close()
