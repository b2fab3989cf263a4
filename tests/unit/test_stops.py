"""The stop-string filter against a brute-force reference, over arbitrary text and chunkings."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from langchain_starcoder.decoding.stops import StopStrings


def reference(text: str, stops: list[str]) -> tuple[str, str | None]:
    """Grow the text one character at a time; the first time a stop appears, cut where it starts."""
    for end in range(1, len(text) + 1):
        found = [(text[:end].find(s), -len(s), s) for s in stops if s in text[:end]]
        if found:
            start, _, stop = min(found)
            return text[:start], stop
    return text, None


def run(chunks: list[str], stops: list[str]) -> tuple[list[str], str | None]:
    matcher = StopStrings(stops)
    shown = []
    for chunk in chunks:
        shown.append(matcher.feed(chunk))
        if matcher.ended is not None:
            assert matcher.finish(cut=False) == ""  # nothing after a stop
            return shown, matcher.ended
    shown.append(matcher.finish(cut=False))
    return shown, None


alphabet = st.sampled_from("ab\n é🚀")  # few letters, so that stops overlap and repeat often
texts = st.lists(st.text(alphabet, max_size=4), max_size=12)
stop_lists = st.lists(st.text(alphabet, min_size=1, max_size=4), max_size=4)


@settings(max_examples=400, deadline=None)
@given(texts, stop_lists)
def test_matches_brute_force(chunks: list[str], stops: list[str]) -> None:
    text = "".join(chunks)
    shown, stop = run(chunks, stops)
    expected, expected_stop = reference(text, stops)
    assert "".join(shown) == expected
    assert stop == expected_stop


@settings(max_examples=200, deadline=None)
@given(texts, stop_lists)
def test_shown_text_never_holds_part_of_a_stop(chunks: list[str], stops: list[str]) -> None:
    shown, stop = run(chunks, stops)
    joined = "".join(shown)
    assert not any(s in joined for s in stops)
    if stop is not None:  # what was shown is exactly the text before the stop, nothing of it
        assert "".join(chunks).startswith(joined + stop)


def test_stop_spanning_chunks_is_held_back() -> None:
    matcher = StopStrings(["</code>"])
    assert (matcher.feed("x = 1</"), matcher.ended) == ("x = 1", None)
    assert (matcher.feed("co"), matcher.ended) == ("", None)
    assert (matcher.feed("de> more"), matcher.ended) == ("", "</code>")


def test_false_start_is_released() -> None:
    matcher = StopStrings(["\ndef "])
    assert (matcher.feed("a\nd"), matcher.ended) == ("a", None)
    assert (matcher.feed("o"), matcher.ended) == ("\ndo", None)
