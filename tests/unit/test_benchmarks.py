"""The benchmark harness runs end to end on tiny checkpoints and writes well-formed results.

These check structure, not speed: timings on a shared CI machine mean nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

import benchmarks.__main__ as bench_main
from benchmarks.__main__ import main
from benchmarks.cases import BENCHMARKS, OPTIONAL
from benchmarks.harness import (
    Row,
    Section,
    interleave,
    markdown_table,
    rate_from_marks,
)

PUBLISHED = [Path(bench_main.__file__).parent / name for name in ("results.json", "results.md")]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, str]:
    out = tmp_path_factory.mktemp("bench")
    code = main(
        [
            "--preset",
            "tiny",
            "--no-openblas",
            "--quiet",
            "--warmup",
            "0",
            "--workdir",
            str(out / "work"),
            "--out",
            str(out / "results"),
        ]
    )
    return (
        code,
        json.loads((out / "results/results.json").read_text()),
        (out / "results/results.md").read_text(),
    )


def test_default_run_writes_every_default_benchmark(tiny_run: tuple[int, dict, str]) -> None:
    code, data, _ = tiny_run
    assert code == 0
    expected = [name for name in BENCHMARKS if name not in OPTIONAL]
    assert data["selected"] == expected
    assert [s["key"] for s in data["sections"]] == expected
    assert data["preset"] == "tiny"
    assert data["conditions"]["cores"] >= 1


def test_rows_hold_positive_medians_and_ratios(tiny_run: tuple[int, dict, str]) -> None:
    _, data, _ = tiny_run
    rows = [row for s in data["sections"] for row in s["rows"]]
    # Every default benchmark but the OpenBLAS one (left out here) produced comparisons.
    assert {s["key"] for s in data["sections"] if s["rows"]} == {
        "overhead",
        "dtype",
        "cache",
        "batch",
        "memory",
        "longctx",
        "gguf",
        "server",
        "speculative",
    }
    for row in rows:
        for key in ("a_median", "b_median", "ratio"):
            assert isinstance(row[key], float) and math.isfinite(row[key]) and row[key] > 0, (
                row["title"],
                key,
            )
        assert row["a_min"] <= row["a_median"] <= row["a_max"]
        assert row["ratio"] == pytest.approx(row["a_median"] / row["b_median"])
        assert row["met"] is None if row["goal"] is None else isinstance(row["met"], bool)
    assert {r["item"] for r in rows} == {1, 2, 3, 5, 6, 7, 10, 11, 17}
    blas = next(s for s in data["sections"] if s["key"] == "blas")
    assert blas["skipped"] == "--no-openblas" and not blas["rows"]


def test_cache_benchmark_really_reuses_the_prompt_cache(tiny_run: tuple[int, dict, str]) -> None:
    _, data, _ = tiny_run
    cache = next(s for s in data["sections"] if s["key"] == "cache")
    assert 0 < cache["data"]["cached_tokens"] < cache["data"]["prompt_tokens"]
    assert cache["data"]["prompt_tokens"] - cache["data"]["cached_tokens"] <= 40


def test_markdown_has_a_row_per_comparison(tiny_run: tuple[int, dict, str]) -> None:
    _, data, md = tiny_run
    table = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| #")]
    rows = sum(len(s["rows"]) for s in data["sections"])
    skipped = sum(1 for s in data["sections"] if s["skipped"])
    assert len(table) == rows + skipped
    assert "Wrapper overhead" in md and "python -m benchmarks" in md


def test_a_tiny_run_shows_the_goals_without_judging_them(tiny_run: tuple[int, dict, str]) -> None:
    """Tiny checkpoints say nothing about speed: the goals are shown as the real shapes' and left unmarked."""
    _, data, md = tiny_run
    goals = [row for s in data["sections"] for row in s["rows"] if row["goal"] is not None]
    table = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| #")]
    judged = [line for line in table if "✅" in line or "❌" in line]
    assert goals and not judged
    assert sum("(real shapes only; not judged on tiny)" in line for line in table) == len(goals)
    real = markdown_table([_section(Row(3, "t", "m", "A", "B", [1.0], [2.0], "s", "shape", ("<=", 1.0)))])
    assert "<= 1.00 ✅" in real  # a run on the real shapes marks them


def test_only_and_unknown_names(tmp_path: Path, tiny_path: Path) -> None:
    assert (
        main(
            [
                "--preset",
                "tiny",
                "--only",
                "memory",
                "--quiet",
                "--workdir",
                str(tmp_path / "w"),
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    data = json.loads((tmp_path / "results.json").read_text())
    assert [s["key"] for s in data["sections"]] == ["memory"]
    with pytest.raises(SystemExit):
        main(["--only", "nonsense", "--out", str(tmp_path)])


def test_interleave_alternates_and_warms_up() -> None:
    calls: list[str] = []

    def variant(name: str):
        return lambda: calls.append(name) or float(len(calls))

    samples = interleave([("a", variant("a")), ("b", variant("b"))], reps=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert samples == {"a": [3.0, 5.0, 7.0], "b": [4.0, 6.0, 8.0]}


def test_rate_and_goal_arithmetic() -> None:
    # The first arrival carries the prefill: 4 more tokens over 2 seconds.
    assert rate_from_marks([(10.0, 3), (11.0, 2), (12.0, 2)]) == pytest.approx(2.0)
    row = Row(3, "t", "m", "A", "B", [1.0, 2.0, 9.0], [20.0, 30.0], "s", "shape", ("<=", 0.1))
    assert row.ratio == pytest.approx(2.0 / 25.0) and row.met is True
    assert "1/12" in markdown_table([_section(row)])
    # Shares of 0 (an exact match no configuration reached): 0/0 is n/a, 0/x is 0, not a division error.
    zero = markdown_table([_section(Row(24, "t", "em", "A", "B", [0.0], [0.0], "share", "shape"))])
    assert zero.splitlines()[-1].split(" | ")[-2] == "n/a"
    some = markdown_table([_section(Row(24, "t", "em", "A", "B", [0.0], [0.5], "share", "shape"))])
    assert some.splitlines()[-1].split(" | ")[-2] == "0"


def _section(row: Row) -> Section:
    return Section("x", row.item, "x", rows=[row])


def test_baselines_against_transformers_on_tiny(tmp_path: Path) -> None:
    code = main(
        [
            "--preset",
            "tiny",
            "--only",
            "baselines",
            "--no-openblas",
            "--quiet",
            "--warmup",
            "0",
            "--workdir",
            str(tmp_path / "w"),
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    (section,) = json.loads((tmp_path / "results.json").read_text())["sections"]
    assert [r["metric"] for r in section["rows"]] == ["float32 prefill tokens/s", "float32 decode tokens/s"]
    assert all(r["ratio"] > 0 for r in section["rows"])
    assert section["data"]["bandwidth_gbs"] > 0 and section["data"]["roofline_tps"] > 0


# --- where results go ------------------------------------------------------------------------------


def _digests() -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in PUBLISHED]


def test_a_default_run_leaves_the_published_results_alone(tmp_path: Path, capsys) -> None:
    before = _digests()
    assert main(["--preset", "tiny", "--only", "memory", "--workdir", str(tmp_path / "w")]) == 0
    assert _digests() == before
    out = tmp_path / "w" / "results"  # the working folder: next to the checkpoints
    assert json.loads((out / "results.json").read_text())["preset"] == "tiny"
    assert f"Results: {out / 'results.json'} and {out / 'results.md'}" in capsys.readouterr().err


def test_write_results_never_publishes_another_preset(tmp_path: Path, capsys) -> None:
    before = _digests()
    with pytest.raises(SystemExit) as exit_info:
        main(["--preset", "tiny", "--only", "memory", "--write-results", "--workdir", str(tmp_path / "w")])
    assert exit_info.value.code == 2
    assert "never replaces" in capsys.readouterr().err
    assert _digests() == before
    assert not (tmp_path / "w").exists()  # refused before anything ran


def test_write_results_publishes_a_finished_real_run(tmp_path: Path, monkeypatch) -> None:
    # A stand-in benchmark, so that a run of the real preset takes no time; the publishing is real.
    published = tmp_path / "published"
    published.mkdir()
    monkeypatch.setattr(bench_main, "HERE", published)
    monkeypatch.setitem(BENCHMARKS, "standin", lambda ctx: Section("standin", 0, "Stand-in"))
    args = ["--only", "standin", "--quiet", "--workdir", str(tmp_path / "w")]
    assert main(args) == 0
    assert not list(published.iterdir())  # without --write-results nothing is published
    assert main([*args, "--write-results"]) == 0
    out = tmp_path / "w" / "results"
    for name in ("results.json", "results.md"):
        assert (published / name).read_bytes() == (out / name).read_bytes()


# --- the default model at full depth ------------------------------------------------------------------


def test_fullmodel_runs_on_tiny_and_is_not_in_the_default_set(tmp_path: Path) -> None:
    assert "fullmodel" in OPTIONAL
    assert (
        main(
            [
                "--preset",
                "tiny",
                "--only",
                "fullmodel",
                "--quiet",
                "--workdir",
                str(tmp_path / "w"),
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    (section,) = json.loads((tmp_path / "results.json").read_text())["sections"]
    assert [r["metric"] for r in section["rows"]] == ["decode tokens/s", "prefill tokens/s"]
    assert all(r["a_median"] > 0 and r["b_median"] > 0 for r in section["rows"])
    # The tiny preset stands in for the 30 layers (2) and the one 3b layer (2 as well).
    assert section["data"]["30 layers"]["layers"] == 2


def test_llama_cpp_managed_runs_on_tiny_and_is_not_in_the_default_set(tmp_path: Path) -> None:
    """Managed llama.cpp against MLX in-process on one Q4_0 file (benchmarks/llama_cpp_managed.py)."""
    assert "llamacpp" in OPTIONAL
    assert (
        main(
            [
                "--preset",
                "tiny",
                "--only",
                "llamacpp",
                "--quiet",
                "--workdir",
                str(tmp_path / "w"),
                "--out",
                str(tmp_path),
                "--reps",
                "1",
            ]
        )
        == 0
    )
    (section,) = json.loads((tmp_path / "results.json").read_text())["sections"]
    metrics = [r["metric"] for r in section["rows"]]
    assert metrics == ["decode tokens/s", "prefill tokens/s", "time to first token, cold"]
    assert all(r["a_median"] > 0 and r["b_median"] > 0 for r in section["rows"])
    assert list((tmp_path / "w").glob("*-Q4_0.gguf"))  # the one file both engines load


def test_structured_runs_on_tiny_and_is_not_in_the_default_set(tmp_path: Path) -> None:
    """A 10-field JSON schema against unconstrained decoding, side by side (benchmarks/structured.py)."""
    assert "structured" in OPTIONAL
    assert (
        main(
            [
                "--preset",
                "tiny",
                "--only",
                "structured",
                "--quiet",
                "--workdir",
                str(tmp_path / "w"),
                "--out",
                str(tmp_path),
                "--reps",
                "1",
                "--warmup",
                "0",
            ]
        )
        == 0
    )
    (section,) = json.loads((tmp_path / "results.json").read_text())["sections"]
    rows = [(r["metric"], r["b"], r["goal"]) for r in section["rows"]]
    assert rows == [
        ("decode tokens/s", "unconstrained", {"op": ">=", "value": 0.9}),
        ("time to first token", "unconstrained", {"op": "<=", "value": 1.2}),
        ("time to first token", "unconstrained", None),
    ]
    assert all(r["a_median"] > 0 and r["b_median"] > 0 for r in section["rows"])
    assert section["data"]["mask"]["median_us"] > 0 and section["data"]["finish_reasons"]


def test_evaluation_runs_on_tiny_and_is_not_in_the_default_set(tmp_path: Path) -> None:
    """Repository context against none on cross_file holes of a package no one here wrote, and the
    evaluation's cost (benchmarks/evaluation.py): a checkpoint trained for seconds, its rows well formed."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    assert "evaluation" in OPTIONAL
    args = ["--preset", "tiny", "--only", "evaluation", "--quiet", "--workdir", str(tmp_path / "w")]
    assert main([*args, "--out", str(tmp_path)]) == 0
    (section,) = json.loads((tmp_path / "results.json").read_text())["sections"]
    rows = [(r["metric"], r["a"], r["goal"]) for r in section["rows"]]
    holes = section["data"]["cost_tiny"]["holes"]
    assert rows == [
        ("cross_file exact match", "psm with repository context", None),
        ("cross_file exact match", "spm with repository context", None),
        (
            "seconds per hole",
            "the evaluation's own (cutting, post-processing, scoring)",
            {"op": "<=", "value": 0.05},
        ),
        (f"minutes for {holes} holes x 4 configurations", "the whole run (load, cut, complete, score)", None),
    ]
    effect = section["data"]["effect"]["pooled"]["with_context"]["psm"]["em"]
    assert effect["n"] == 4 and effect["low"] <= effect["diff"] <= effect["high"]
    cost = section["data"]["cost_wide"]
    assert cost["cut_per_hole_s"] > 0 and cost["score_per_hole_s"] > 0 and len(cost["model_per_hole_s"]) == 2
    assert section["data"]["cost_tiny"]["completions"] == 4 * section["data"]["cost_tiny"]["holes"]


def test_finetune_effect_names_a_model_folder_without_a_checkpoint(tmp_path: Path) -> None:
    """``--model`` takes a checkpoint's folder; one without config.json stops before any training."""
    from benchmarks import finetune_effect

    empty = tmp_path / "not-a-checkpoint"
    empty.mkdir()
    with pytest.raises(SystemExit, match=r"no config\.json there"):
        finetune_effect.main(["--model", str(empty), "--workdir", str(tmp_path / "work")])
    assert not (tmp_path / "work" / "adapter").exists()


def test_the_fim_copier_trains_on_holes_whose_answer_its_prompt_holds() -> None:
    """``fim_copier.copyable``: the answer's first line after the prefix's last characters, in a context
    file or elsewhere in the window; not after indentation alone, not when the prompt lacks it."""
    from benchmarks.fim_copier import copyable
    from langchain_starcoder.evaluation import Hole
    from langchain_starcoder.fim import ContextFile

    def hole(prefix: str, truth: str, suffix: str = "\n") -> Hole:
        return Hole("a.py", "cross_file", "python", prefix, suffix, truth)

    defining = ContextFile("b.py", "def get(url, params: QueryParams | None = None):\n")
    answer = "QueryParams | None = None):"
    assert copyable(hole("def put(url, params: ", answer), (defining,))
    assert not copyable(hole("def put(url, params: ", answer), ())
    assert copyable(hole("x = 1\ndef put(url, params: ", answer, "\n    params: " + answer + "\n"), ())
    assert not copyable(hole("def f():\n    ", answer), (defining,))  # after indentation alone
    assert not copyable(hole("def put(url, query: ", answer), (defining,))  # after another cue


def test_the_fim_copier_learns_to_look_up_what_a_rows_earlier_lines_predict() -> None:
    """``fim_copier.lookup_row``: every trained token follows, earlier in the row, the same ``CUE_TOKENS``
    tokens that precede it; lines come back whole and after other lines' starts."""
    import random

    from benchmarks.fim_copier import CUE_TOKENS, lookup_row

    rng = random.Random(1)
    lines = [[rng.randrange(10, 1000) for _ in range(rng.randrange(6, 20))] + [5] for _ in range(50)]
    ids, mask = lookup_row(lines, 512, rng)
    assert len(ids) == 513 and len(mask) == 512
    trained = [k + 1 for k, m in enumerate(mask) if m]
    assert 50 < len(trained) < 400
    for j in trained:
        seen = ids[j - CUE_TOKENS : j + 1]
        assert any(ids[i : i + CUE_TOKENS + 1] == seen for i in range(j - CUE_TOKENS)), j
