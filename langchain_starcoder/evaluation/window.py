"""The hole's own file, cut to the tokens repository context leaves it.

The prompt builder gives the hole's file the budget first and context files what is left: a file longer
than the window would leave ``+repo`` nothing, and ``psm`` and ``psm+repo`` would send the same prompt.
So, as CrossCodeEval does, every configuration gets the same window of the hole's file (whole lines, the
prefix's end and the suffix's start), sized to leave room for the largest context budget compared (at
most half the prompt's budget: a context budget larger than that shares it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .configs import Config

#: Tokens kept for the control tokens and the file's path around the hole's text.
LAYOUT_TOKENS = 32


def in_file_room(
    target: Any, configs: Sequence[Config], max_tokens: int, max_prompt_tokens: int | None
) -> int | None:
    """The tokens the hole's file may take; None (no cut) where no configuration adds context or the
    prompt's budget is unknown (a server that does not say its window, and no ``max_prompt_tokens``)."""
    reserve = max((c.repo_tokens or 0 for c in configs), default=0)
    if not reserve:
        return None
    window = getattr(target, "context_window", None)
    budget = max_prompt_tokens or (window - max_tokens if isinstance(window, int) else None)
    if budget is None:
        return None
    return max(budget - reserve - LAYOUT_TOKENS, budget // 2)  # a budget past the window: half each


def cut_to(prefix: str, suffix: str, room: int, count: Callable[[str], int]) -> tuple[str, str]:
    """``prefix`` and ``suffix`` within ``room`` tokens: the suffix's first lines in at most a quarter of
    it, the prefix's last lines in the rest (the cursor's own line always kept)."""
    if count(prefix) + count(suffix) <= room:
        return prefix, suffix
    suffix_lines = suffix.splitlines(keepends=True)
    kept_suffix = "".join(
        suffix_lines[: _most(len(suffix_lines), lambda n: count("".join(suffix_lines[:n])) <= room // 4)]
    )
    left = room - count(kept_suffix)
    prefix_lines = prefix.splitlines(keepends=True)
    tail = _most(
        len(prefix_lines) - 1, lambda n: count("".join(prefix_lines[len(prefix_lines) - 1 - n :])) <= left
    )
    return "".join(prefix_lines[len(prefix_lines) - 1 - tail :]), kept_suffix


def _most(n: int, fits: Callable[[int], bool]) -> int:
    """The largest k in 0..n with ``fits(k)`` (``fits`` true up to some k, then false)."""
    low, high = 0, n
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low
