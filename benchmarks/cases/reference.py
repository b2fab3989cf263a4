"""Against references: transformers and the memory roofline, and the default model at full depth."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from ..common import (
    Context,
    blas_available,
    code_ids,
    decode_rate,
    load_engine,
    param_bytes,
    prefill_rate,
)
from ..harness import (
    FULL,
    WIDE,
    WIDE_1,
    Row,
    Section,
    interleave,
    run_child,
)


def read_bandwidth() -> float:
    """Memory read bandwidth in bytes/s: the best of sums and a mat-vec over 512 MiB (all cores).

    The mat-vec (torch, every core) is the operation of a decode step, so it is the honest ceiling.
    """
    import numpy as np

    data = np.ones(2**27, dtype=np.float32)
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        data.sum()
        best = max(best, data.nbytes / (time.perf_counter() - start))
    try:
        import torch
    except ImportError:
        return best
    weights, x = torch.ones(8192, 16384), torch.ones(16384)
    for _ in range(3):
        start = time.perf_counter()
        torch.mv(weights, x)
        best = max(best, weights.numel() * 4 / (time.perf_counter() - start))
    return best


def bench_baselines(ctx: Context) -> Section:
    """transformers on torch (CPU) against our engine, and each engine's fraction of the roofline."""
    import mlx.core as mx

    section = Section("baselines", 8, "What users would pick instead")
    try:
        import torch
        from transformers import Starcoder2ForCausalLM
    except ImportError as e:
        section.skipped = f"transformers/torch missing ({e})"
        return section
    shape = ctx.checkpoints.shape(WIDE)
    path = ctx.checkpoints.get(WIDE)
    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    hf = Starcoder2ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine = load_engine(path)
    prompt_tokens, n = ctx.size(48, 32, 32), ctx.size(6, 4, 6)
    prompt = code_ids(engine, prompt_tokens)
    decode: dict[str, list[float]] = {}

    @torch.inference_mode()
    def transformers_run() -> float:
        ids = torch.tensor([prompt])
        start = time.perf_counter()
        hf.model(ids, use_cache=True)  # the same work as prefill_rate: every layer, no output head
        prefill = len(prompt) / (time.perf_counter() - start)
        out = hf(ids[:, :16], use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        start = time.perf_counter()
        for _ in range(n):
            out = hf(token, past_key_values=past, use_cache=True)
            past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        decode.setdefault("transformers", []).append(n / (time.perf_counter() - start))
        return prefill

    def mlx_run() -> float:
        prefill = engine.backend.call(lambda: prefill_rate(engine.backend.model, mx.array(prompt)))
        engine.clear_cache()
        rate = decode_rate(engine.stream(prompt[:16], max_tokens=n), lambda c: len(c.token_ids))
        decode.setdefault("mlx", []).append(rate)
        return prefill

    def openblas_run(name: str, threads: int) -> Callable[[], float]:
        def run() -> float:
            out = ctx.checkpoints.workdir / "logits" / f"baseline-{name}.npy"
            out.parent.mkdir(parents=True, exist_ok=True)
            args = {
                "checkpoint": str(path),
                "blas": "openblas",
                "prompt_tokens": prompt_tokens,
                "decode_prompt_tokens": 16,
                "decode_tokens": n,
                "logits_tokens": 2,
                "logits_out": str(out),
            }
            result = run_child("blas", args, env={"OPENBLAS_NUM_THREADS": str(threads)})
            decode.setdefault(name, []).append(result["decode_tps"])
            return result["prefill_tps"]

        return run

    labels = {"mlx": "MLX, reference BLAS", "transformers": f"transformers (torch, {cores} threads)"}
    variants = [("mlx", mlx_run), ("transformers", transformers_run)]
    if blas_available(ctx) is None:
        labels["openblas-1"] = "MLX + OpenBLAS (1 thread)"
        variants.append(("openblas-1", openblas_run("openblas-1", 1)))
        if cores > 1:
            labels[f"openblas-{cores}"] = f"MLX + OpenBLAS ({cores} threads)"
            variants.append((f"openblas-{cores}", openblas_run(f"openblas-{cores}", cores)))
    prefill = interleave(variants, max(1, min(ctx.reps, 2)), ctx.warmup)
    for key in decode:  # the warm-up's decode rates are not samples
        decode[key] = decode[key][ctx.warmup :]
    for key, label in labels.items():
        if key == "transformers":
            continue
        for metric, samples in (("float32 prefill tokens/s", prefill), ("float32 decode tokens/s", decode)):
            section.rows.append(
                Row(
                    8,
                    "Against transformers",
                    metric,
                    label,
                    labels["transformers"],
                    samples[key],
                    samples["transformers"],
                    "tok/s",
                    shape.describe(),
                )
            )

    weight_bytes = param_bytes(engine.backend.model)
    bandwidth = read_bandwidth()
    roofline = bandwidth / weight_bytes
    fractions = {labels[k]: statistics.median(v) / roofline for k, v in decode.items()}
    section.data.update(
        bandwidth_gbs=bandwidth / 1e9,
        weight_bytes=weight_bytes,
        roofline_tps=roofline,
        roofline_fraction=fractions,
        prefill=prefill,
        decode=decode,
    )
    section.notes += [
        f"Roofline: {weight_bytes / 2**30:.2f} GiB of float32 weights read per decoded token at a measured "
        f"{bandwidth / 1e9:.1f} GB/s read bandwidth = {roofline:.1f} tokens/s at most. Decode rate as a "
        "fraction of it: " + ", ".join(f"{k} {v:.0%}" for k, v in fractions.items()) + ".",
        f"{prompt_tokens}-token prefill (every layer, no output head); {n} decode steps after a 16-token "
        "prompt. All variants interleaved; the OpenBLAS ones in a fresh process each.",
        "llama.cpp is not measured here (llama-cpp-python builds from source for ~10 minutes); earlier "
        "figures on this machine at the 3b shape with 6 layers: 9.3 tok/s decode in F32, 40 in Q4_0, "
        "~110 tok/s prefill.",
    ]
    engine.close()
    mx.clear_cache()
    return section


def bench_fullmodel(ctx: Context) -> Section:
    """Prefill and decode of the default model's shape at full depth (30 layers, 4-bit), and of one layer.

    The other rows use one or two layers of the 3b shape; this one says what the default model
    (mlx-community/starcoder2-3b-4bit: 4-bit, group 64, float16 scales) runs at, through the
    default path (``StarCoderEngine.load(path)``, dtype="auto").
    """
    import mlx.core as mx

    section = Section("fullmodel", 9, "The default model at full depth")
    shape, one = ctx.checkpoints.shape(FULL), ctx.checkpoints.shape(WIDE_1)
    prompt_tokens, n = ctx.size(16, 8, 16), ctx.size(4, 3, 6)
    rates: dict[str, dict[str, list[float]]] = {}
    for label, path in (
        ("30 layers", ctx.checkpoints.get(FULL, quantize=4)),
        ("1 layer", ctx.checkpoints.get(WIDE_1, quantize=4)),
    ):
        engine = load_engine(path)
        prompt = code_ids(engine, prompt_tokens)

        def prefill(engine: Any = engine, prompt: list[int] = prompt) -> float:
            return engine.backend.call(lambda: prefill_rate(engine.backend.model, mx.array(prompt)))

        def decode(engine: Any = engine, prompt: list[int] = prompt) -> float:
            engine.clear_cache()
            return decode_rate(engine.stream(prompt[:8], max_tokens=n), lambda c: len(c.token_ids))

        # One process, one engine at a time (the 30-layer one holds 1.8 GB): not interleaved.
        samples = interleave([("prefill", prefill), ("decode", decode)], max(1, min(ctx.reps, 2)), 0)
        rates[label] = samples
        section.data[label] = {"layers": len(engine.backend.model.layers), **samples}
        engine.close()
        mx.clear_cache()
    for metric in ("decode", "prefill"):
        section.rows.append(
            Row(
                9,
                "Default model, 4-bit",
                f"{metric} tokens/s",
                "30 layers",
                "1 layer",
                rates["30 layers"][metric],
                rates["1 layer"][metric],
                "tok/s",
                shape.describe(),
            )
        )
    section.notes.append(
        f"{shape.describe()} and {one.describe()}, 4-bit group 64 laid out like mlx-community's "
        "(float16 scales, upcast to float32 by dtype='auto'), random weights; the 30-layer checkpoint is "
        f"built one layer at a time. Prefill: {prompt_tokens} tokens through every layer into a fresh KV "
        f"cache (no output head); decode: {n} tokens after an 8-token prompt, rate between the first "
        "and the last. Few tokens on purpose: a 30-layer step takes seconds here."
    )
    return section
