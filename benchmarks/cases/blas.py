"""float32 with MLX's bundled BLAS against OpenBLAS."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from ..common import (
    Context,
    blas_available,
)
from ..harness import (
    WIDE,
    Row,
    Section,
    interleave,
    run_child,
)


def bench_blas(ctx: Context) -> Section:
    """float32 prefill and decode with MLX's bundled reference BLAS and with OpenBLAS (a process each)."""
    import numpy as np

    section = Section("blas", 4, "Optimized BLAS (opt-in)")
    missing = blas_available(ctx)
    if missing:
        section.skipped = missing
        return section
    shape = ctx.checkpoints.shape(WIDE)
    path = ctx.checkpoints.get(WIDE)
    logits_dir = ctx.checkpoints.workdir / "logits"
    logits_dir.mkdir(parents=True, exist_ok=True)
    prompt_tokens = ctx.size(48, 32, 64)
    runs: dict[str, list[dict[str, Any]]] = {"openblas": [], "reference": []}

    def child(variant: str) -> Callable[[], float]:
        def run() -> float:
            out = logits_dir / f"{variant}-{len(runs[variant])}.npy"
            args = {
                "checkpoint": str(path),
                "blas": variant,
                "prompt_tokens": prompt_tokens,
                "decode_prompt_tokens": 16,
                "decode_tokens": ctx.size(5, 4, 6),
                "logits_tokens": 8,
                "logits_out": str(out),
                "gemm": not ctx.tiny,
            }
            result = run_child("blas", args)
            result["logits"] = out
            runs[variant].append(result)
            return result["prefill_tps"]

        return run

    # Each child warms itself up; in-process warm-ups would not carry over to the next process.
    interleave(
        [("openblas", child("openblas")), ("reference", child("reference"))], max(1, min(ctx.reps, 2)), 0
    )
    opt, ref = runs["openblas"], runs["reference"]
    section.rows.append(
        Row(
            4,
            "OpenBLAS",
            "float32 prefill tokens/s",
            "OpenBLAS",
            "reference BLAS",
            [r["prefill_tps"] for r in opt],
            [r["prefill_tps"] for r in ref],
            "tok/s",
            shape.describe(),
            (">=", 20.0),
            note=f"{prompt_tokens}-token prompt",
        )
    )
    section.rows.append(
        Row(
            4,
            "OpenBLAS",
            "float32 decode tokens/s",
            "OpenBLAS",
            "reference BLAS",
            [r["decode_tps"] for r in opt],
            [r["decode_tps"] for r in ref],
            "tok/s",
            shape.describe(),
        )
    )
    reference = np.load(ref[0]["logits"])
    diffs = [float(np.max(np.abs(np.load(o["logits"]) - reference))) for o in opt]
    scale = float(np.max(np.abs(reference)))
    same_argmax = all((np.load(o["logits"]).argmax(-1) == reference.argmax(-1)).all() for o in opt)
    section.data.update(
        logits_max_abs_diff=max(diffs),
        logits_max_abs=scale,
        same_argmax=bool(same_argmax),
        blas=opt[0]["blas"],
        gemm_gflops={k: [r["gemm_gflops"] for r in runs[k]] for k in runs},
        decode_tps={k: [r["decode_tps"] for r in runs[k]] for k in runs},
        prefill_tps={k: [r["prefill_tps"] for r in runs[k]] for k in runs},
    )
    ctx.found["blas"] = section.data
    section.notes.append(
        f"Logits ({reference.shape[0]} tokens x vocab) differ by at most {max(diffs):.2g} "
        f"({'within' if max(diffs) <= 1e-4 else 'outside'} 1e-4; {max(diffs) / scale:.1g} of the largest "
        f"logit, {scale:.3g}); greedy argmax {'identical' if same_argmax else 'DIFFERENT'} at every position."
    )
    if not ctx.tiny:
        gemm = section.data["gemm_gflops"]
        section.notes.append(
            f"64x3072x12288 float32 matmul: {statistics.median(gemm['openblas']):.0f} GFLOP/s with "
            f"OpenBLAS against {statistics.median(gemm['reference']):.1f} GFLOP/s with the bundled BLAS."
        )
    section.notes.append(
        f"OpenBLAS: {opt[0]['blas'].get('config')} ({opt[0]['blas'].get('threads')} threads), "
        "from the ngsolve-openblas wheel, loaded by langchain_starcoder._blas before MLX in a fresh "
        "process per run (A, B, A, B). Prefill: every layer over the prompt into a fresh KV cache; "
        "decode: rate between the first and the last streamed token."
    )
    return section
