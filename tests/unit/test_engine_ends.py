"""Decoding stops where the middle ends (issue 31): infill and its stream, async and batch forms, with
prompt lookup and stop strings, on the tiny random-weight checkpoint. What it writes past the end is
found by decoding the same hole with ``end="none"`` (same seed): the answer is that text cut where
``middle_end`` says, the tokens past it are never decoded, and no chunk ever holds text past it."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from langchain_starcoder import InvalidParameterError, StarCoderEngine, middle_end
from langchain_starcoder.fim.request import FIMRequest

PREFIX = "def total(items):\n    result = 0\n    "
SUFFIX = "\n    return result\n\n\ndef main():\n    print(total([1, 2]))\n"
SAMPLED = {"max_tokens": 160, "temperature": 1.0, "seed": 39, "trim_suffix_overlap": False}
# A hole whose greedy middle goes on past its end (found by trying a few on this checkpoint).
GREEDY_PREFIX = "def walk(items):\n    result = 0\n    "


def _cut(text: str, prefix: str = PREFIX, suffix: str = SUFFIX) -> str:
    end = middle_end(prefix, suffix, text + "\n", file_path="m.py")
    return text if end is None else text[: min(end, len(text))]


@pytest.fixture(scope="module")
def raw(tiny_engine: StarCoderEngine):
    """What the model writes for the hole with no end: it runs on past where the middle ends."""
    done = tiny_engine.infill(PREFIX, SUFFIX, file_path="m.py", end="none", **SAMPLED)
    assert len(_cut(done.text)) < len(done.text.rstrip()), done.text  # the hole ends inside it
    return done


def test_infill_stops_decoding_where_the_middle_ends(tiny_engine: StarCoderEngine, raw) -> None:
    done = tiny_engine.infill(PREFIX, SUFFIX, file_path="m.py", **SAMPLED)
    assert done.text == _cut(raw.text)
    assert done.middle_end == "syntax" and done.finish_reason == "stop" and raw.middle_end is None
    assert done.token_ids == raw.token_ids[: done.completion_tokens]
    assert done.completion_tokens < raw.completion_tokens  # the rest was never decoded


def test_no_chunk_holds_text_past_the_end(tiny_engine: StarCoderEngine, raw) -> None:
    want = _cut(raw.text)
    shown = ""
    for chunk in tiny_engine.stream_infill(PREFIX, SUFFIX, file_path="m.py", **SAMPLED):
        shown += chunk.text
        assert want.startswith(shown), (shown, want)
    assert shown == want and chunk.middle_end == "syntax"


def test_async_ends_the_same(tiny_engine: StarCoderEngine, raw) -> None:
    done = asyncio.run(tiny_engine.ainfill(PREFIX, SUFFIX, file_path="m.py", **SAMPLED))
    assert (done.text, done.middle_end) == (_cut(raw.text), "syntax")


GREEDY_HOLE = FIMRequest(GREEDY_PREFIX, SUFFIX, file_path="m.py", trim_suffix_overlap=False)
GREEDY = {"max_tokens": 160, "temperature": 0.0, "prompt_lookup_num_tokens": 0}


def test_each_prompt_of_a_batch_ends_on_its_own(tiny_engine: StarCoderEngine) -> None:
    free = dataclasses.replace(GREEDY_HOLE, end="none")
    raw = tiny_engine.infill(free, **GREEDY)
    ended, kept = tiny_engine.infill_batch([GREEDY_HOLE, free], **GREEDY)
    assert (ended.text, ended.middle_end) == (_cut(raw.text, GREEDY_PREFIX), "syntax")
    assert len(ended.text) < len(raw.text.rstrip()) and ended.completion_tokens < raw.completion_tokens
    assert (kept.text, kept.middle_end) == (raw.text, None)
    later = asyncio.run(tiny_engine.ainfill_batch([GREEDY_HOLE, free], **GREEDY))
    assert [c.text for c in later] == [ended.text, kept.text]


def test_with_prompt_lookup_the_answer_is_the_same(tiny_engine: StarCoderEngine) -> None:
    plain = tiny_engine.infill(GREEDY_HOLE, **GREEDY)
    drafted = tiny_engine.infill(GREEDY_HOLE, **(GREEDY | {"prompt_lookup_num_tokens": 8}))
    assert plain.middle_end == "syntax"
    assert (drafted.text, drafted.middle_end) == (plain.text, plain.middle_end)
    assert drafted.token_ids == plain.token_ids  # no drafted token past the end is kept or counted


def test_a_stop_string_before_the_end_wins_and_one_after_it_changes_nothing(
    tiny_engine: StarCoderEngine, raw
) -> None:
    want = _cut(raw.text)
    before = want[len(want) // 2 :][:3]
    done = tiny_engine.infill(PREFIX, SUFFIX, file_path="m.py", stop=[before], **SAMPLED)
    assert done.text == want[: want.index(before)] and done.stop_sequence == before
    assert done.middle_end is None
    # A stop string from the second line past the end: the end is decided on the line before it.
    second = _end_of_next_line(raw.text, len(want))
    after = raw.text[second:].strip()[:4]
    assert after and after not in raw.text[:second]
    done = tiny_engine.infill(PREFIX, SUFFIX, file_path="m.py", stop=[after], **SAMPLED)
    assert done.text == want and done.middle_end == "syntax"


def test_min_indent_ends_before_a_line_indented_less(tiny_engine: StarCoderEngine, raw) -> None:
    lines = raw.text.split("\n")
    assert len(lines) > 2
    indent = max(len(line) - len(line.lstrip(" \t")) for line in lines[1:] if line.strip()) + 1
    done = tiny_engine.infill(PREFIX, SUFFIX, file_path="m.py", end="none", min_indent=indent, **SAMPLED)
    first = next(i for i, line in enumerate(lines) if i > 0 and line.strip())
    assert done.text == "\n".join(lines[:first]).rstrip("\r") and done.middle_end == "indent"


def test_an_end_found_only_at_max_tokens_still_cuts_and_says_stop(tiny_engine: StarCoderEngine, raw) -> None:
    want = _cut(raw.text)
    # max_tokens ends the decoding on the line that leaves the block, before its newline: the end is
    # found when the generation stops, and the answer is the whole middle all the same.
    upto = _end_of_next_line(raw.text, len(want))
    decoded = (tiny_engine.tokenizer.decode(raw.token_ids[:n]) for n in range(1, raw.completion_tokens + 1))
    tokens = 1 + next(n for n, text in enumerate(decoded) if len(text) >= upto - 1)
    done = tiny_engine.infill(PREFIX, SUFFIX, file_path="m.py", **(SAMPLED | {"max_tokens": tokens}))
    assert (done.text, done.middle_end, done.finish_reason) == (want, "syntax", "stop")
    assert done.completion_tokens == tokens  # it ran to max_tokens: the end was found at the finish


# Holes of issue 38: cut by a small max_tokens, their greedy middle "completes" the statement only if its
# unfinished last line were read as whole (which said "stop", "syntax" for a cut answer).
CUT_HOLES = [
    ("def area(r):\n    return ", "\n\n\nprint(area(2))\n"),
    ("def f(x):\n    y = x +", "\n    return y\n"),
    ("total = ", "\nprint(total)\n"),
]


@pytest.mark.parametrize(("prefix", "suffix"), CUT_HOLES)
def test_a_middle_cut_by_max_tokens_says_length_unless_its_end_was_found(
    tiny_engine: StarCoderEngine, prefix: str, suffix: str
) -> None:
    """ "stop" means a whole middle, "length" a cut one: an answer stopped by max_tokens ends (and says
    "stop", "syntax") only where the rules find the end in the text as it is, its last line unfinished."""
    cut = 0
    for tokens in range(1, 9):
        params = GREEDY | {"max_tokens": tokens, "trim_suffix_overlap": False}
        raw = tiny_engine.infill(prefix, suffix, file_path="m.py", end="none", **params)
        done = tiny_engine.infill(prefix, suffix, file_path="m.py", **params)
        end = middle_end(prefix, suffix, raw.text, file_path="m.py")
        if end is None:
            assert (done.text, done.finish_reason, done.middle_end) == (raw.text, raw.finish_reason, None)
            cut += raw.finish_reason == "length"
        else:
            assert (done.text, done.finish_reason, done.middle_end) == (raw.text[:end], "stop", "syntax")
    assert cut  # some were cut, and said so
    *_, last = tiny_engine.stream_infill(prefix, suffix, file_path="m.py", **(GREEDY | {"max_tokens": 1}))
    assert (last.finish_reason, last.middle_end) == ("length", None)


def _end_of_next_line(text: str, end: int) -> int:
    """Where the first non-blank line after the middle's ``end`` ends (its newline)."""
    rest = text[end + 1 :]
    return text.index("\n", end + 1 + len(rest) - len(rest.lstrip()))


def test_bad_end_settings_are_refused_and_the_engine_stays_usable(tiny_engine: StarCoderEngine) -> None:
    with pytest.raises(InvalidParameterError, match="end must be one of"):
        tiny_engine.infill(PREFIX, SUFFIX, end="sometimes")
    with pytest.raises(InvalidParameterError, match="min_indent"):
        tiny_engine.infill(PREFIX, SUFFIX, min_indent=-1)
    assert tiny_engine.infill(PREFIX, SUFFIX, max_tokens=2).completion_tokens <= 2
