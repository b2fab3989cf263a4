"""A FIM middle without an end that repeats the start of the suffix: a :class:`~.filter.Filter`
over :class:`~langchain_starcoder.fim.overlap.SuffixOverlap` (the rule lives with the FIM layouts)."""

from __future__ import annotations

from typing import Any

from ..fim.overlap import SuffixOverlap


class OverlapTrim(SuffixOverlap):
    """Holds back the end of the middle that may repeat the suffix; trims it at the end if it does.

    A subclass, not a wrapper: its :meth:`feed` is :meth:`SuffixOverlap.feed`, one call per piece."""

    ended: str | None = None  # never ends the text: it only holds back

    def finish(self, *, cut: bool = True) -> str:
        return super().finish()

    def settle(self, reason: str, last: dict[str, Any]) -> str:
        return reason
