"""KV caches of recent requests, reused by the longest common token prefix."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mlx.utils import tree_map
from mlx_lm.models.cache import KVCache, QuantizedKVCache
from mlx_lm.utils import common_prefix_len

from ...types import CachePartition

_COPYABLE = (KVCache, QuantizedKVCache)


def prefix_copy(cache: Any, n: int) -> Any:
    """A new layer cache holding the first ``n`` positions of ``cache``, which stays as it is.

    Slicing makes new array objects: the caches' in-place updates then never reach each other.
    """
    copy = type(cache).__new__(type(cache))
    copy.__dict__.update(cache.__dict__)
    copy.keys, copy.values = tree_map(lambda a: a[..., :n, :], (cache.keys, cache.values))
    copy.offset = n
    return copy


@dataclass
class _Entry:
    tokens: list[int]
    cache: list[Any]
    partition: CachePartition

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.cache)


class PromptCacheStore:
    """A bounded LRU of per-layer KV caches, each with the token ids it holds.

    ``take`` hands out the cache sharing the longest prefix with a prompt; ``put`` stores a request's
    cache with the tokens it now holds. A cache the prompt extends is handed over whole; of one that
    runs past the shared prefix, a copy of the prefix is handed out and the original stays, so a
    short unrelated request never destroys a long repository context.
    The caches keep every position, also past the sliding window, so what they hold is always exact.
    Each entry belongs to the partition of the request that filled it (:class:`CachePartition`): a
    request is handed, and counted, only its own partition's entries; the bounds are shared (one LRU).
    Only the backend's worker thread calls these methods.
    """

    def __init__(self, max_entries: int, max_bytes: int | None):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: list[_Entry] = []  # least recently used first

    def longest(self, tokens: Sequence[int], partition: CachePartition) -> int:
        """How many leading tokens of ``tokens`` :meth:`take` would hand out already computed."""
        lengths = [common_prefix_len(e.tokens, tokens) for e in self._entries if e.partition == partition]
        return min(max(lengths, default=0), len(tokens) - 1)

    def take(
        self, tokens: Sequence[int], partition: CachePartition, new_cache: Callable[[], list[Any]]
    ) -> tuple[list[Any], int]:
        """A cache of ``partition`` for ``tokens`` and how many of its leading tokens it already holds
        (``new_cache()`` when none shares a prefix).

        At least one token is always left to process, since the model must see the prompt's last
        token to predict the next.
        """
        best, best_len = None, 0
        for entry in self._entries:
            if entry.partition != partition:
                continue  # another partition's KV is never handed out, nor counted
            n = common_prefix_len(entry.tokens, tokens)
            if n > best_len:
                best, best_len = entry, n
        reuse = min(best_len, len(tokens) - 1)
        if best is None or reuse <= 0 or not all(isinstance(c, _COPYABLE) for c in best.cache):
            return new_cache(), 0
        self._entries.remove(best)
        if reuse == len(best.tokens):
            return best.cache, reuse
        self._entries.append(best)  # still useful to others: keep it, most recently used
        return [prefix_copy(c, reuse) for c in best.cache], reuse

    def put(self, tokens: Sequence[int], cache: list[Any], partition: CachePartition) -> None:
        """Keep ``cache`` (which holds ``tokens``) for later requests of ``partition``."""
        if self.max_entries <= 0 or not tokens:
            return
        self._entries.append(_Entry(list(tokens), cache, partition))
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
