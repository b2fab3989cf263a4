"""Fitting text into a FIM prompt's token budget: the hole's prefix and suffix, a context file whole or
cut after its last line that fits, the window of a long text worth encoding, and a search for the
longest part that fits.

Token counts grow with the text, but not strictly (merges): so the search tries near a guess from the
encoding's offsets and checks every answer by encoding it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

from .._tokens import Encoded
from .request import ContextFile

Encode = Callable[[str], Encoded]


@dataclass(frozen=True)
class HoleFit:
    """What of the hole fits: the end of the prefix and the start of the suffix, with their ids."""

    prefix_kept: int
    """How many characters of the prefix, counted from its end."""
    prefix_ids: list[int]
    """The ids of the text before the prefix (``pre``) and the kept prefix, encoded in one piece."""
    suffix_kept: int
    """How many characters of the suffix, counted from its start."""
    suffix_ids: list[int]


def fit_hole(
    encode: Encode, prefix: str, suffix: str, room: int | None, pre: str, pre_tokens: int
) -> HoleFit:
    """The prefix and suffix in ``room`` tokens (None: all of them), ``pre`` (``pre_tokens`` long)
    before the prefix. If both do not fit, the prefix keeps its end (the code nearest the hole) and
    is allowed at least three quarters of what ``pre`` leaves, the suffix keeps its start; both are
    cut between characters, as many as fit."""
    # Only the side of the prefix and suffix nearest the hole is encoded when that alone overflows.
    near_prefix, prefix_ids, prefix_offsets = encode_window(encode, prefix, room, keep_end=True, pre=pre)
    near_suffix, suffix_ids, suffix_offsets = encode_window(encode, suffix, room, keep_end=False)
    whole = HoleFit(len(prefix), prefix_ids, len(suffix), suffix_ids)
    if room is None or len(prefix_ids) + len(suffix_ids) <= room:
        return whole
    hole = room - pre_tokens
    s_limit = max(hole - (len(prefix_ids) - pre_tokens), hole // 4)
    suffix_kept = len(suffix)
    if len(suffix_ids) > s_limit:
        suffix_kept = largest(
            len(near_suffix),
            lambda n: len(encode(near_suffix[:n])[0]) <= s_limit,
            guess_chars(suffix_offsets, len(near_suffix), len(suffix_ids), s_limit),
        )
        suffix_ids = encode(suffix[:suffix_kept])[0]
    p_limit = room - len(suffix_ids)  # what the suffix leaves, ``pre`` included
    if len(prefix_ids) <= p_limit:
        return HoleFit(len(prefix), prefix_ids, suffix_kept, suffix_ids)
    n_near = len(near_prefix)
    prefix_kept = largest(
        n_near,
        lambda n: len(encode(pre + near_prefix[n_near - n :])[0]) <= p_limit,
        guess_chars(prefix_offsets, len(pre) + n_near, len(prefix_ids), p_limit - pre_tokens, from_end=True),
    )
    return HoleFit(prefix_kept, encode(pre + prefix[len(prefix) - prefix_kept :])[0], suffix_kept, suffix_ids)


def fit_file(
    encode: Encode, file: ContextFile, left: int | None, head: str, overhead: int
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
    encode: Encode, text: str, limit: int | None, *, keep_end: bool, pre: str = ""
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
