"""The shape of one model's KV cache: what a prompt-cache file's header must describe, checked before
any of its data is read (a crafted header cannot make a reader load gigabytes to find out)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .files import CacheFileError, Header

#: The dtypes a model computes its keys and values in (a quantized cache's scales and biases too).
_KV_DTYPES = ("F32", "F16", "BF16")


@dataclass(frozen=True)
class CacheLayout:
    """The shape of one model's KV cache, to check a file against before using it."""

    layers: int
    kv_heads: int
    head_dim: int
    kv_bits: int | None
    kv_group_size: int
    max_tokens: int  # the model's context window: no cache holds more

    def tensors(self, n: int, dtype: str) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Each state tensor's (dtype, shape) for ``n`` cached tokens, named as mlx-lm names them."""
        expected: dict[str, tuple[str, tuple[int, ...]]] = {}
        head = (1, self.kv_heads, n)
        for i in range(self.layers):
            if self.kv_bits is None:
                expected[f"{i}.0"] = expected[f"{i}.1"] = (dtype, (*head, self.head_dim))
                scalars = 1
            else:
                for part in ("0", "1"):
                    expected[f"{i}.{part}.0"] = ("U32", (*head, self.head_dim * self.kv_bits // 32))
                    expected[f"{i}.{part}.1"] = expected[f"{i}.{part}.2"] = (
                        dtype,
                        (*head, self.head_dim // self.kv_group_size),
                    )
                scalars = 3
            for j in range(scalars):
                expected[f"{i}.{2 + j}"] = ("I32", ())
        return expected

    @property
    def max_header_bytes(self) -> int:
        """The most a header of ours can take: every token id as up to 11 characters of JSON, a few
        hundred bytes for each tensor and metadata entry (ours write far less)."""
        return 12 * self.max_tokens + 1024 * len(self.tensors(1, "F32")) + 65536

    def checked_tokens(self, header: Header) -> list[int]:
        """The token ids a file holds, once its header is seen to describe this model's cache of
        exactly that many tokens (names, dtypes and shapes, and so the data's size); raises
        CacheFileError otherwise. Nothing of the data has been read."""
        try:
            tokens = json.loads(header.metadata["0.tokens"])
        except (KeyError, TypeError, ValueError):
            msg = "it records no token ids"
            raise CacheFileError(msg) from None
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            msg = "its token ids are not a list of integers"
            raise CacheFileError(msg)
        if not 0 < len(tokens) <= self.max_tokens:
            msg = f"it claims {len(tokens)} tokens; this model's context holds {self.max_tokens}"
            raise CacheFileError(msg)
        first = header.entries.get("0.1" if self.kv_bits is None else "0.0.1", {})
        dtype = first.get("dtype") if isinstance(first, dict) else None
        found = {name: (e["dtype"], tuple(e["shape"])) for name, e in header.entries.items()}
        if dtype not in _KV_DTYPES or found != self.tensors(len(tokens), dtype):
            msg = f"its arrays do not have the shapes of this model's cache for {len(tokens)} tokens"
            raise CacheFileError(msg)
        return tokens
