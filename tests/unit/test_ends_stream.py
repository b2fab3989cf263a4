"""A middle as it streams (langchain_starcoder.decoding.middle.MiddleGate): on holes cut from code no
one here wrote (the standard library's json and email packages), fed in random pieces, nothing past the
end is ever released, the result equals ``middle_end`` on the whole text, and the gate ends within a
line of the end."""

from __future__ import annotations

import importlib
import json
import random
import sys
from pathlib import Path

import pytest

from benchmarks.ends_measure import make_holes
from langchain_starcoder.decoding.middle import MiddleGate
from langchain_starcoder.ends import MiddleEnd, middle_end


def _stdlib_files() -> list[tuple[str, str]]:
    files = []
    for package in ("json", "email"):
        root = Path(json.__file__).parent.parent / package
        files += [(f"{package}/{p.name}", p.read_text(encoding="utf-8")) for p in sorted(root.glob("*.py"))]
    return files


HOLES = make_holes(_stdlib_files(), "python", seed=3, per_kind=60)
# A brace language too: this package's JupyterLab extension (TypeScript), the only such code always here.
TS_FILES = [
    (p.name, p.read_text()) for p in sorted((Path(__file__).parents[2] / "labextension/src").glob("*.ts"))
]
TS_HOLES = make_holes(TS_FILES, "typescript", seed=3, per_kind=60)


def _expected(prefix: str, suffix: str, text: str, path: str) -> str:
    end = middle_end(prefix, suffix, text + "\n", file_path=path)  # at the end the last line is whole
    return text if end is None else text[: min(end, len(text))]


def _end_of_next_code_line(text: str, at: int) -> int:
    """Where the first non-blank line after ``at``'s line ends (the latest the gate may decide)."""
    start = text.find("\n", at)
    while start >= 0:
        end = text.find("\n", start + 1)
        line = text[start + 1 : len(text) if end < 0 else end]
        if line.strip():
            return len(text) if end < 0 else end
        start = end
    return len(text)


def test_holes_were_cut() -> None:
    assert len(HOLES) == 120 and {h.kind for h in HOLES} == {"block", "line"}
    assert len(TS_HOLES) > 100 and {h.kind for h in TS_HOLES} == {"block", "line"}


@pytest.mark.parametrize(
    ("holes", "seed"), [(HOLES, 0), (HOLES, 1), (HOLES, 2), (TS_HOLES, 0), (TS_HOLES, 1)]
)
def test_a_streamed_middle_never_passes_its_end_and_equals_middle_end(holes: list, seed: int) -> None:
    rng = random.Random(seed)
    ended_early = 0
    for hole in holes:
        for overrun in hole.overruns.values():
            text = hole.middle + overrun
            want = _expected(hole.prefix, hole.suffix, text, hole.path)
            gate = MiddleGate(MiddleEnd(hole.prefix, hole.suffix, hole.path))
            shown, fed = "", 0
            while fed < len(text) and gate.ended is None:
                piece = text[fed : fed + rng.randint(1, 9)]
                fed += len(piece)
                shown += gate.feed(piece)
                assert want.startswith(shown), (hole.path, shown, want)
            shown += gate.finish(cut=False)  # the model ended the middle: its last line is whole
            assert shown == want, (hole.path, text)
            if len(want) < len(text.rstrip()):  # an end inside the text: found while decoding, not after
                assert gate.ended == "syntax"
                assert fed <= _end_of_next_code_line(text, len(want)) + 9
                ended_early += fed < len(text)
    assert ended_early > len(holes)  # most overruns (2 or 3 a hole) were not decoded to their end


def test_a_middle_cut_by_max_tokens_ends_only_where_the_rules_see_it_before_its_last_line() -> None:
    """(issue 38) A generation stopped by max_tokens leaves its last line unfinished: ``finish()`` reads
    it as such, so the middle ends only where an end is already known (``middle_end`` of the text as
    it is, its last line unfinished), never because the line "completes" the statement."""
    rng = random.Random(5)
    differ = 0
    for hole in HOLES + TS_HOLES:
        text = hole.middle + hole.overruns[min(hole.overruns)]
        stop = rng.randrange(1, len(text) + 1)  # max_tokens reached here, maybe inside a line
        cut_text = text[:stop]
        end = middle_end(hole.prefix, hole.suffix, cut_text, file_path=hole.path)
        gate = MiddleGate(MiddleEnd(hole.prefix, hole.suffix, hole.path))
        shown, fed = "", 0
        while fed < len(cut_text) and gate.ended is None:
            piece = cut_text[fed : fed + rng.randint(1, 9)]
            fed += len(piece)
            shown += gate.feed(piece)
        shown += gate.finish()
        assert shown == (cut_text if end is None else cut_text[:end]), (hole.path, cut_text)
        assert (gate.ended == "syntax") == (end is not None), (hole.path, cut_text)
        differ += end != middle_end(hole.prefix, hole.suffix, cut_text + "\n", file_path=hole.path)
    assert differ >= 5  # cut middles that would end (complete) if their last line were whole


def test_a_cut_middle_is_not_ended_by_its_unfinished_line_and_a_whole_one_is() -> None:
    hole = ("def area(r):\n    return ", "\n\n\nprint(area(2))\n", "m.py")
    cut = MiddleGate(MiddleEnd(*hole))
    assert cut.feed("3.14 * r") == "3.14 * r"
    assert cut.finish() == "" and cut.ended is None  # "3.14 * r" may go on ("* r"): not a whole middle
    whole = MiddleGate(MiddleEnd(*hole))
    assert whole.feed("3.14 * r") + whole.finish(cut=False) == "3.14 * r" and whole.ended == "syntax"
    # An end found before the unfinished line counts: that line, begun, leaves the block.
    block = MiddleGate(MiddleEnd("def f(x):\n    ", "\n", "m.py"))
    assert block.feed("y = x\n") + block.feed("print(") == "y = x"
    assert block.ended is None  # (decided at a newline, or at the finish)
    assert block.finish() == "" and block.ended == "syntax"


def test_a_backslash_ending_a_piece_inside_a_string_does_not_close_it() -> None:
    """A middle written inside a docstring: a piece that ends with ``\\`` (an escape whose character
    has not come yet) is not where the string closes; the middle ended there before (issue 38)."""
    prefix, suffix = 'def f():\n    """Doc\n    ', '\n    """\n    return 1\n'
    assert middle_end(prefix, suffix, "line one\n    a \\", file_path="m.py") is None
    gate = MiddleGate(MiddleEnd(prefix, suffix, "m.py"))
    shown = "".join(gate.feed(p) for p in ["line one", "\n    a \\", "n b", '\n    """', "\n"])
    assert (shown, gate.ended) == ("line one\n    a \\n b", "syntax")


def test_the_cursors_line_streams_as_it_comes() -> None:
    gate = MiddleGate(MiddleEnd("x = foo(", ")\nprint(x)\n", "m.py"))
    assert gate.feed("a, ") == "a,"  # (trailing whitespace waits: a blank first line is not kept)
    assert gate.feed("b") == " b"
    assert gate.feed("\nprint(x)\n") == ""
    assert gate.ended == "syntax" and gate.finish() == ""


def test_a_later_line_streams_once_it_is_sure_to_stay_and_a_dedent_ends_the_middle() -> None:
    prefix, suffix = "def f(x):\n    ", "\n    return total\n\n\ndef g():\n    pass\n"
    gate = MiddleGate(MiddleEnd(prefix, suffix, "m.py"))
    assert gate.feed("y = x\n    ") == "y = x"  # the next line's start is not known yet
    assert gate.feed("z = y") == "\n    z = y"  # in the block, no comment, not the suffix's line
    assert gate.feed("\n    ret") == ""  # may become the suffix's "    return total": held
    assert gate.feed("urn y") == "\n    return y"  # it did not
    assert gate.feed("\n# note") == ""  # a comment may belong to the code after the middle
    assert gate.feed("\ndef h():\n") == "" and gate.ended == "syntax"  # it did: it goes with it
    assert gate.finish() == ""


def test_min_indent_ends_before_a_line_indented_less_as_llama_cpp_n_indent() -> None:
    gate = MiddleGate(None, min_indent=4)
    assert gate.feed("a = 1\n") == "a = 1"  # the first line is never cut; its newline waits for the next
    assert gate.feed("    b = 2\r\n  ") == "\n    b = 2"  # the next line's indentation is not known yet
    assert gate.feed("c") == "" and gate.ended == "indent"
    assert gate.finish() == ""  # the "\r\n" before the cut line goes too
    blank = MiddleGate(None, min_indent=4)
    assert blank.feed("a\n\n    b\n") + blank.finish() == "a\n\n    b\n"  # blank lines do not end it
    assert blank.ended is None


def test_both_rules_the_earlier_end_wins() -> None:
    prefix, suffix = "def f(x):\n    ", "\n"
    gate = MiddleGate(MiddleEnd(prefix, suffix, "m.py"), min_indent=8)
    text = "if x:\n        y = 1\n    z = 2\nw = 3\n"
    out = gate.feed(text) + gate.finish()
    assert (out, gate.ended) == ("if x:\n        y = 1", "indent")


def test_a_hole_inside_a_string_ends_at_its_closer() -> None:
    gate = MiddleGate(MiddleEnd('print("hel', '")\n', "m.py"))
    assert gate.feed('lo") + 1\n') == "lo" and gate.ended == "syntax"


def test_the_gates_old_import_paths_warn_and_give_the_same_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """MiddleGate moved to decoding (it filters the decoded text); langchain_starcoder.ends.MiddleGate
    and langchain_starcoder.ends.stream keep working for one release, with a DeprecationWarning."""
    with pytest.warns(DeprecationWarning, match="langchain_starcoder.decoding.middle"):
        from langchain_starcoder.ends import MiddleGate as old
    assert old is MiddleGate
    monkeypatch.delitem(sys.modules, "langchain_starcoder.ends.stream", raising=False)
    with pytest.warns(DeprecationWarning, match="langchain_starcoder.decoding.middle"):
        stream = importlib.import_module("langchain_starcoder.ends.stream")
    assert stream.MiddleGate is MiddleGate
