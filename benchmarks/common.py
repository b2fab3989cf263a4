"""Shared by the benchmarks: the run's settings, code-like prompts, engines and rates."""

from __future__ import annotations

import importlib.util
import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .harness import (
    Checkpoints,
    Clock,
)

WORDS = ("items", "cache", "token", "value", "limit", "index", "parser", "window", "config", "queue")


@dataclass
class Context:
    """Settings of one run, shared by every benchmark."""

    checkpoints: Checkpoints
    quick: bool = False
    reps: int = 3
    warmup: int = 1
    log: Callable[[str], None] = print
    openblas: bool = True
    """False leaves out the OpenBLAS variants (they need a fresh process each, a few seconds)."""
    found: dict[str, Any] = field(default_factory=dict)
    """Figures one benchmark leaves for a later one (the baselines reuse the BLAS numbers)."""
    tokenizer: Path | None = None
    """A tokenizer.json or checkpoint folder for the repository-context token counts (--tokenizer)."""
    typing_repo: Path | None = None
    """A git repository (checkout or bare) whose history the typing benchmark replays (--typing-repo)."""

    @property
    def tiny(self) -> bool:
        return self.checkpoints.tiny

    def size(self, full: int, quick: int, tiny: int) -> int:
        return tiny if self.tiny else quick if self.quick else full


def code_text(seed: int, chars: int) -> str:
    """Python-looking source of about ``chars`` characters (the weights are random; only length matters)."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < chars:
        a, b = rng.choice(WORDS), rng.choice(WORDS)
        part = (
            f"def {a}_{b}_{rng.randint(0, 99)}(items, limit={rng.randint(0, 999)}):\n"
            f"    return [x.{a} for x in items if x.{b} < limit]\n\n"
        )
        parts.append(part)
        size += len(part)
    return "".join(parts)


def code_tokens(engine: Any, tokens: int, seed: int = 0) -> str:
    """Source text that encodes to exactly ``tokens`` tokens (cut at a token boundary)."""
    chars = tokens * 3
    while True:
        text = code_text(seed, chars)
        ids = engine.encode(text, special_tokens=False)
        if len(ids) >= tokens:
            cut = engine.decode(ids[:tokens])
            if len(engine.encode(cut, special_tokens=False)) == tokens:
                return cut
            tokens -= 1  # a cut inside a merge re-encodes differently; one shorter always works here
            continue
        chars *= 2


def code_ids(engine: Any, tokens: int, seed: int = 0) -> list[int]:
    ids: list[int] = []
    chars = tokens * 3
    while len(ids) < tokens:
        ids = engine.encode(code_text(seed, chars), special_tokens=False)
        chars *= 2
    return ids[:tokens]


def prefill_rate(model: Any, prompt: Any) -> float:
    """Prompt tokens/s of a prefill: every layer over the prompt into a fresh KV cache, no output head.

    (The engine's own prefill lets MLX skip the unused part of the last layer; evaluating the hidden
    states too keeps the work equal to other engines'.)
    """
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    start = time.perf_counter()
    hidden = model.model(prompt[None], cache=cache)
    mx.eval(hidden, [c.state for c in cache])
    return prompt.size / (time.perf_counter() - start)


def load_engine(path: Path, **options: Any) -> Any:
    from langchain_starcoder import StarCoderEngine

    return StarCoderEngine.load(path, **options)


def find_llm_class() -> Any:
    try:
        from langchain_starcoder.llms import StarCoderLLM
    except ImportError:
        return None
    return StarCoderLLM


def decode_rate(chunks: Any, count: Callable[[Any], int]) -> float:
    clock = Clock()
    for chunk in chunks:
        clock.mark(count(chunk))
    rate = clock.decode_rate
    return rate if rate == rate else clock.tokens / clock.elapsed  # one chunk only: whole-call rate


def rate_of(run: Callable[[], int]) -> float:
    start = time.perf_counter()
    return run() / (time.perf_counter() - start)


def param_bytes(module: Any) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(module.parameters()))


def total_rate(run: Callable[[list[int]], int], prompts: list[list[int]], together: bool) -> float:
    """Generated tokens/s of ``run`` over ``prompts``: all at once on threads, or one after another."""
    start = time.perf_counter()
    if together:
        with ThreadPoolExecutor(len(prompts)) as pool:
            tokens = sum(pool.map(run, prompts))
    else:
        tokens = sum(map(run, prompts))
    return tokens / (time.perf_counter() - start)


def blas_available(ctx: Context) -> str | None:
    """Why the OpenBLAS comparison cannot run here, or None if it can."""
    if not ctx.openblas:
        return "--no-openblas"
    if not sys.platform.startswith("linux"):
        return "Linux only"
    if importlib.util.find_spec("ngsolve_openblas") is None:
        return "ngsolve-openblas is not installed (pip install ngsolve-openblas)"
    return None
