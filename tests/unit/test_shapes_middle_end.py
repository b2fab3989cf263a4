"""llama.cpp's ``stop_type`` of a FIM answer (issue 38): "middle_end" only for a middle that ended where
the code does (``finish_reason`` "stop"); one cut by ``n_predict`` is "limit", whatever else it says."""

from __future__ import annotations

from langchain_starcoder.server.shapes import final_answer
from langchain_starcoder.types import Completion


def _stop_type(finish_reason: str, middle_end: str | None = None) -> str:
    done = Completion("x", [1], finish_reason, 3, 0, 1, middle_end=middle_end)
    return final_answer("tiny", done, done.text, truncated=False, n_predict=4)["stop_type"]


def test_only_a_whole_middle_says_middle_end() -> None:
    assert _stop_type("stop", "syntax") == "middle_end"
    assert _stop_type("stop", "indent") == "limit"  # n_indent, as llama.cpp says it
    assert _stop_type("length", "syntax") == "limit"  # cut by n_predict: not a whole middle
    assert _stop_type("length") == "limit"
    assert _stop_type("stop") == "eos"
