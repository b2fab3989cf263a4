"""Where an editor's window of the lines before the cursor slid to (stable_prefix.py); the memory's bounds."""

from __future__ import annotations

from langchain_starcoder.editor.stable_prefix import MIN_OVERLAP_LINES, StablePrefixes, slid_start
from langchain_starcoder.editor.supersede import Document

LINES = [f"value_{i} = compute({i}, {i % 5})\n" for i in range(60)]
DOC = Document("127.0.0.1/key", None, 0)


def text(start: int, stop: int, cursor: str = "") -> str:
    return "".join(LINES[start:stop]) + cursor


def test_a_window_slid_down_by_a_line_starts_inside_the_last_one():
    old = text(10, 18, "total = ")
    new = text(11, 18, "total = 1\n")  # the cursor line was completed: it may differ from the old one
    assert slid_start(old, new) == len(text(10, 11))
    assert slid_start(old, text(13, 18, "total = 1\ncount = 2\nname = ")) == len(text(10, 13))


def test_the_cursor_line_may_shrink_but_a_complete_line_may_not_differ():
    old = text(10, 18, "total = compute")
    assert slid_start(old, text(11, 18, "total")) == len(text(10, 11))  # backspace on the cursor's line
    edited = text(11, 14) + "value_14 = 0\n" + text(15, 18, "total")  # an edit inside the window
    assert slid_start(old, edited) is None


def test_no_start_for_a_window_that_did_not_slide_moved_up_or_jumped():
    old = text(10, 18, "total = ")
    assert slid_start(old, text(10, 18, "total = 1")) is None  # the same start: nothing to add
    assert slid_start(old, text(6, 14)) is None  # moved up
    assert slid_start(old, text(30, 38)) is None  # jumped down the file
    assert slid_start(old, text(11, 18).replace("value_11", "val_11")) is None  # its first line edited
    assert slid_start("", text(0, 8)) is None and slid_start(old, "total = 1") is None


def test_an_overlap_of_few_lines_is_not_trusted():
    old = text(10, 18)
    few = MIN_OVERLAP_LINES - 1
    assert slid_start(old, text(18 - few, 18) + "x = 1\n") is None
    assert slid_start(old, text(14, 18, "x = 1\ny = 2\n")) == len(text(10, 14))  # 4 of 6 lines
    assert slid_start(old, text(16, 18) + "".join(f"x_{i} = 1\n" for i in range(6))) is None  # 2 of 8


def test_repeated_lines_take_the_longest_overlap():
    old = "pass\n" * 6
    assert slid_start(old, "pass\n" * 6 + "x = 1\n") is None  # starts where it started
    assert slid_start(old, "pass\n" * 5 + "x = 1\n") == len("pass\n")


def test_extended_puts_back_the_dropped_lines_and_remembers_nothing_by_itself():
    prefixes = StablePrefixes()
    assert prefixes.extended(DOC, text(11, 18)) is None  # nothing remembered yet
    prefixes.remember(DOC, text(10, 18, "total = "))
    new = text(11, 18, "total = 1\n")
    assert prefixes.extended(DOC, new) == text(10, 11) + new
    assert prefixes.extended(Document("127.0.0.1/key", "other.py", 0), new) is None  # another document
    prefixes.remember(DOC, "")  # llama.vim's ring-buffer update (no hole) keeps the memory
    assert prefixes.extended(DOC, new) == text(10, 11) + new


def test_the_memory_is_bounded_in_documents_and_in_text_per_document():
    prefixes = StablePrefixes(max_documents=3, max_chars=len(text(10, 20)))
    documents = [Document("c", f"f{i}.py", None) for i in range(5)]
    for document in documents:
        prefixes.remember(document, text(10, 18, "x"))
    assert len(prefixes) == 3 and prefixes.chars == 3 * len(text(10, 18, "x"))
    assert prefixes.extended(documents[0], text(11, 18, "x\n")) is None  # the oldest was forgotten
    assert prefixes.extended(documents[4], text(11, 18, "x\n")) is not None
    # A longer prefix than the limit is not kept, and nothing is extended past the limit.
    assert prefixes.extended(documents[4], text(12, 21, "y\n")) is None  # 10..21: over the limit
    prefixes.remember(documents[4], text(0, 30))
    assert len(prefixes) == 2 and prefixes.extended(documents[4], text(1, 12)) is None
