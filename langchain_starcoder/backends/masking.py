"""Constrained decoding in the MLX loops: a grammar's token mask on the logits, computed while the model runs.

:class:`GrammarMask` is an mlx-lm logits processor, so mlx-lm's ``generate_step`` and ``BatchGenerator``
(each row its own) apply it with sampling, repetition penalties and the prompt cache unchanged.
:class:`DraftGuide` does the same for speculative decoding (:func:`.speculative.decode`): drafts are cut
at their first token the grammar rejects, and a pass verifying a draft gets one mask per position.

A mask needs the token before it, so each step waits for that token (mlx-lm's pipeline would otherwise
run a step ahead). The mask is then computed on a helper thread (llguidance drops the GIL) while the
worker runs the model (on the CPU ``mx.async_eval`` computes in the calling thread), so a step costs the
longer of the two, not their sum. The helper only fills numpy arrays; MLX stays on the worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import mlx.core as mx
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from ..errors import GrammarError
from .grammar import error_text, unpack

# Shared by every backend: a mask takes tens of microseconds, and each worker waits for its own.
_HELPERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="langchain-starcoder-mask")


class GrammarMask:
    """An mlx-lm logits processor: only the tokens the grammar allows next keep their logits.

    Called once per step with the tokens so far; from the second call on, the last of them is the
    token sampled at the step before, which the matcher takes in first.
    """

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int):
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._words = allocate_token_bitmask(1, vocab_size)
        self._started = False

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self._started:
            consume(self._matcher, (tokens[-1].item(),))
        self._started = True
        allowed = _HELPERS.submit(self._allowed)
        mx.async_eval(logits)  # the model runs while the helper computes the mask
        return mx.where(mx.array(allowed.result()), logits, -mx.inf)

    def _allowed(self) -> np.ndarray:
        fill_next_token_bitmask(self._matcher, self._words)
        check(self._matcher)
        return unpack(self._words, self._vocab_size)


class DraftGuide:
    """The grammar's part in speculative decoding: drafts cut where the grammar rejects them, one
    mask per verified position, and the matcher moved on by the tokens kept."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int):
        self._matcher = matcher
        self._vocab_size = vocab_size

    def clip(self, draft: list[int]) -> list[int]:
        """``draft`` up to its first token the grammar does not allow."""
        return draft[: self._matcher.validate_tokens(draft)] if draft else draft

    def masks(self, draft: Sequence[int]) -> Future[np.ndarray]:
        """The allowed tokens ``[len(draft) + 1, vocab]`` after the tokens so far and after each draft
        token (``draft`` is clipped), computed on a helper thread; the matcher is left where it was."""
        return _HELPERS.submit(self._masks, list(draft))

    def _masks(self, draft: list[int]) -> np.ndarray:
        words = allocate_token_bitmask(len(draft) + 1, self._vocab_size)
        for i, token in enumerate([*draft, None]):
            fill_next_token_bitmask(self._matcher, words, i)
            if token is not None:
                consume(self._matcher, [token])
        check(self._matcher)
        if draft:
            self._matcher.rollback(len(draft))
        return unpack(words, self._vocab_size)

    def accept(self, tokens: Sequence[int]) -> None:
        """The decided tokens (each allowed by its mask)."""
        consume(self._matcher, tokens)


def consume(matcher: llguidance.LLMatcher, tokens: Sequence[int]) -> None:
    # One at a time: llguidance 1.9's consume_tokens refuses the end token of a finished match.
    for token in tokens:
        if not matcher.consume_token(token):
            check(matcher)


def check(matcher: llguidance.LLMatcher) -> None:
    """A matcher in an error state (a limit hit while decoding) ends the generation with its reason."""
    if matcher.is_error():
        msg = f"The grammar engine stopped this generation: {error_text(matcher)}"
        raise GrammarError(msg)
