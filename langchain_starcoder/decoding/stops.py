"""Stop strings over streamed text: a :class:`~.filter.Filter`.

mlx-lm stops on token sequences only; a stop *string* can end mid-token or span several tokens, and
a streaming caller must never see any part of it. So the filter holds back text that could be the
start of a stop string until the next token settles it (the approach of llama-cpp-python).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class StopStrings:
    """Feed text as it is generated; get back the part that is safe to show.

    The generation ends at the first point where any stop string appears in the output, and the
    text is cut where that occurrence starts (:attr:`ended` names the stop string). Among
    occurrences completed by the same text, the one that ends first wins, then the one that starts
    first.
    """

    __slots__ = ("_longest", "_pending", "ended", "stops")

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = tuple(dict.fromkeys(stops))
        self._pending = ""
        self._longest = max((len(s) for s in self.stops), default=0)
        self.ended: str | None = None

    def feed(self, text: str) -> str:
        """The text to show; after a stop (:attr:`ended` set) nothing more is fed."""
        pending = self._pending + text
        if not self.stops:
            self._pending = ""
            return pending
        best: tuple[tuple[int, int], str] | None = None
        for stop in self.stops:
            start = pending.find(stop)
            if start >= 0 and (best is None or (start + len(stop), start) < best[0]):
                best = ((start + len(stop), start), stop)
        if best is not None:
            self._pending = ""
            self.ended = best[1]
            return pending[: best[0][1]]
        held = self._partial_stop_length(pending)
        self._pending = pending[len(pending) - held :]
        return pending[: len(pending) - held]

    def finish(self, *, cut: bool) -> str:
        """The held-back text, once the output ended without completing a stop."""
        text, self._pending = self._pending, ""
        return "" if self.ended is not None else text

    def settle(self, reason: str, last: dict[str, Any]) -> str:
        last["stop_sequence"] = self.ended
        return reason

    def _partial_stop_length(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        for n in range(min(len(text), self._longest - 1), 0, -1):
            tail = text[-n:]
            if any(stop.startswith(tail) for stop in self.stops):
                return n
        return 0
