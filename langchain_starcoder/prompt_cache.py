"""KV caches of recent requests, reused by the longest common token prefix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.nn as nn
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache
from mlx_lm.utils import common_prefix_len


@dataclass
class _Entry:
    tokens: list[int]
    cache: list[Any]

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.cache)


class PromptCacheStore:
    """A bounded LRU of per-layer KV caches, each with the token ids it holds.

    ``take`` hands out the cache sharing the longest prefix with a prompt, trimmed to that prefix (a
    cache is owned by one request at a time); ``put`` gives it back with the tokens it now holds.
    The caches keep every position, also past the sliding window, so what they hold is always exact.
    Only the engine's worker thread calls these methods.
    """

    def __init__(self, max_entries: int, max_bytes: int | None):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: list[_Entry] = []  # least recently used first

    def take(self, model: nn.Module, tokens: Sequence[int]) -> tuple[list[Any], int]:
        """A cache for ``tokens`` and how many of its leading tokens it already holds.

        At least one token is always left to process, since the model must see the prompt's last
        token to predict the next.
        """
        best, best_len = None, 0
        for entry in self._entries:
            n = common_prefix_len(entry.tokens, tokens)
            if n > best_len:
                best, best_len = entry, n
        reuse = min(best_len, len(tokens) - 1)
        if best is None or reuse <= 0 or not can_trim_prompt_cache(best.cache):
            return make_prompt_cache(model), 0
        self._entries.remove(best)
        trim_prompt_cache(best.cache, len(best.tokens) - reuse)
        return best.cache, reuse

    def put(self, tokens: Sequence[int], cache: list[Any]) -> None:
        if self.max_entries <= 0 or not tokens:
            return
        self._entries.append(_Entry(list(tokens), cache))
        while len(self._entries) > self.max_entries or (
            self.max_bytes is not None and self.nbytes > self.max_bytes and len(self._entries) > 0
        ):
            self._entries.pop(0)

    def clear(self) -> None:
        self._entries.clear()

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries)

    def __len__(self) -> int:
        return len(self._entries)
