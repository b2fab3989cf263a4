"""Comparing token sequences in tests."""

from __future__ import annotations

from collections.abc import Sequence


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two prompts share (what a prompt cache holding one can give the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
