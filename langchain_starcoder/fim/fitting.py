"""Fitting text into a FIM prompt's token budget: a context file whole or cut after its last line that
fits, the window of a long text worth encoding, and a search for the longest part that fits.

Token counts grow with the text, but not strictly (merges): so the search tries near a guess from the
encoding's offsets and checks every answer by encoding it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from .._tokens import Encoded
from .request import ContextFile


def fit_file(
    encode: Callable[[str], Encoded], file: ContextFile, left: int | None, head: str, overhead: int
) -> tuple[ContextFile, list[int]] | None:
    """The file whole, or cut after its last line that fits in ``left`` tokens (with the
    ``overhead`` tokens of its frame), with its ids; None if not even one line fits."""
    if left is not None and left < overhead:
        return None
    limit = None if left is None else left - overhead  # its frame's tokens
    text, ids, offsets = encode_window(encode, file.text, limit, keep_end=False, pre=head)
    if limit is None or len(ids) <= limit:
        return file, ids
    ends = [i + 1 for i, ch in enumerate(text) if ch == "\n"]  # ends of whole lines
    if not text.endswith("\n"):
        ends.append(len(text))  # the unterminated last line (or the window's end): known not to fit
    if len(ends) < 2:
        return None
    guess = guess_chars(offsets, len(head + text), len(ids), limit) - len(head)
    lines = largest(
        len(ends),
        lambda k: k == 0 or overhead + len(encode(head + text[: ends[k - 1]])[0]) <= left,
        bisect.bisect_right(ends, guess),
    )
    if lines == 0:
        return None
    cut = ContextFile(file.path, text[: ends[lines - 1]])
    return cut, encode(head + cut.text)[0]


#: Code averages 3 to 4 characters a token; a window of this many per token surely holds enough.
WINDOW_CHARS_PER_TOKEN = 16


def encode_window(
    encode: Callable[[str], Encoded], text: str, limit: int | None, *, keep_end: bool, pre: str = ""
) -> tuple[str, list[int], list[tuple[int, int]] | None]:
    """Encode ``pre + text``, or only ``pre`` and the end (``keep_end``) or start of ``text`` when
    that part alone has more than ``limit`` tokens: a long file costs no more than its budget.

    Returns the part of ``text`` encoded, its ids and offsets.
    """
    width = WINDOW_CHARS_PER_TOKEN * ((limit or 0) + 4)
    if limit is not None and len(text) > width:
        part = text[len(text) - width :] if keep_end else text[:width]
        ids, offsets = encode(pre + part)
        if len(ids) > limit:
            return part, ids, offsets
    ids, offsets = encode(pre + text)
    return text, ids, offsets


def guess_chars(
    offsets: list[tuple[int, int]] | None, chars: int, tokens: int, budget: int, *, from_end: bool = False
) -> int:
    """About how many leading (or, ``from_end``, trailing) characters of a text fit ``budget``
    tokens, from its encoding."""
    if budget <= 0 or tokens == 0:
        return 0
    if budget >= tokens:
        return chars
    if not offsets:
        return chars * budget // tokens
    if from_end:
        return chars - offsets[tokens - budget - 1][1]  # after the last token that does not fit
    return offsets[budget][0]  # where the first token that does not fit starts


def largest(n: int, fits: Callable[[int], bool], guess: int) -> int:
    """The largest ``k`` in ``[0, n)`` with ``fits(k)``, given ``fits(0)`` and not ``fits(n)``.

    Token counts grow with the text, but not strictly (merges), so this searches near ``guess``:
    gallop away from it, then bisect. The answer always fits, and ``k + 1`` does not.
    """
    lo, hi = 0, n
    guess = min(max(guess, 0), n - 1)
    if guess > 0:
        if fits(guess):
            lo, step = guess, 1
            while lo + step < hi:
                if not fits(lo + step):
                    hi = lo + step
                    break
                lo, step = lo + step, step * 2
        else:
            hi, step = guess, 1
            while hi - step > lo:
                if fits(hi - step):
                    lo = hi - step
                    break
                hi, step = hi - step, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo
