"""llama.cpp's --cache-reuse against its exact prompt cache (benchmarks/typing_reuse.py): the same editor
requests to two real llama-servers, answers compared."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.typing_reuse import compare, main
from benchmarks.typing_sessions import toy_repository


def test_answers_differing_after_a_shifted_chunk_are_counted_and_warm_ups_left_out() -> None:
    def answer(content: str, logprob: float, prefilled: int, steady: bool = True) -> dict:
        return {"content": content, "logprob": logprob, "prefilled": prefilled, "steady": steady}

    exact = [answer("", -1.0, 900, steady=False), answer("x = 1", -0.5, 300), answer("y", -2.0, 40)]
    reused = [answer("", -9.0, 900, steady=False), answer("x = 1", -0.4, 6), answer("z", -1.5, 40)]
    got = compare(exact, reused)
    assert (got["requests"], got["same_answer"]) == (2, 1)
    assert math.isclose(got["first_logprob_moved_max"], 0.5) and math.isclose(
        got["first_logprob_moved_p50"], 0.3
    )
    assert (got["prefilled_p50_exact"], got["prefilled_p50_reuse"]) == (170, 23)
    assert (got["prefilled_total_exact"], got["prefilled_total_reuse"]) == (340, 46)


def test_the_harness_runs_the_editors_requests_against_both_servers(tmp_path: Path) -> None:
    repo = toy_repository(tmp_path / "repo")
    got = main(["--typing-repo", str(repo), "--workdir", str(tmp_path / "work"), "--tiny", "--sessions", "1"])
    assert got["requests"] >= 2 and 0 <= got["same_answer"] <= got["requests"]
    assert got["prefilled_p50_exact"] >= 1 and got["prefilled_p50_reuse"] >= 1
    assert got["first_logprob_moved_max"] >= 0
    assert 0 <= got["control_same_answer"] <= got["requests"]  # (llama-server itself varies run to run)
