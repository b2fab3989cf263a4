"""The end-of-middle measure (benchmarks/ends_measure.py) cuts holes and overruns as issue 31 defines
them, its baselines (benchmarks/ends_baselines.py) behave as their sources do, the section reports
per language against the goals, and the decode time saved (benchmarks/ends_decode.py) counts the tokens
an engine's gate stops before."""

from __future__ import annotations

import inspect
import json
import random
import textwrap
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from benchmarks.ends import by_language, section
from benchmarks.ends_baselines import continue_brackets, tabby, today
from benchmarks.ends_decode import checkpoint, count_tokens, ms_per_token, summarize
from benchmarks.ends_measure import Hole, holes_in_file, is_test_path, make_holes, verdict

PY = """def first(items):
    total = 0
    for item in items:
        total += item
    return total


def second(x):
    y = x + 1
    z = y * 2
    w = z - 3
    return w
"""

JS = """function f(x) {
  const y = x + 1;
  if (y) { return y; }
  return 0;
}

function g(a) {
  const b = a * 2;
  const c = b - 1;
  const d = c + 5;
  return d;
}
"""


def test_block_holes_run_to_the_end_of_their_block() -> None:
    blocks, _ = holes_in_file("m.py", PY, "python", random.Random(0))
    starts = {hole.middle.split("\n")[0] for hole in blocks}
    assert "total = 0" in starts and "total += item" in starts
    hole = next(h for h in blocks if h.middle.startswith("total = 0"))
    assert hole.middle == "total = 0\n    for item in items:\n        total += item\n    return total"
    assert hole.prefix.endswith("def first(items):\n    ") and hole.suffix.startswith("\n\n\ndef second")
    inner = next(h for h in blocks if h.middle == "total += item")  # the for loop's own block
    assert inner.suffix.startswith("\n    return total")
    # (a): the suffix up to the end of its third non-blank line.
    assert hole.overruns["a"] == "\n\n\ndef second(x):\n    y = x + 1\n    z = y * 2"
    # (b): another function's first 3 body lines, re-indented to the suffix's first non-blank line.
    assert hole.overruns["b"] == "\ny = x + 1\nz = y * 2\nw = z - 3"
    assert set(hole.overruns) == {"a", "b"}


def test_line_holes_take_the_rest_of_a_line_and_three_overruns() -> None:
    _, lines = holes_in_file("m.py", PY, "python", random.Random(0))
    assert lines
    for hole in lines:
        line = (hole.prefix.rsplit("\n", 1)[-1] + hole.middle).strip()
        assert hole.suffix.startswith("\n") and "\n" not in hole.middle
        assert sum(not c.isspace() for c in hole.middle) >= 3
        assert hole.prefix.rsplit("\n", 1)[-1].strip()  # after the statement's first character
        assert line in PY.splitlines()[PY[: len(hole.prefix)].count("\n")]
        assert set(hole.overruns) == {"a", "b", "c"}
        next_line = PY.split("\n")[PY[: len(hole.prefix)].count("\n") + 1]
        assert hole.overruns["c"] == "\n" + next_line


def test_brace_blocks_keep_their_closing_brace_in_the_suffix() -> None:
    blocks, _ = holes_in_file("a.js", JS, "javascript", random.Random(0))
    middles = [hole.middle for hole in blocks]
    assert "const y = x + 1;\n  if (y) { return y; }\n  return 0;" in middles
    assert all(hole.suffix.lstrip(" ").startswith("\n") for hole in blocks)
    assert "return y;" not in middles  # its block closes on the same line: no hole
    hole = next(h for h in blocks if h.middle.startswith("const b"))
    assert hole.suffix.startswith("\n}") and hole.overruns["b"].startswith("\nconst y = x + 1;")


def test_tests_are_left_out() -> None:
    for path in (
        "tests/a.py",
        "pkg/test_x.py",
        "x_test.go",
        "a.spec.ts",
        "src/__tests__/a.js",
        "conftest.py",
    ):
        assert is_test_path(path), path
    assert not is_test_path("pkg/contest.py") and not is_test_path("src/latest.js")
    assert make_holes([("tests/m.py", PY)], "python") == []
    rust = "fn a() {\n    let x = 1;\n    x\n}\n\n#[test]\nfn t() {\n    let y = 2;\n    y;\n}\n"
    blocks, _ = holes_in_file("lib.rs", rust, "rust", random.Random(0))
    assert [h.middle for h in blocks] == ["let x = 1;\n    x", "x"]


def test_verdicts() -> None:
    assert verdict(5, "12345") == "exact" and verdict(6, "12345") == "exact"
    assert verdict(4, "12345") == "premature"
    assert verdict(7, "12345") == "late" and verdict(None, "12345") == "late"


def test_baselines_end_as_their_sources_do() -> None:
    prefix, suffix = "def f():\n    ", "\n\ndef g():\n    pass\n"
    # today's ends: only a repeat of the suffix is trimmed.
    assert today(prefix, suffix, "x = 1\n\ndef g():\n    pass", "python") == len("x = 1")
    assert today(prefix, suffix, "x = 1\nprint(2)", "python") == len("x = 1\nprint(2)")
    # Tabby: the first line indented less than the block ends it; that line is kept as the block's
    # closing line (a `}`) when the suffix allows, in Python unless a blank line comes before it.
    assert tabby(prefix, suffix, "x = 1\n    y = 2\n\nprint(2)\n", "python") == len("x = 1\n    y = 2")
    assert tabby(prefix, suffix, "x = 1\n    y = 2\nprint(2)\nz()", "python") == len(
        "x = 1\n    y = 2\nprint(2)"
    )
    # Continue: at the first closing bracket nothing in the completion opened.
    assert continue_brackets("f() {\n  ", "\n}\n", "a(1);\n}\nmore", "javascript") == len("a(1);\n")


def test_the_section_reports_per_language_against_the_goals() -> None:
    def repo(name: str, language: str, exact: float) -> dict:
        shares = {
            m: {
                "all": {"exact": exact if m == "ours" else 0.5, "premature": 0.0, "n": 100},
                "block": {"exact": exact, "premature": 0.0, "n": 50},
                "line": {"exact": exact, "premature": 0.0, "n": 50},
            }
            for m in ("ours", "today", "tabby", "continue")
        }
        timing = {"feed_p50_ms": 0.01, "feed_p95_ms": 0.03, "build_p95_ms": 5.0, "file": "x", "lines": 2000}
        return {
            "repo": name,
            "version": name,
            "language": language,
            "block_holes": 50,
            "line_holes": 50,
            "shares": shares,
            "timing": timing,
        }

    repos = [repo("a", "python", 1.0), repo("b", "python", 0.96), repo("c", "typescript", 0.99)]
    skipped = [{"repo": "d", "why": "not here"}]
    found = {"repos": repos, "skipped": skipped, "tuned_on": ("a",), "per_kind": 50, "seed": 0}
    languages = by_language(found)
    assert set(languages) == {"python", "javascript"}  # TypeScript counts with JavaScript
    assert abs(languages["python"]["ours"]["exact"] - 0.98) < 1e-9
    s = section(found)
    goals = [row for row in s.rows if row.goal is not None]
    assert {row.metric for row in goals} >= {
        "exact share, python",
        "share not premature, python",
        "p95 of a feed call",
    }
    assert all(row.item == 21 for row in s.rows)
    assert any("skipped (not here)" in note for note in s.notes)


def test_decoding_stops_where_the_gate_ends_the_middle(tiny_path: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_path / "tokenizer.json"))
    blocks, lines = holes_in_file("m.py", PY, "python", random.Random(0))
    hole = next(h for h in blocks if h.middle.startswith("total = 0"))
    goes_on = Hole(
        "m.py", "block", "def f():\n    ", "\n\ndef g():\n    pass\n", "x = 1", {"z": "\n    y = 2"}
    )
    pairs = count_tokens(tokenizer, [hole, goes_on, *lines])
    for pair in pairs:
        assert pair["middle"] <= pair["total"] and 1 <= pair["decoded"] <= pair["total"]
    # Overrun (b) of the block hole: the gate ends it once the line past the middle is read, so the
    # decoded tokens cover the middle and that line, and the rest of the overrun is not decoded.
    b = next(p for p in pairs if p["overrun"] == "b")
    text = hole.middle + hole.overruns["b"]
    covered = tokenizer.encode(text, add_special_tokens=False).offsets[b["decoded"] - 1][1]
    assert b["ended"] and len(hole.middle) < covered < len(text)
    assert text[:covered].count("\n") == hole.middle.count("\n") + 2  # the deciding line, whole
    # A text still inside the block never ends: every token is decoded.
    z = next(p for p in pairs if p["overrun"] == "z")
    assert not z["ended"] and z["decoded"] == z["total"]
    summary = summarize(pairs, 2.0)
    assert summary["pairs"] == len(pairs) and 0 < summary["share_saved"] < 1
    assert abs(summary["ms_saved"] - 2.0 * summary["tokens_saved"]) < 1e-9
    assert abs(summary["tokens_saved"] - summary["tokens_none"] + summary["tokens_auto"]) < 1e-9


def test_decode_time_per_token_is_measured_on_the_checkpoint(clean_path: Path) -> None:
    hole = Hole("m.py", "block", "def f(x):\n    ", "\n\ndef g():\n    pass\n", "return x")
    ms, counts = ms_per_token(clean_path, hole, runs=2, tokens=8)
    assert counts == [8, 8] and len(ms) == 2 and all(m > 0 for m in ms)


def test_a_trained_copier_is_preferred_to_its_shape(tmp_path: Path) -> None:
    (tmp_path / "copier-abc").mkdir()
    (tmp_path / "copier-abc" / "training.json").write_text("{}")
    folder, what = checkpoint(tmp_path)
    assert folder == tmp_path / "copier-abc" and "trained" in what


@pytest.mark.slow
def test_the_copier_shape_is_built_once(tmp_path: Path, tiny_path: Path) -> None:
    folder, what = checkpoint(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (4, 64, 1024)
    assert not config["sliding_window"] and "random weights" in what
    # The copier's tokenizer: a BPE trained on its corpus (Python), not the tests' synthetic one.
    code = inspect.getsource(textwrap.dedent)  # of the copier's corpus
    tokens = [
        len(Tokenizer.from_file(str(p / "tokenizer.json")).encode(code).ids) for p in (folder, tiny_path)
    ]
    assert tokens[0] < 0.8 * tokens[1], tokens
    assert checkpoint(tmp_path)[0] == folder
