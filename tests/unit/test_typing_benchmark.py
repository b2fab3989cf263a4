"""The typing replay (``python -m benchmarks --only typing --quick``): sessions from a git history, the
editor's requests, and a replay of one short session on the tiny checkpoint against our server's
configurations, in seconds. Structure and events only: the timings of a shared machine judge nothing."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.__main__ import main
from benchmarks.cases import BENCHMARKS, OPTIONAL
from benchmarks.typing_replay import Record, bench_typing, summary
from benchmarks.typing_sessions import (
    PAUSE,
    REQUEST_AFTER,
    EditorSettings,
    keystrokes,
    llama_vim_body,
    sessions_from_git,
    toy_repository,
)


def test_sessions_are_a_commits_added_lines_typed_into_the_file(tmp_path: Path) -> None:
    repo = toy_repository(tmp_path / "repo")
    (session,) = sessions_from_git(repo, 1, seed=0)
    assert session.typed == "def total(items):\n    return sum(items)\n"
    assert session.path == "app.py"
    text = (repo / "app.py").read_text()
    assert session.before + session.typed + session.after == text  # the block goes back at its place
    assert [name for name, _ in session.ring] == ["values.py"]  # the other file's chunk: the ring buffer


def test_the_editor_asks_250_ms_into_each_pause_with_llama_vims_fields(tmp_path: Path) -> None:
    (session,) = sessions_from_git(toy_repository(tmp_path / "repo"), 1, seed=0)
    requests, keys = keystrokes(session.typed, seed=1, start=0.0)
    newline = session.typed.index("\n") + 1 + 4  # the newline and the indentation that comes with it
    assert any(r.typed == newline for r in requests)  # a pause after every line
    assert all(
        round(r.at - REQUEST_AFTER - k.at, 6) == 0 for r in requests for k in keys if k.typed == r.typed
    )
    assert keys[-1].at > 0.06 * (len(session.typed) - 8)  # typed at 60 ms a key, indentation excepted
    assert sum(PAUSE for _ in requests) <= keys[-1].at
    settings = EditorSettings(n_prefix=4, n_suffix=2, ring_chunks=1, chunk_lines=8, n_predict=8)
    body = llama_vim_body(session, newline + 6, settings)
    assert body["prompt"] == "    return"  # the cursor's line up to the cursor
    assert body["input_prefix"].endswith("def total(items):\n") and body["input_prefix"].count("\n") == 4
    assert body["input_suffix"].count("\n") == 3 and body["input_suffix"].startswith("\n")
    assert body["input_extra"][0]["filename"] == "values.py" and body["id_slot"] == 0
    assert body["cache_prompt"] is True and body["n_predict"] == 8
    assert llama_vim_body(session, 0, settings, warm_up=True)["n_predict"] == 0


def test_quick_replay_runs_every_mlx_configuration_on_the_same_session(tmp_path: Path) -> None:
    assert BENCHMARKS["typing"] is bench_typing and "typing" in OPTIONAL
    code = main(
        [
            "--only",
            "typing",
            "--quick",
            "--quiet",
            "--workdir",
            str(tmp_path / "work"),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    (section,) = json.loads((tmp_path / "out/results.json").read_text())["sections"]
    records = section["data"]["records"]
    assert list(records) == ["today's server, MLX", "ours, MLX, PSM", "ours, MLX, SPM"]
    asked = [sorted((r for r in rs if not r["warm_up"]), key=lambda r: r["due"]) for rs in records.values()]
    assert all(rs[0]["first_of_session"] and not rs[0]["due"] for rs in asked)  # at the cursor, on opening
    typing = [[round(r["due"] - rs[1]["due"], 6) for r in rs[1:]] for rs in asked]
    assert typing[0] == typing[1] == typing[2] and len(typing[0]) >= 2  # the same keystrokes and pauses
    today, psm, spm = records.values()
    assert not any(r["warm_up"] or r["cancelled"] for r in today)  # today: no warm-up, no supersession
    newlines = "def total(items):\n    return sum(items)\n".count("\n")  # the toy session's text
    assert [r["warm_up"] for r in psm].count(True) == [r["warm_up"] for r in spm].count(True) == newlines
    # The same request's prompt (prefilled plus cached) is as long in PSM as in SPM, and at least as long as
    # today's: the stable prefix puts back the lines the editor's window of 16 dropped (at line 30).
    for i in range(len(typing[0]) + 1):
        sizes = [None if rs[i]["prefilled"] is None else rs[i]["prefilled"] + rs[i]["cached"] for rs in asked]
        assert sizes[0] is not None and all(n is None or n >= sizes[0] for n in sizes), (i, sizes)
        assert None in sizes[1:] or sizes[1] == sizes[2], (i, sizes)
    for r in (r for rs in records.values() for r in rs if r["first"] is not None):
        assert r["first_any"] is not None and r["first_any"] <= r["first"] <= r["end"]
    figures = section["data"]["figures"]
    assert set(figures) == set(records) and all(f["requests"] == len(typing[0]) for f in figures.values())
    metrics = {r["metric"] for r in section["rows"]}
    assert metrics == {
        "p95 time to first ghost text, steady typing",
        "median tokens prefilled per request, steady typing",
    }


def test_ghost_text_is_timed_at_its_first_visible_character_and_whitespace_answers_count_apart() -> None:
    def record(due: float, first_any: float | None, first: float | None, end: float, **kw: object) -> Record:
        return Record(
            0, due, sent=due, first_any=first_any, first=first, end=end, prefilled=4, cached=9, **kw
        )

    records = [
        record(0.0, 0.5, 0.5, 0.6, first_of_session=True),  # the request when the file opens: not steady
        record(1.0, 1.1, 1.3, 1.4),  # a space first, visible text 0.3 s after the request
        record(2.0, 2.5, None, 2.5),  # whitespace only, released at its end
        record(3.0, None, None, 3.2, cancelled=True),  # superseded before any text
        record(3.1, None, None, 3.3, warm_up=True),
    ]
    f = summary(records)
    assert f["requests"] == 3 and f["with_ghost_text"] == 1 and f["blank"] == 1 and f["cancelled"] == 1
    assert abs(f["ttft_p50"] - 0.3) < 1e-9 and abs(f["ttft_p95"] - 0.3) < 1e-9
    assert abs(f["any_text_p50"] - 0.3) < 1e-9 and abs(f["any_text_p95"] - 0.48) < 1e-9  # of 0.1 and 0.5
