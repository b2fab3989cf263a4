"""What an MLX backend's settings become: mlx-lm samplers and logits processors (a grammar's mask among
them), prefill steps, KV-cache groups, and the checks of its cache bounds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from ..errors import InvalidParameterError
from ..types import PENALTY_CONTEXT, GenerationParams, is_int
from .grammar import Grammar
from .masking import GrammarMask


def sampler_for(params: GenerationParams) -> Any:
    return make_sampler(
        params.temperature,
        top_p=params.top_p if params.top_p < 1.0 else 0.0,
        min_p=params.min_p,
        top_k=params.top_k,
    )


def logits_processors_for(
    params: GenerationParams, cached: Sequence[int], grammar: Grammar | None = None
) -> list[Any] | None:
    """mlx-lm's processors (with a reused cache they also see the cached tail of the prompt), then the
    mask of a fresh matcher of ``grammar`` (last: the penalties see the model's own logits)."""
    mask = [] if grammar is None else [GrammarMask(grammar.matcher(), grammar.vocab_size)]
    if params.repetition_penalty is None:
        return mask or None
    processors = make_logits_processors(
        repetition_penalty=params.repetition_penalty, repetition_context_size=PENALTY_CONTEXT
    )
    if not cached:
        return processors + mask
    head = mx.array(list(cached[-PENALTY_CONTEXT:]))
    return [lambda tokens, logits, p=p: p(mx.concatenate([head, tokens]), logits) for p in processors] + mask


def prefill_chunk(model: Any) -> int:
    """Prompt tokens per prefill step: a cancel takes effect between steps.

    On a GPU mlx-lm's 2048. On the CPU about 4 GFLOP a step (seconds with the bundled BLAS), so a
    cancelled long prompt on a 3b model stops within a step instead of after the whole prompt.
    """
    if mx.default_device() != mx.cpu:
        return 2048
    params = sum(a.size for _, a in tree_flatten(model.parameters()))
    return int(min(2048, max(16, 2e9 // max(params, 1))))


def kv_group_size(config: Any, kv_bits: int | None) -> int:
    """MLX quantizes in groups of 32, 64 or 128 along the head dimension."""
    group = next((g for g in (64, 32) if config.head_dim % g == 0), None)
    if kv_bits is not None and group is None:
        msg = f"kv_bits needs a head dimension divisible by 32; this model's is {config.head_dim}."
        raise InvalidParameterError(msg)
    return group or 64


def check_cache_bounds(entries: Any, nbytes: Any) -> None:
    if not is_int(entries) or entries < 0:
        msg = f"max_prompt_caches must be an integer >= 0 (0 keeps none), not {entries!r}."
        raise InvalidParameterError(msg)
    if nbytes is not None and (not is_int(nbytes) or nbytes < 0):
        msg = f"max_prompt_cache_bytes must be an integer >= 0 or None (no bound), not {nbytes!r}."
        raise InvalidParameterError(msg)
