"""The end of a fill-in-the-middle answer: trimming a middle that repeats the start of the suffix."""

from __future__ import annotations

#: An overlap with the suffix this long (not counting whitespace) is trimmed wherever it starts.
MIN_OVERLAP_CHARS = 10


class SuffixOverlap:
    """Trims the end of a middle that repeats the start of the suffix, also while streaming.

    Models often write the middle and then carry on with the code that follows the hole, which is
    already in the suffix. The rule: take the longest end of the middle that equals a start of the
    suffix and holds some non-whitespace, and trim it when it is

    - at least :data:`MIN_OVERLAP_CHARS` characters, not counting whitespace, or
    - whole lines: it starts where a line of the middle starts (or at the middle's start) and ends
      where a line of the suffix ends (or at the suffix's end).

    Otherwise a shorter end that qualifies is tried. So ``")"`` after ``foo(bar()`` stays, while a
    repeated ``return total`` line goes. While streaming, the longest end of the text that is a
    start of the suffix is held back (it might grow into an overlap) and released as soon as the
    next text shows it is not one, or at the end, minus what is trimmed.
    """

    def __init__(self, suffix: str, *, min_chars: int = MIN_OVERLAP_CHARS):
        self.suffix = suffix
        self.min_chars = min_chars
        self._border = _Borders(suffix)  # grows with the middle: a long suffix costs nothing up front
        self._matched = 0  # the longest end of the middle so far that is a start of the suffix
        self._held = ""
        self._last = ""  # the last character already released

    def feed(self, text: str) -> str:
        """Take more middle; return the part that is safe to show."""
        if not self.suffix:
            return text
        for ch in text:  # Knuth-Morris-Pratt over the suffix
            k = self._matched
            if k == len(self.suffix):
                k = self._border[k]
            while k and self.suffix[k] != ch:
                k = self._border[k]
            self._matched = k + 1 if self.suffix[k] == ch else 0
        pending = self._held + text
        cut = len(pending) - self._matched
        out, self._held = pending[:cut], pending[cut:]
        if out:
            self._last = out[-1]
        return out

    def finish(self) -> str:
        """The held-back text, without the overlap (if it qualifies). Call once, at the end."""
        held, self._held = self._held, ""
        k = self._matched
        solid = _solid_counts(self.suffix, k)  # counted once: the candidates can be as many as k
        while k:
            before = held[-k - 1] if k < len(held) else self._last
            if self._qualifies(k, before, solid[k]):
                return held[: len(held) - k]
            k = self._border[k]
        return held

    def _qualifies(self, k: int, before: str, solid: int) -> bool:
        """Whether the suffix's first ``k`` characters (``solid`` of them not whitespace) are trimmed."""
        if solid == 0:
            return False
        if solid >= self.min_chars:
            return True
        whole_lines_end = self.suffix[k - 1] == "\n" or k == len(self.suffix)
        return whole_lines_end and before in ("", "\n")


def _solid_counts(text: str, n: int) -> list[int]:
    """``counts[j]``: the characters of ``text[:j]`` that are not whitespace, for ``j`` up to ``n``."""
    counts = [0]
    for ch in text[:n]:
        counts.append(counts[-1] + (not ch.isspace()))
    return counts


class _Borders:
    """``b[k]``: the length of the longest proper border of ``pattern[:k]`` (KMP failure function),
    computed only as far as it is asked for."""

    def __init__(self, pattern: str):
        self._pattern = pattern
        self._border = [0, 0]
        self._k = 0  # the border of the prefix the next entry extends

    def __getitem__(self, n: int) -> int:
        pattern, border = self._pattern, self._border
        while len(border) <= n:
            i, k = len(border) - 1, self._k
            while k and pattern[i] != pattern[k]:
                k = border[k]
            if pattern[i] == pattern[k]:
                k += 1
            self._k = k
            border.append(k)
        return border[n]


def trim_suffix_overlap(middle: str, suffix: str) -> str:
    """``middle`` without an end that repeats the start of ``suffix`` (see :class:`SuffixOverlap`)."""
    overlap = SuffixOverlap(suffix)
    return overlap.feed(middle) + overlap.finish()
