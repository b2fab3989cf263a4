"""Memory: weight and KV-cache bytes, and decode far into a long context."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..common import (
    Context,
    param_bytes,
)
from ..harness import (
    WIDE,
    WIDE_LAYERS,
    Clock,
    Row,
    Section,
    interleave,
)


def bench_memory(ctx: Context) -> Section:
    """Resident weight bytes per dtype, and KV-cache bytes per token for kv_bits None / 8 / 4."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from langchain_starcoder.loading import load_model

    section = Section("memory", 6, "Memory")
    shape = ctx.checkpoints.shape(WIDE)
    path = ctx.checkpoints.get(WIDE)
    weight_layers = 30 if not ctx.tiny else 2
    sizes: dict[str, dict[str, int]] = {}
    for label, quantize, dtype in (
        ("float16", None, "float16"),
        ("8-bit, float16 scales", 8, "float16"),
        ("4-bit, float16 scales", 4, "float16"),
        ("8-bit, float32 scales (CPU)", 8, "auto"),
        ("4-bit, float32 scales (CPU)", 4, "auto"),
    ):
        model = load_model(path, quantize=quantize, group_size=64, dtype=dtype).model
        total, layer = param_bytes(model), param_bytes(model.layers[0])
        layers = len(model.layers)
        sizes[label] = {
            "measured": total,
            "per_layer": layer,
            "full": total + (weight_layers - layers) * layer,
        }
        del model
    mx.clear_cache()
    f16 = sizes["float16"]["full"]
    for label in ("4-bit, float16 scales", "8-bit, float16 scales", "4-bit, float32 scales (CPU)"):
        goal = ("<=", 0.30) if label == "4-bit, float16 scales" else None
        section.rows.append(
            Row(
                6,
                "Weight memory",
                f"bytes, {weight_layers}-layer model",
                label,
                "float16",
                [sizes[label]["full"] / 2**20],
                [f16 / 2**20],
                "MiB",
                shape.describe(),
                goal,
            )
        )

    # KV cache: one cache per layer of the real 3b shape (cheap at any size), as the engine makes them.
    cfg = WIDE.config()
    full_layers = 30
    kv, head_dim = cfg["num_key_value_heads"], cfg["hidden_size"] // cfg["num_attention_heads"]
    group = 64 if head_dim % 64 == 0 else 32
    positions = 256
    per_token: dict[str, float] = {}
    for dtype_name in ("float32", "float16"):
        dtype = getattr(mx, dtype_name)
        cache = KVCache()
        k = mx.random.normal((1, kv, positions, head_dim)).astype(dtype)
        cache.update_and_fetch(k, k)
        mx.eval(cache.state)
        per_token[f"None ({dtype_name})"] = cache.nbytes / positions * full_layers
        if dtype_name == "float32":
            for bits in (8, 4):
                q = cache.to_quantized(group_size=group, bits=bits)
                mx.eval(q.state)
                per_token[f"{bits}-bit"] = q.nbytes / positions * full_layers
    for bits in (8, 4):
        section.rows.append(
            Row(
                6,
                "KV cache",
                "bytes per token, 30 layers",
                f"kv_bits={bits}",
                "kv_bits=None (float32)",
                [per_token[f"{bits}-bit"] / 1024],
                [per_token["None (float32)"] / 1024],
                "KiB",
                WIDE.describe().replace("2 layers", "30 layers"),
            )
        )
    section.data.update(weights=sizes, kv_bytes_per_token_30_layers=per_token)
    mib = {k: v["full"] / 2**20 for k, v in sizes.items()}
    section.notes.append(
        f"Weights of the {weight_layers}-layer model (measured on {shape.describe()}, the per-layer bytes "
        "scaled to the full depth): " + ", ".join(f"{k} {v:,.0f} MiB" for k, v in mib.items()) + "."
    )
    section.notes.append(
        "KV cache per token of the 30-layer 3b: "
        + ", ".join(f"kv_bits={k} {v / 1024:.1f} KiB" for k, v in per_token.items())
        + f" (group size {group}). On the CPU activations, and so the cache, are float32."
    )
    return section


def bench_longctx(ctx: Context) -> Section:
    """Decode speed at position ~12,000 against ~1,000, for three KV-cache designs."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    from langchain_starcoder.loading import load_model

    section = Section("longctx", 7, "Long context")
    shape = ctx.checkpoints.shape(WIDE_LAYERS)
    loaded = load_model(ctx.checkpoints.get(WIDE_LAYERS), quantize=None, group_size=64, dtype="auto")
    model, args = loaded.model, loaded.args
    window = args.sliding_window
    near, far = (1000, 12000) if not ctx.tiny else (100, 1500)
    n = ctx.size(6, 4, 4)
    kv, head_dim = args.num_key_value_heads, args.head_dim

    def filled(cache: Any, positions: int) -> Any:
        # Decode cost does not depend on the cached values: fill with random keys instead of a
        # 12k-token prefill, which takes an hour at this width on the reference BLAS.
        for start in range(0, positions, 2048):
            size = min(2048, positions - start)
            k = mx.random.normal((1, kv, size, head_dim)) * 0.1
            cache.update_and_fetch(k, k)
            mx.eval(cache.state)
        return cache

    def attention_window(value: int | None) -> None:
        for layer in model.layers:
            layer.self_attn.window = value

    designs: dict[str, tuple[Callable[[], Any], int | None]] = {
        "full KV cache, keys sliced to the window (ours)": (KVCache, window),
        "full KV cache, no slicing (mlx-lm's starcoder2)": (KVCache, None),
        "rotating cache of the window (mlx-lm RotatingKVCache)": (
            lambda: RotatingKVCache(max_size=window),
            window,
        ),
    }

    def decode(make: Callable[[], Any], slice_to: int | None, positions: int) -> Callable[[], float]:
        def run() -> float:
            cache = [filled(make(), positions) for _ in model.layers]
            attention_window(slice_to)
            try:
                clock = Clock()
                for _ in generate_step(mx.array([42]), model, max_tokens=n, prompt_cache=cache):
                    clock.mark()
                return clock.decode_rate
            finally:
                attention_window(window)

        return run

    variants = []
    for name, (make, slice_to) in designs.items():
        variants += [
            (f"{name}@far", decode(make, slice_to, far)),
            (f"{name}@near", decode(make, slice_to, near)),
        ]
    samples = interleave(variants, ctx.reps, ctx.warmup)
    for i, name in enumerate(designs):
        section.rows.append(
            Row(
                7,
                "Long context",
                f"decode tokens/s at {far:,} vs {near:,}",
                name.split(" (")[0] + f" @{far:,}",
                f"@{near:,}",
                samples[f"{name}@far"],
                samples[f"{name}@near"],
                "tok/s",
                shape.describe(),
                (">=", 0.8) if i == 0 else None,
                note=name,
            )
        )
    kv_bytes = 2 * kv * head_dim * 4 * len(model.layers)
    section.notes += [
        f"Designs (rows in order): {'; '.join(designs)}. Window {window}, {n} decode steps from each "
        "position.",
        "Ours keeps every position (KV memory grows with the context: "
        f"{kv_bytes * far / 2**20:.0f} MiB at {far:,} tokens for these {len(model.layers)} layers, "
        f"{kv_bytes * far * 15 / 2**20:.0f} MiB for 30) but attends only to the last window, so a "
        "step costs what the window costs, and any prefix can be trimmed back and reused by the "
        "prompt cache. A rotating cache bounds memory to the window but cannot be rewound past it: "
        "a request that shares only an older prefix must prefill again. Not slicing is both slower "
        "past the window and wrong for StarCoder2.",
    ]
    mx.clear_cache()
    return section
