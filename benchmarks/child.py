"""Measurements that need a fresh process: the BLAS MLX binds to is fixed when MLX is imported.

``python -m benchmarks.child TASK JSON`` prints one JSON line. With ``"blas": "openblas"`` the
optimized OpenBLAS is loaded (by :mod:`langchain_starcoder._blas`, read from its file so that the
package, which imports MLX, is not imported first) before anything imports MLX.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def load_blas(variant: str) -> dict[str, Any] | None:
    if variant == "reference":
        return None
    spec = importlib.util.spec_from_file_location(
        "langchain_starcoder._blas", REPO / "langchain_starcoder" / "_blas.py"
    )
    assert spec is not None and spec.loader is not None
    blas = importlib.util.module_from_spec(spec)
    # Registered under its real name, so the package's own import of it finds this one.
    sys.modules["langchain_starcoder._blas"] = blas
    spec.loader.exec_module(blas)
    if not blas.use_optimized_blas():
        msg = "the optimized BLAS could not be loaded"
        raise RuntimeError(msg)
    return blas.active_blas()


def gemm_gflops(m: int = 64, k: int = 3072, n: int = 12288) -> float:
    """float32 matmul speed of the BLAS MLX is bound to (a 3b MLP matrix, a 64-token prefill)."""
    import mlx.core as mx

    a, b = mx.random.normal((m, k)), mx.random.normal((k, n))
    mx.eval(a, b, a[:8] @ b[:, :8])
    start = time.perf_counter()
    mx.eval(a @ b)
    return 2 * m * k * n / (time.perf_counter() - start) / 1e9


def task_blas(args: dict[str, Any], info: dict[str, Any] | None) -> dict[str, Any]:
    """Prefill and decode rates of a float32 checkpoint, and its logits for a parity check."""
    import numpy as np

    from benchmarks.harness import Clock
    from langchain_starcoder import StarCoderEngine

    engine = StarCoderEngine.load(args["checkpoint"], dtype="float32")
    vocab = engine.backend.config.vocab_size
    prompt = [(17 * i + 100) % (vocab - 100) + 50 for i in range(args["prompt_tokens"])]
    engine.generate(prompt[:8], max_tokens=2)  # warm up: allocations, first-call costs
    engine.clear_cache()

    def prefill() -> float:
        import mlx.core as mx

        from benchmarks.cases import prefill_rate

        return prefill_rate(engine.backend.model, mx.array(prompt))

    prefill_tps = engine.backend.call(prefill)

    clock = Clock()
    for chunk in engine.stream(prompt[: args["decode_prompt_tokens"]], max_tokens=args["decode_tokens"]):
        clock.mark(len(chunk.token_ids))
    logits = engine.logits(prompt[: args["logits_tokens"]])
    np.save(args["logits_out"], logits)
    engine.close()
    return {
        "prefill_tps": prefill_tps,
        "decode_tps": clock.decode_rate,
        "gemm_gflops": gemm_gflops() if args.get("gemm") else None,
        "blas": info,
    }


def task_batch(args: dict[str, Any], info: dict[str, Any] | None) -> dict[str, Any]:
    """generate_batch against sequential generate calls, interleaved, in this process's BLAS."""
    from benchmarks.cases import batch_variants
    from benchmarks.harness import interleave
    from langchain_starcoder import StarCoderEngine

    engine = StarCoderEngine.load(args["checkpoint"], dtype="float32")
    variants = batch_variants(engine, args["prompts"], args["max_tokens"])
    samples = interleave(variants, reps=args["reps"], warmup=args["warmup"])
    engine.close()
    return {"samples": samples, "blas": info}


TASKS = {"blas": task_blas, "batch": task_batch}


def main() -> None:
    task, args = sys.argv[1], json.loads(sys.argv[2])
    info = load_blas(args.get("blas", "reference"))
    result = TASKS[task](args, info)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
