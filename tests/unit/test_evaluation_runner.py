"""evaluate() with the in-process engine on the tiny checkpoint: configurations by name, every hole under
every configuration, scored and timed; failures recorded, Ctrl-C keeps what is done."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.errors import InvalidParameterError
from langchain_starcoder.evaluation import Config, EvalReport, cut_holes, evaluate, parse_configs
from langchain_starcoder.evaluation.metrics import cceval_truncate, score

UTIL = "def scale(value, factor=2):\n    return value * factor\n\n\nLIMIT = 10\n"
APP = (
    "from pkg.util import scale, LIMIT\n\n\ndef run(values):\n    total = 0\n    for v in values:\n"
    "        total += scale(v)\n    return min(total, LIMIT)\n"
)
# Longer than the prompt budget the tests give (192 tokens): the budget has to cut the prompt.
FILLER = "".join(f"\n\ndef step_{k}(x):\n    return x + {k}\n" for k in range(40))
FAST = {"max_tokens": 12, "max_prompt_tokens": 192}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "util.py").write_text(UTIL)
    (tmp_path / "pkg" / "app.py").write_text(APP + FILLER)
    return tmp_path


def test_configuration_names() -> None:
    assert parse_configs("psm,spm+repo,psm+noend+repo=300") == [
        Config("psm", "psm"),
        Config("spm+repo", "spm", 1024),
        Config("psm+noend+repo=300", "psm", 300, "none"),
    ]
    for bad, message in [
        ("fim", "must start with its FIM order"),
        ("psm+context", "is not an option"),
        ("psm+repo+repo", "is not an option"),
        ("psm+noend=1", "is not an option"),
        ("psm+repo=0", "positive integer"),
        ("psm+repo=x", "positive integer"),
        ("psm,psm", "given twice"),
        ("", "must start with"),
        ([], "at least one"),
    ]:
        with pytest.raises(InvalidParameterError, match=message):
            parse_configs(bad)


def test_every_hole_under_every_configuration(tiny_engine: StarCoderEngine, repo: Path) -> None:
    holes = cut_holes(repo, n=6, seed=1)
    configs = ["psm", "spm", "psm+repo=64", "psm+noend"]
    report = evaluate(tiny_engine, holes, configs, repo=repo, **FAST)
    assert len(report.records) == len(holes) * 4 and report.configs == configs
    assert report.metadata["in_file_tokens"] == 192 - 64 - 32
    assert [(r.task_id, r.config) for r in report.records] == [(h.task_id, c) for h in holes for c in configs]
    for r in report.records:
        assert r.error is None
        assert dataclasses.asdict(score(r.prediction, r.truth, r.language)) == {
            k: getattr(r, k) for k in ("em", "es", "id_em", "id_f1")
        }
        assert 0 < r.first_token_s <= r.total_s if r.prediction else r.total_s > 0
        assert 0 < r.prompt_tokens <= 192 and r.completion_tokens <= 12 and isinstance(r.ended, bool)
        # app.py is longer than the budget: its window leaves +repo=64 its room (192 - 64 - 32 tokens)
        assert r.prompt_tokens > 80 or r.file != "pkg/app.py"
        assert r.settings["mode"] == r.config[:3] and r.settings["max_prompt_tokens"] == 192
    by = {(r.task_id, r.config): r for r in report.records}
    for h in holes:
        # Only +repo brings other files; the hole's own file never.
        assert by[(h.task_id, "psm")].settings["context_files"] == []
        assert (
            "pkg/app.py" not in by[(h.task_id, "psm+repo=64")].settings["context_files"]
            or h.file != "pkg/app.py"
        )
        # Every configuration gets the same window of the file; +repo adds the other file in its room.
        if h.file == "pkg/app.py":
            plain, with_repo = by[(h.task_id, "psm")], by[(h.task_id, "psm+repo=64")]
            assert set(with_repo.settings["context_files"]) == {"pkg/util.py"}
            assert with_repo.prompt_tokens > plain.prompt_tokens + 20
        # Greedy: the middle-end rule only stops earlier.
        assert by[(h.task_id, "psm+noend")].completion_tokens >= by[(h.task_id, "psm")].completion_tokens
        assert by[(h.task_id, "psm+noend")].settings["end"] == "none"
    cross = [h for h in holes if h.kind == "cross_file"]
    assert cross and all(
        set(by[(h.task_id, "psm+repo=64")].settings["context_files"]) == {"pkg/util.py"} for h in cross
    )
    # The same holes, the same predictions (greedy); the report compares and saves.
    again = evaluate(tiny_engine, holes, configs, repo=repo, **FAST)
    assert [r.prediction for r in again.records] == [r.prediction for r in report.records]
    assert report.compare("psm", "spm")["em"].n == len(holes)


class _Failing:
    """The engine, but a prompt with this marker fails (as a server error would)."""

    def __init__(
        self, engine: StarCoderEngine, fail_on: str = "", interrupt_after: int | None = None
    ) -> None:
        self.engine, self.fail_on, self.interrupt_after, self.calls = engine, fail_on, interrupt_after, 0

    def stream_infill(self, request: Any, suffix: str = "", **settings: Any) -> Any:
        self.calls += 1
        if self.interrupt_after is not None and self.calls > self.interrupt_after:
            raise KeyboardInterrupt
        if self.fail_on and self.fail_on in request.prefix:
            msg = "the server answered 500"
            raise ConnectionError(msg)
        return self.engine.stream_infill(request, suffix, **settings)

    def count_tokens(self, text: str) -> int:
        return self.engine.count_tokens(text)


def test_a_failing_hole_is_recorded_and_the_rest_go_on(tiny_engine: StarCoderEngine, repo: Path) -> None:
    holes = cut_holes(repo, kinds=["line"], n=4, seed=2)
    bad = dataclasses.replace(holes[1], prefix=holes[1].prefix + "\ud800")  # not valid Unicode
    failing = dataclasses.replace(holes[2], prefix="FAIL" + holes[2].prefix)
    report = evaluate(_Failing(tiny_engine, "FAIL"), [holes[0], bad, failing, holes[3]], "psm", **FAST)
    errors = [r.error for r in report.records]
    assert errors[0] is None and errors[3] is None
    assert "InvalidParameterError" in errors[1] and "lone surrogate" in errors[1]
    assert errors[2] == "ConnectionError: the server answered 500"
    assert [row["errors"] for row in report.summary()] == [2]
    assert tiny_engine.infill("x = ", max_tokens=2).finish_reason  # the engine is still usable


def test_ctrl_c_keeps_what_is_done(tiny_engine: StarCoderEngine, repo: Path, tmp_path: Path) -> None:
    holes = cut_holes(repo, kinds=["line"], n=4, seed=3)
    seen = []
    report = evaluate(
        _Failing(tiny_engine, interrupt_after=5), holes, "psm,spm", on_record=seen.append, **FAST
    )
    assert report.metadata["interrupted"] is True
    assert len(report.records) == 5 and seen == report.records
    assert report.compare("psm", "spm")["es"].n == 2  # the complete pairs
    report.save(tmp_path / "partial.json")
    assert EvalReport.load(tmp_path / "partial.json") == report


def test_bad_arguments_are_clear_errors(tiny_engine: StarCoderEngine, repo: Path) -> None:
    holes = cut_holes(repo, kinds=["line"], n=2)
    with pytest.raises(InvalidParameterError, match="needs repo="):
        evaluate(tiny_engine, holes, "psm+repo")
    with pytest.raises(InvalidParameterError, match="target must be"):
        evaluate(object(), holes, "psm")
    with pytest.raises(InvalidParameterError, match="holes must be Hole"):
        evaluate(tiny_engine, ["x"], "psm")
    with pytest.raises(InvalidParameterError, match="max_prompt_tokens must be"):
        evaluate(tiny_engine, holes, "psm", max_prompt_tokens=0)


def test_ctrl_c_mid_stream_closes_the_stream(tiny_engine: StarCoderEngine, repo: Path) -> None:
    """A stream left by Ctrl-C is closed at once (its generation cancelled), not when it is collected."""
    holes = cut_holes(repo, kinds=["line"], n=1, seed=3)
    streams = []

    class _Interrupted:
        def __init__(self, stream: Any) -> None:
            self.stream, self.closed = stream, False

        def __iter__(self) -> Any:
            yield next(iter(self.stream))
            raise KeyboardInterrupt

        def close(self) -> None:
            self.closed = True
            self.stream.close()

    class _Engine(_Failing):
        def stream_infill(self, request: Any, suffix: str = "", **settings: Any) -> Any:
            streams.append(_Interrupted(self.engine.stream_infill(request, suffix, **settings)))
            return streams[-1]

    report = evaluate(_Engine(tiny_engine), holes, "psm", **FAST)
    assert report.metadata["interrupted"] is True
    assert [s.closed for s in streams] == [True]
    assert tiny_engine.infill("x = ", max_tokens=2).finish_reason  # the engine is still usable


class _Saying(_Failing):
    """The engine's stream (its timing, its token counts), but its text the completion given per file:
    the model's own words cannot be chosen, and post-processing is about what they are."""

    def __init__(self, engine: StarCoderEngine, says: dict[str, str]) -> None:
        super().__init__(engine)
        self.says = says

    def stream_infill(self, request: Any, suffix: str = "", **settings: Any) -> Any:
        chunks = list(self.engine.stream_infill(request, suffix, **settings))
        text = self.says[request.file_path]
        return [dataclasses.replace(chunks[-1], text=text)]


TS = "export function total(xs: number[]): number {\n  let sum = 0;\n  return sum;\n}\n"


def test_line_holes_are_scored_after_crosscodeevals_post_processing(
    tiny_engine: StarCoderEngine, repo: Path
) -> None:
    """What CrossCodeEval scores: a line or cross-file hole's completion cut to its first statement
    (Python: where the code parses; TypeScript: at the first ``;``, ``{`` or ``}``); other kinds whole.
    The record keeps the completion as generated (``raw``)."""
    (repo / "web").mkdir()
    (repo / "web" / "total.ts").write_text(TS)
    holes = cut_holes(repo, kinds=["line", "block", "cross_file"], n=12, seed=0)
    assert {h.kind for h in holes} == {"line", "block", "cross_file"}
    says = {
        "pkg/util.py": "x\n    y = 2\n",
        "pkg/app.py": "x\n    y = 2\n",
        "web/total.ts": "x; y = 2; }\n",
    }
    report = evaluate(_Saying(tiny_engine, says), holes, "psm", repo=repo, **FAST)
    assert len(report.records) == len(holes)
    for hole, r in zip(holes, report.records, strict=True):
        assert r.error is None and r.raw == says[hole.file]
        if hole.kind == "block":
            assert r.prediction == r.raw
        elif hole.language == "typescript":
            assert r.prediction == "x;"
        else:  # the first statement of the Python completion, where prefix + it parses
            assert r.prediction == cceval_truncate(hole.prefix, r.raw, "python")
        assert dataclasses.asdict(score(r.prediction, r.truth, r.language)) == {
            k: getattr(r, k) for k in ("em", "es", "id_em", "id_f1")
        }
    cut = [r for r in report.records if r.language == "python" and r.kind != "block"]
    assert any(r.prediction == "x" for r in cut)  # the second line cut
