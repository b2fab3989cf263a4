"""The same adapter on MLX (unfused and fused) and on vLLM (issue 41's fidelity row): the largest
|difference| of log-probabilities, float32, over every position of a few prompts and every token, and
whether greedy decoding gives the same tokens.

- The model: the "small" preset (random weights, float32; head size 64, which vLLM's CPU attention
  takes), built once in the work folder; a LoRA adapter of rank 4 with random weights on every linear
  layer (``testing.adapters.build_adapter``), written in PEFT's layout (``export-adapter --peft``) and
  fused (``export-adapter --fused``).
- vLLM: its CPU build (``.venv-vllm``) serving the base and, with ``--enable-lora --lora-modules``, the
  adapter over it; log-probs from ``prompt_logprobs`` and ``logprobs`` (all 1,024 tokens).

Run: ``python -m benchmarks.adapter_fidelity_vllm [--workdir DIR]``; it prints one line per pair.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

PROMPTS = ([5, 17, 300, 42, 901, 7], list(range(100, 160)), [3, 3, 3, 800, 801])
VOCAB = 1024
NAME = "ad"


def _mlx(model: Path, adapter: Path | None = None) -> Any:
    from langchain_starcoder.loading import load_model
    from langchain_starcoder.loading.adapter import apply_adapter, read_adapter

    loaded = load_model(model, quantize=None, group_size=64, dtype="float32")
    if adapter is not None:
        apply_adapter(loaded.model, loaded.args, read_adapter(adapter), str(model))
    return loaded.model


def _mlx_logprobs(model: Any, ids: list[int]) -> np.ndarray:
    import mlx.core as mx

    logits = np.array(model(mx.array([ids]))[0], dtype=np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def _vllm_logprobs(url: str, model: str, ids: list[int]) -> np.ndarray:
    import httpx

    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": VOCAB,
        "prompt_logprobs": VOCAB,
        "return_tokens_as_token_ids": True,
    }
    choice = httpx.post(f"{url}/v1/completions", json=body, timeout=300).json()["choices"][0]
    out = np.full((len(ids), VOCAB), np.nan)
    for row, position in zip(out[:-1], choice["prompt_logprobs"][1:], strict=True):
        for token, entry in position.items():
            row[int(token)] = entry["logprob"]
    for token, logprob in choice["logprobs"]["top_logprobs"][0].items():
        out[-1, int(token.removeprefix("token_id:"))] = logprob
    return out


def _vllm_greedy(url: str, model: str, ids: list[int], n: int) -> list[int]:
    import httpx

    body = {"model": model, "prompt": ids, "max_tokens": n, "temperature": 0, "return_token_ids": True}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=300).json()["choices"][0]["token_ids"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.adapter_fidelity_vllm", description=__doc__)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/adapter-fidelity-vllm"))
    args = p.parse_args(argv)

    from langchain_starcoder.finetune.export import fuse_adapter, to_peft
    from langchain_starcoder.testing import build_starcoder2
    from langchain_starcoder.testing.adapters import build_adapter
    from langchain_starcoder.testing.vllm_server import VLLMServer

    from .harness import REPO

    work = args.workdir
    base = work / "small"
    if not base.exists():
        build_starcoder2(base, preset="small")
    adapter = build_adapter(base, work / "adapter", rank=4, scale=2.0, strength=0.05)
    peft = to_peft(adapter, work / "peft", model_dir=base)
    fused = fuse_adapter(base, adapter, work / "fused")
    models = {"unfused": _mlx(base, adapter), "fused": _mlx(fused), "base": _mlx(base)}
    server = VLLMServer(base, venv=REPO / ".venv-vllm", log=work / "vllm.log")
    server.args += ["--enable-lora", "--lora-modules", f"{NAME}={peft}", "--max-lora-rank", "8"]
    server.args += ["--max-logprobs", str(VOCAB)]
    worst = dict.fromkeys(("vLLM+LoRA vs MLX unfused", "vLLM+LoRA vs MLX fused", "MLX unfused vs fused"), 0.0)
    worst |= {"vLLM base vs MLX base": 0.0, "the adapter's own effect (vLLM)": 0.0}
    greedy_equal = True
    with server:
        for ids in PROMPTS:
            got, plain = _vllm_logprobs(server.url, NAME, ids), _vllm_logprobs(server.url, "tiny", ids)
            mlx = {name: _mlx_logprobs(model, ids) for name, model in models.items()}
            for key, (a, b) in {
                "vLLM+LoRA vs MLX unfused": (got, mlx["unfused"]),
                "vLLM+LoRA vs MLX fused": (got, mlx["fused"]),
                "MLX unfused vs fused": (mlx["unfused"], mlx["fused"]),
                "vLLM base vs MLX base": (plain, mlx["base"]),
                "the adapter's own effect (vLLM)": (got, plain),
            }.items():
                worst[key] = max(worst[key], float(np.abs(a - b).max()))
            want = list(ids)
            for _ in range(16):
                want.append(int(np.argmax(_mlx_logprobs(models["unfused"], want)[-1])))
            greedy_equal &= _vllm_greedy(server.url, NAME, ids, 16) == want[len(ids) :]
    for key, value in worst.items():
        print(f"{key}: max |diff| {value:.2e}")
    print(f"greedy (16 tokens x {len(PROMPTS)} prompts) vLLM+LoRA equal to MLX unfused: {greedy_equal}")


if __name__ == "__main__":
    main()
