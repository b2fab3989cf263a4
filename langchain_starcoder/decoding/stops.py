"""Stop strings over streamed text.

mlx-lm stops on token sequences only; a stop *string* can end mid-token or span several tokens, and
a streaming caller must never see any part of it. So the matcher holds back text that could be the
start of a stop string until the next token settles it (the approach of llama-cpp-python).
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Feed text as it is generated; get back the part that is safe to show.

    The generation ends at the first point where any stop string appears in the output, and the
    text is cut where that occurrence starts. Among occurrences completed by the same text, the one
    that ends first wins, then the one that starts first.
    """

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = tuple(dict.fromkeys(stops))
        self._pending = ""
        self._longest = max((len(s) for s in self.stops), default=0)

    def feed(self, text: str) -> tuple[str, str | None]:
        """Return ``(text to emit, stop string found or None)``. After a stop, discard the matcher."""
        pending = self._pending + text
        if not self.stops:
            self._pending = ""
            return pending, None
        best: tuple[tuple[int, int], str] | None = None
        for stop in self.stops:
            start = pending.find(stop)
            if start >= 0 and (best is None or (start + len(stop), start) < best[0]):
                best = ((start + len(stop), start), stop)
        if best is not None:
            self._pending = ""
            return pending[: best[0][1]], best[1]
        held = self._partial_stop_length(pending)
        self._pending = pending[len(pending) - held :]
        return pending[: len(pending) - held], None

    def flush(self) -> str:
        """The held-back text, once the output ended without completing a stop."""
        text, self._pending = self._pending, ""
        return text

    def _partial_stop_length(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        for n in range(min(len(text), self._longest - 1), 0, -1):
            tail = text[-n:]
            if any(stop.startswith(tail) for stop in self.stops):
                return n
        return 0
