"""The benchmark harness runs end to end on tiny checkpoints and writes well-formed results.

These check structure, not speed: timings on a shared CI machine mean nothing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.__main__ import main
from benchmarks.cases import BENCHMARKS, OPTIONAL
from benchmarks.harness import Row, interleave, markdown_table, rate_from_marks


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, str]:
    out = tmp_path_factory.mktemp("bench")
    code = main(
        [
            "--preset", "tiny", "--no-openblas", "--quiet", "--warmup", "0",
            "--workdir", str(out / "work"), "--json", str(out / "r.json"), "--markdown", str(out / "r.md"),
        ]
    )  # fmt: skip
    return code, json.loads((out / "r.json").read_text()), (out / "r.md").read_text()


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
        "overhead", "dtype", "cache", "batch", "memory", "longctx",
    }  # fmt: skip
    for row in rows:
        for key in ("a_median", "b_median", "ratio"):
            assert isinstance(row[key], float) and math.isfinite(row[key]) and row[key] > 0, (
                row["title"],
                key,
            )
        assert row["a_min"] <= row["a_median"] <= row["a_max"]
        assert row["ratio"] == pytest.approx(row["a_median"] / row["b_median"])
        assert row["met"] is None if row["goal"] is None else isinstance(row["met"], bool)
    assert {r["item"] for r in rows} == {1, 2, 3, 5, 6, 7}
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


def test_only_and_unknown_names(tmp_path: Path, tiny_path: Path) -> None:
    assert main(["--preset", "tiny", "--only", "memory", "--quiet", "--workdir", str(tmp_path / "w"),
                 "--json", str(tmp_path / "r.json"), "--markdown", str(tmp_path / "r.md")]) == 0  # fmt: skip
    data = json.loads((tmp_path / "r.json").read_text())
    assert [s["key"] for s in data["sections"]] == ["memory"]
    with pytest.raises(SystemExit):
        main(["--only", "nonsense", "--json", str(tmp_path / "x.json")])


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


def _section(row: Row):
    from benchmarks.harness import Section

    return Section("x", row.item, "x", rows=[row])


def test_baselines_against_transformers_on_tiny(tmp_path: Path) -> None:
    code = main(["--preset", "tiny", "--only", "baselines", "--no-openblas", "--quiet", "--warmup", "0",
                 "--workdir", str(tmp_path / "w"), "--json", str(tmp_path / "r.json"),
                 "--markdown", str(tmp_path / "r.md")])  # fmt: skip
    assert code == 0
    (section,) = json.loads((tmp_path / "r.json").read_text())["sections"]
    assert [r["metric"] for r in section["rows"]] == ["float32 prefill tokens/s", "float32 decode tokens/s"]
    assert all(r["ratio"] > 0 for r in section["rows"])
    assert section["data"]["bandwidth_gbs"] > 0 and section["data"]["roofline_tps"] > 0
