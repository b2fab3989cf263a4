"""The typing replay's prefill counts without a model (benchmarks/typing_prefill.py), on the toy repository:
the window of 16 lines slides at each typed newline, and the stable prefix keeps the prompt's start."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from benchmarks.typing_prefill import prefills, requests_of
from benchmarks.typing_replay import QUICK, SEED
from benchmarks.typing_sessions import sessions_from_git, toy_repository


def test_the_stable_prefix_prefills_a_slid_window_only_where_it_changed(tmp_path: Path, tiny_path: Path):
    tokenizer = Tokenizer.from_file(str(tiny_path / "tokenizer.json"))
    sessions = sessions_from_git(toy_repository(tmp_path / "repo"), 1, SEED, ring=2, chunk_lines=8)
    bodies = requests_of(sessions[0], 0, QUICK, warm_up=True)
    assert bodies[0]["first"] and sum("warm_up" in b for b in bodies) == sessions[0].typed.count("\n")
    got = {
        (mode, stable): prefills(tokenizer, sessions, QUICK, mode, stable, True)
        for mode in ("psm", "spm")
        for stable in (True, False)
    }
    for mode in ("psm", "spm"):
        stable, sent = got[mode, True], got[mode, False]
        assert stable["warm_ups"] == sent["warm_ups"] == 2
        # A newline's warm-up: the window as sent changes from its first line, the longer prefix at its end.
        assert stable["warm_up_mean"] < sent["warm_up_mean"] / 2
        assert stable["prompt_p50"] > sent["prompt_p50"]  # the lines the window dropped are back
    assert (
        got["spm", True]["prefilled_p95"] <= 32 < got["psm", True]["prefilled_p95"]
    )  # PSM: the suffix again
