"""Decode speed with an unfused adapter against the base (issue 41: goal >= 0.85x), side by side.

A StarCoder2 of the 3b shape cut to 2 layers (random weights, built once in the work folder), loaded
twice in one process: as it is, and with a rank-8 LoRA adapter on every linear layer of both layers
(``testing.adapters.build_adapter``, mlx-lm's layers, unfused). Greedy decode tokens/s (completion
tokens over generation seconds, prefill excluded; prompt lookup off, so both decode one token a pass),
the two engines interleaved over several rounds, the best round of each kept (the machine is shared).

Run: ``python -m benchmarks.adapter_decode [--workdir DIR] [--rounds N] [--tokens N] [--quantize 4]``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

PROMPT = "def fibonacci(n):\n    "


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "adapter-decode")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--quantize", type=int, choices=(4, 8), help="quantize the base on load (QLoRA)")
    args = parser.parse_args()

    from langchain_starcoder import StarCoderEngine
    from langchain_starcoder.testing import build_starcoder2
    from langchain_starcoder.testing.adapters import build_adapter

    model = args.workdir / "3b-2layers"
    if not (model / "config.json").is_file():
        build_starcoder2(model, preset="3b", num_layers=2, dtype="float16")
    adapter = args.workdir / f"lora-r{args.rank}"
    if not (adapter / "adapters.safetensors").is_file():
        build_adapter(model, adapter, rank=args.rank)
    engines = {
        "base": StarCoderEngine.load(model, quantize=args.quantize),
        "adapter": StarCoderEngine.load(model, quantize=args.quantize, adapter_path=adapter),
    }
    best = dict.fromkeys(engines, 0.0)
    for _ in range(args.rounds):
        for name, engine in engines.items():
            done = engine.generate(
                PROMPT, max_tokens=args.tokens, prompt_lookup_num_tokens=0, cache_salt=name
            )
            best[name] = max(best[name], done.generation_tps)
            engine.clear_cache()
    ratio = best["adapter"] / best["base"]
    quantized = f", {args.quantize}-bit" if args.quantize else ", float32 compute"
    print(f"3b shape, 2 layers{quantized}; LoRA rank {args.rank} on every linear layer, unfused")
    print(f"decode tokens/s (best of {args.rounds}): base {best['base']:.2f}, adapter {best['adapter']:.2f}")
    print(f"adapter / base: {ratio:.3f}x (goal >= 0.85x)")


if __name__ == "__main__":
    main()
