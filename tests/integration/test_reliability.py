"""Reliability: many callers at once, long runs, faults. Each must end cleanly and stay correct."""

from __future__ import annotations

import asyncio
import random
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import psutil
import pytest

from langchain_starcoder import ContextLengthError, InvalidParameterError, StarCoderEngine
from langchain_starcoder.backends import Generation
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


# --- abandoned work never keeps the engine busy -------------------------------------------------------
# Each test watches the generations the engine hands its backend (backend_spy), waits until the worker has run
# everything queued before (a no-op job), and then counts what each generation did.


def _idle(engine: StarCoderEngine) -> None:
    engine.backend.call(lambda: None)  # runs after every job queued before it


def _generated(generation: Generation) -> int:
    return len(generation.sink._text.token_ids)


LONG = 1000  # max_tokens of work that must not run to the end


@pytest.mark.parametrize("how", ["close", "drop"])
@pytest.mark.parametrize("kind", ["stream", "stream_infill"])
def test_stream_left_before_its_first_chunk(
    tiny_engine: StarCoderEngine, backend_spy: Any, kind: str, how: str
) -> None:
    seen = backend_spy(tiny_engine).generations
    stream = getattr(tiny_engine, kind)(SNIPPETS[2], max_tokens=LONG)
    if how == "close":
        stream.close()
    del stream  # never iterated: dropping it must cancel too
    _idle(tiny_engine)
    [generation] = seen
    assert generation.cancelled.is_set() and _generated(generation) < 50
    assert tiny_engine.generate(SNIPPETS[2], max_tokens=6).completion_tokens == 6


async def test_astream_left_before_its_first_chunk(tiny_engine: StarCoderEngine, backend_spy: Any) -> None:
    seen = backend_spy(tiny_engine).generations
    for kind in ("astream", "astream_infill"):
        for _ in range(5):  # on a busy machine the first chunk can come before the cancel: then again
            i = len(seen)
            stream = getattr(tiny_engine, kind)(SNIPPETS[3], max_tokens=LONG)
            first = asyncio.ensure_future(stream.__anext__())
            while len(seen) <= i or not seen[i].sink._started:  # submitted and started on the worker
                await asyncio.sleep(0.001)
            left = first.cancel()  # False: the first chunk was already taken
            if left:
                with pytest.raises(asyncio.CancelledError):
                    await first
            del stream
            if left:
                break
        assert left, f"{kind}: the first chunk came before every cancel"
    await asyncio.to_thread(_idle, tiny_engine)
    assert len(seen) >= 2 and all(g.cancelled.is_set() and _generated(g) < 50 for g in seen)


async def test_cancelled_agenerate_batch(tiny_engine: StarCoderEngine, backend_spy: Any) -> None:
    seen = backend_spy(tiny_engine).generations
    task = asyncio.ensure_future(tiny_engine.agenerate_batch(SNIPPETS[:3], max_tokens=LONG))
    while not seen or not any(_generated(g) for g in seen):
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.to_thread(_idle, tiny_engine)
    assert len(seen) == 3 and all(_generated(g) < LONG // 2 for g in seen)


def test_cancel_between_prefill_chunks_and_before_start(
    tiny_path: Path, monkeypatch: pytest.MonkeyPatch, backend_spy: Any
) -> None:
    engine = StarCoderEngine.load(tiny_path, prefill_step_size=16)
    try:
        seen = backend_spy(engine).generations
        model = engine.backend.model

        class CancelAfterFiveSteps:
            """The model, which cancels the first request after its fifth forward pass."""

            calls = 0

            def __call__(self, *args: object, **kwargs: object) -> object:
                self.calls += 1
                if self.calls == 5:
                    seen[0].cancelled.set()
                return model(*args, **kwargs)

            def __getattr__(self, name: str) -> object:
                return getattr(model, name)

        monkeypatch.setattr(engine.backend, "model", CancelAfterFiveSteps())
        prompt = [100 + (i * 7) % 900 for i in range(1900)]  # ~120 prefill steps
        running = engine.stream(prompt, max_tokens=8)
        queued = engine.stream(SNIPPETS[0], max_tokens=LONG)  # waits behind the long prefill
        queued.close()
        _idle(engine)
        long_job, queued_job = seen
        assert not queued_job.sink._started  # never started
        held = engine.backend.call(lambda: engine.backend._prompt_caches._entries[-1].tokens)
        assert held == prompt[: 5 * 16]  # stopped after the fifth step, and kept what it prefilled
        assert _generated(long_job) == 0
        del running
        monkeypatch.setattr(engine.backend, "model", model)
        # What was prefilled is exact: the same prompt again reuses it and answers as a fresh engine.
        again = engine.generate(prompt, max_tokens=8)
        assert again.cached_tokens == len(held)
        fresh = StarCoderEngine.load(tiny_path, max_prompt_caches=0)
        try:
            assert again.token_ids == fresh.generate(prompt, max_tokens=8).token_ids
        finally:
            fresh.close()
    finally:
        engine.close()


# --- wrong input, clear errors ------------------------------------------------------------------------


@pytest.mark.parametrize("prompt", [b"def f():\n", bytearray(b"def f():\n"), memoryview(b"def f():\n")])
def test_binary_prompts_are_refused(tiny_engine: StarCoderEngine, prompt: object) -> None:
    from llama_index.core.llms import ChatMessage  # noqa: F401  (LlamaIndex's complete() goes the same way)

    from langchain_starcoder.llama_index import StarCoder

    for call in (
        lambda: tiny_engine.generate(prompt),
        lambda: tiny_engine.generate_batch([prompt, "def g():"]),
        lambda: StarCoder(engine=tiny_engine).complete(prompt, formatted=True),
    ):
        with pytest.raises(InvalidParameterError, match="decode"):
            call()
    assert tiny_engine.generate("def f():\n", max_tokens=3).completion_tokens == 3


@pytest.mark.parametrize("temperature", [1e-39, 1e-45, 5e-324, 1e-7])
def test_tiny_temperatures_are_greedy(tiny_engine: StarCoderEngine, temperature: float) -> None:
    greedy = tiny_engine.generate(SNIPPETS[4], max_tokens=16).token_ids
    for seed in range(4):
        got = tiny_engine.generate(SNIPPETS[4], max_tokens=16, temperature=temperature, seed=seed)
        assert got.token_ids == greedy


def test_near_greedy_stays_near_greedy(tiny_engine: StarCoderEngine) -> None:
    """Just above the greedy cut (1e-6) sampling is still effectively greedy."""
    greedy = tiny_engine.generate(SNIPPETS[4], max_tokens=16).token_ids
    for seed in range(4):
        got = tiny_engine.generate(SNIPPETS[4], max_tokens=16, temperature=2e-6, seed=seed)
        assert got.token_ids == greedy


@pytest.mark.parametrize(
    "settings, words",
    [
        ({"seed": 2**64}, "seed"),
        ({"seed": -1}, "seed"),
        ({"top_k": 1024}, "top_k.*vocabulary"),
        ({"top_k": 10**9}, "top_k.*vocabulary"),
        ({"stop": b"\n"}, "stop must be a string"),
        ({"stop": [b"\n"]}, "stop strings"),
        ({"stop_token_ids": None}, "stop_token_ids"),
        ({"stop_token_ids": [10**7]}, "stop_token_ids"),
        ({"max_tokens": 2048}, "max_tokens=2048 leaves no room"),
        ({"parse_special_tokens": "no"}, "parse_special_tokens"),
    ],
)
def test_nonsense_settings_are_clear_errors(tiny_engine: StarCoderEngine, settings: dict, words: str) -> None:
    for call in (
        lambda: tiny_engine.generate("def f():", **settings),
        lambda: tiny_engine.infill("def f():\n    ", "\n", **settings),
    ):
        with pytest.raises(InvalidParameterError, match=words):
            call()
    assert tiny_engine.generate("def f():", max_tokens=2).completion_tokens == 2


@pytest.mark.parametrize(
    "options, words",
    [
        ({"max_prompt_caches": "4"}, "max_prompt_caches"),
        ({"max_prompt_caches": 2.5}, "max_prompt_caches"),
        ({"max_prompt_cache_bytes": "1GB"}, "max_prompt_cache_bytes"),
        ({"prefill_step_size": 0}, "prefill_step_size"),
    ],
)
def test_nonsense_load_options_fail_at_load(tiny_path: Path, options: dict, words: str) -> None:
    with pytest.raises(InvalidParameterError, match=words):
        StarCoderEngine.load(tiny_path, **options)


def test_infill_that_cannot_fit_says_so_in_the_callers_terms(tiny_engine: StarCoderEngine) -> None:
    prefix, suffix = "def total(xs):\n    " * 3, "\n    return t\n"
    window = tiny_engine.context_window
    with pytest.raises(ContextLengthError) as info:
        tiny_engine.infill(prefix, suffix, max_tokens=window - 3, repo_name="r" * 40)
    message = str(info.value)
    assert f"max_tokens={window - 3}" in message and "max_prompt_tokens" not in message
    # Not even the end of the prefix fits: an error, never a middle for a prompt without its prefix.
    with pytest.raises(ContextLengthError, match=f"max_tokens={window - 3} .*prefix"):
        tiny_engine.infill(prefix, suffix, max_tokens=window - 3)
    assert tiny_engine.infill(prefix, suffix, max_tokens=4).completion_tokens <= 4


# --- a quantized KV cache reused across requests is exact ---------------------------------------------


@pytest.mark.parametrize("kv_bits", [4, 8])
def test_kv_bits_reuse_does_not_depend_on_history(small_path: Path, kv_bits: int) -> None:
    prompts = [SNIPPETS[0] * 6, SNIPPETS[0] * 6 + SNIPPETS[5] * 3, SNIPPETS[1] * 5]
    fresh = StarCoderEngine.load(small_path, kv_bits=kv_bits, max_prompt_caches=0)
    shared = StarCoderEngine.load(small_path, kv_bits=kv_bits)
    try:
        alone = [fresh.generate(p, max_tokens=24).token_ids for p in prompts]
        after = [shared.generate(p, max_tokens=24) for p in prompts]  # the second reuses the first's cache
        assert after[1].cached_tokens > 0
        assert [c.token_ids for c in after] == alone
        again = shared.generate(prompts[1], max_tokens=24)  # now from its own cache
        assert again.cached_tokens > 0 and again.token_ids == alone[1]
    finally:
        fresh.close()
        shared.close()


# --- the event loop is never blocked by work that grows with the input --------------------------------

BIG = "def f(x):\n    return x + 1  # <file_sep>\n" * 16000  # 650 kB: about a second to tokenize here


async def _max_stall(call: object) -> float:
    """The longest the event loop went without running a 1 ms ticker while ``call()`` ran."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.005)  # ticking before the call starts: a stall at its very start counts too
    try:
        await call()  # type: ignore[operator]
    except (ContextLengthError, InvalidParameterError):
        pass  # a prompt this long does not fit: the point is what happened before the error
    finally:
        done.set()
        await ticker
    return max(gaps)


async def _drain(stream: object) -> None:
    async for _ in stream:  # type: ignore[attr-defined]
        pass


@pytest.mark.timeout(600)
async def test_no_async_entry_point_blocks_the_loop(tiny_engine: StarCoderEngine, chat_path: Path) -> None:
    from langchain_core.messages import HumanMessage
    from llama_index.core.llms import ChatMessage

    from langchain_starcoder import (
        ChatStarCoder,
        FIMPromptTemplate,
        StarCoderLLM,
        StarCoderPromptTemplate,
    )
    from langchain_starcoder.llama_index import StarCoder

    start = time.perf_counter()
    tiny_engine.encode(BIG)
    blocking = time.perf_counter() - start  # what tokenizing on the loop would stall it for
    e = tiny_engine
    llm = StarCoderLLM(engine=e, max_tokens=2)
    chat = ChatStarCoder(model=chat_path, max_tokens=2)
    index = StarCoder(engine=e, max_tokens=2)
    index_chat = StarCoder(model=chat_path, max_tokens=2)
    await chat._aengine_for(None)  # loaded once, in a thread, before the clock matters
    fim = {"prefix": BIG, "suffix": BIG}
    template = StarCoderPromptTemplate.from_template("<file_sep>a.py\n{code}")
    entries = {
        "engine.agenerate": lambda: e.agenerate(BIG),
        "engine.astream": lambda: _drain(e.astream(BIG)),
        "engine.agenerate_batch": lambda: e.agenerate_batch([BIG, BIG]),
        "engine.ainfill": lambda: e.ainfill(BIG, BIG, max_tokens=2),
        "engine.astream_infill": lambda: _drain(e.astream_infill(BIG, BIG, max_tokens=2)),
        "llm.ainvoke": lambda: llm.ainvoke(BIG),
        "llm.astream": lambda: _drain(llm.astream(BIG)),
        "llm.abatch": lambda: llm.abatch([BIG, BIG]),
        "fim | llm .astream": lambda: _drain((FIMPromptTemplate() | llm).astream(fim)),
        "fim | llm .abatch": lambda: (FIMPromptTemplate() | llm).abatch([fim, fim]),
        "llm.ainfill": lambda: llm.ainfill(BIG, BIG),
        "template | llm .ainvoke": lambda: (template | llm).ainvoke({"code": BIG}),
        "template | llm .astream": lambda: _drain((template | llm).astream({"code": BIG})),
        "chat.ainvoke": lambda: chat.ainvoke([HumanMessage(BIG)]),
        "chat.astream": lambda: _drain(chat.astream([HumanMessage(BIG)])),
        "chat.abatch": lambda: chat.abatch([[HumanMessage(BIG)], [HumanMessage(BIG)]]),
        "index.acomplete": lambda: index.acomplete(BIG),
        "index.astream_complete": lambda: index.astream_complete(BIG),
        "index.ainfill": lambda: index.ainfill(BIG, BIG),
        "index.achat": lambda: index_chat.achat([ChatMessage(role="user", content=BIG)]),
        "index.astream_chat": lambda: index_chat.astream_chat([ChatMessage(role="user", content=BIG)]),
    }
    stalls = {name: await _max_stall(call) for name, call in entries.items()}
    assert blocking > 0.2, "the input is too small to show a stall here"
    # Tokenizing on the loop would stall it for ``blocking`` or more; what is left is bookkeeping.
    assert {name: s for name, s in stalls.items() if s > blocking / 2} == {}


# The command line, reporting on stderr each forward pass of more than one token (a prefill step).
CLI_REPORTING_PREFILL_STEPS = """
import runpy, sys
from langchain_starcoder.models import starcoder2

forward = starcoder2.Model.__call__

def reporting(self, inputs, *args, **kwargs):
    if inputs.shape[-1] > 1:
        print(f"prefill step of {inputs.shape[-1]} tokens", file=sys.stderr, flush=True)
    return forward(self, inputs, *args, **kwargs)

starcoder2.Model.__call__ = reporting
runpy.run_module("langchain_starcoder", run_name="__main__", alter_sys=True)
"""


@pytest.mark.timeout(300)
def test_ctrl_c_during_a_long_prefill_exits_promptly(tmp_path: Path) -> None:
    """SIGINT while the CLI prefills a long prompt: exit 130 after the prefill step under way (and
    at most one it began as the signal came), not after the whole prompt. Told by the steps the
    child reports, not by the clock, which a busy machine slows."""
    import os
    import signal
    import subprocess
    import sys

    from children import start_interruptible

    from langchain_starcoder.testing import build_starcoder2

    path = build_starcoder2(tmp_path / "deep", preset="small", num_layers=24)
    engine = StarCoderEngine.load(path)
    try:
        prompt = engine.decode((engine.encode(SNIPPETS[0] * 400) * 4)[:1900])
        steps = -(-(len(engine.encode(prompt)) - 1) // engine.backend._prefill_chunk)
    finally:
        engine.close()
    assert steps >= 8  # many steps: stopping after one or two is far from the end
    (tmp_path / "prompt.txt").write_text(prompt)
    child = start_interruptible(
        [
            sys.executable,
            "-c",
            CLI_REPORTING_PREFILL_STEPS,
            "generate",
            "--model",
            str(path),
            "--file",
            str(tmp_path / "prompt.txt"),
            "--max-tokens",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    # Interrupted once the second step has begun: during the first, MLX compiles its CPU kernels with
    # system(), which ignores SIGINT while the compiler runs (a Ctrl-C then is lost).
    seen, begun = [], 0
    for line in child.stderr:
        seen.append(line)
        begun += line.count("prefill step of")  # (after a progress bar's text, if one is drawn)
        if begun == 2:
            child.send_signal(signal.SIGINT)
            break
    _, err = child.communicate(timeout=120)
    assert child.returncode == 130, "".join(seen) + err
    assert err.strip().splitlines()[-1].endswith("interrupted.")
    begun_after = err.count("prefill step of")
    assert begun_after <= 1, f"{begun_after} more of {steps} prefill steps ran after Ctrl-C"


def test_closing_a_stream_or_the_engine_from_elsewhere_never_leaves_a_reader_waiting(tiny_path: Path) -> None:
    from langchain_starcoder import EngineClosedError

    engine = StarCoderEngine.load(tiny_path, prefill_step_size=4)
    long = [100 + i % 500 for i in range(1500)]
    outcomes: list[object] = []

    def read(stream: object) -> None:
        try:
            outcomes.append(len(list(stream)))  # type: ignore[call-overload]
        except Exception as e:
            outcomes.append(e)

    try:
        for close in ("stream", "engine"):
            stream = engine.stream(long, max_tokens=4)
            reader = threading.Thread(target=read, args=(stream,))
            reader.start()
            time.sleep(0.05)  # the reader waits while the prompt is prefilled
            (stream.close if close == "stream" else engine.close)()
            reader.join(timeout=30)
            assert not reader.is_alive(), f"closing the {close} left the reader waiting"
    finally:
        engine.close()
    assert outcomes[0] == 0  # closed stream: it simply ends
    assert isinstance(outcomes[1], EngineClosedError)  # closed engine: the caller is told


async def test_aclose_from_another_task_ends_the_reader(tiny_engine: StarCoderEngine) -> None:
    stream = tiny_engine.astream([100 + i % 500 for i in range(1900)], max_tokens=100)

    async def read() -> int:
        return len([c async for c in stream])

    reader = asyncio.ensure_future(read())
    await asyncio.sleep(0.05)
    await stream.aclose()
    assert await asyncio.wait_for(reader, timeout=30) <= 1
