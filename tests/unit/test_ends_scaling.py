"""Where the middle ends is linear in its input (issue 38): for each family of inputs that made it
quadratic (a regular expression tried from every start of a long run, a line read again at every ``/``
or at every piece of a stream, a blank line scanned again from every line start), doubling the input
at most about doubles the time.

The sizes are where the quadratic code took 0.1 to 0.5 s and 3.5 to 5 times as long at twice the size. A
timing is the best of 7 to 15 batches of calls (each about 60 ms long, garbage collection off), taken at n
and 2n alternately: a busy machine slows some batches, not the best one. Linear is 2; the bound is 3.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable

import pytest

from langchain_starcoder.decoding.middle import MiddleGate
from langchain_starcoder.ends import MiddleEnd, middle_end
from langchain_starcoder.fim.overlap import trim_suffix_overlap

Run = Callable[[], object]


def _stream(prefix: str, suffix: str, path: str, pieces: list[str], min_indent: int = 0) -> Run:
    def run() -> None:
        gate = MiddleGate(MiddleEnd(prefix, suffix, path), min_indent)
        for piece in pieces:
            gate.feed(piece)
        gate.finish()

    return run


# name: (n, the family's input of size n as a call)
FAMILIES: dict[str, tuple[int, Callable[[int], Run]]] = {
    # ``[A-Za-z_]\w*$`` searched on the cursor's line: every start of the run read to its end
    "python, a long word before the line's last bracket": (
        4000,
        lambda n: lambda: middle_end("v = f(", "\n", "a" * n + ")\n", file_path="m.py"),
    ),
    # a regular expression literal tried at every ``/``, each read to the line's end (no ``]``)
    "javascript, a line of `(/[`": (2000, lambda n: lambda: MiddleEnd("(/[" * n + "\n", "\n", "m.js")),
    # the word before each ``/`` searched from the line's start
    "javascript, a line of divisions `a/b/`": (
        1500,
        lambda n: lambda: MiddleEnd("x = " + "a/b/" * n + "\n", "\n", "m.js"),
    ),
    # a minified file's one line, both kinds of ``/`` (the prefix of every request for it is read)
    "javascript, a minified line": (
        600,
        lambda n: lambda: MiddleEnd("var a=b/c,d=/[x/]y/g.test(e);" * n + "\n", "\n", "m.js"),
    ),
    # no file name: the language is guessed, ``^\s*`` read on over the blank lines from each line start
    "a prefix of blank lines, the language guessed": (
        1000,
        lambda n: lambda: middle_end("\n" * n, "", "x\n"),
    ),
    # a stream's unfinished line, read again from its start at every piece (the rules and min_indent)
    "a stream, a long blank line a space at a time": (
        1000,
        lambda n: _stream("def f():\n    ", "\n", "m.py", ["y = 1\n"] + [" "] * n, min_indent=4),
    ),
    # the suffix-overlap trim: a blank suffix's every border tried, each counted again from the start
    "the suffix overlap, a suffix of spaces": (
        1000,
        lambda n: lambda: trim_suffix_overlap("x =" + " " * n, " " * n),
    ),
}


def _seconds(run: Run, reps: int) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        run()
    return time.perf_counter() - start


@pytest.mark.parametrize("family", FAMILIES)
def test_doubling_an_adversarial_input_at_most_about_doubles_the_time(family: str) -> None:
    n, make = FAMILIES[family]
    small, large = make(n), make(2 * n)
    once = min(_seconds(small, 1) for _ in range(3))
    reps = max(1, math.ceil(0.06 / max(once, 1e-6)))  # a batch of about 60 ms
    at_n = at_2n = math.inf
    gc.disable()
    try:
        for rounds in range(1, 16):  # alternately: a busy spell slows both; the best of each is kept
            at_n = min(at_n, _seconds(small, reps))
            at_2n = min(at_2n, _seconds(large, reps))
            if rounds >= 7 and at_2n / at_n < 3:
                break  # (on a busy machine, more rounds until a clean batch of each)
    finally:
        gc.enable()
    assert at_2n / at_n < 3, (
        f"{family}: {at_n / reps * 1000:.3f} ms at n={n}, {at_2n / reps * 1000:.3f} ms at 2n"
    )
