"""EvalReport: figures per group, the paired bootstrap on known cases, JSON that the figures recompute
from, the Jupyter table, and CrossCodeEval's JSONL both ways (their scoring of our files included)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_evaluation_metrics import load_reference

from langchain_starcoder.errors import InvalidParameterError
from langchain_starcoder.evaluation import EvalReport, Hole, HoleRecord, cut_holes
from langchain_starcoder.evaluation.cceval import read_cceval, write_cceval, write_predictions
from langchain_starcoder.fim.request import ContextFile


@pytest.fixture(scope="module")
def cceval_reference() -> Iterator[Any]:
    with load_reference() as module:
        yield module


def _paired(diffs_a: list[float], diffs_b: list[float], metric: str = "es") -> EvalReport:
    """Configs "a" and "b" on the same holes, with ``metric`` set as given (others 0)."""
    records = []
    for config, values in (("a", diffs_a), ("b", diffs_b)):
        for k, v in enumerate(values):
            records.append(HoleRecord(f"t{k}", "f.py", "line", "python", config, "x", "x", **{metric: v}))
    return EvalReport(records)


@pytest.mark.parametrize(
    ("a", "want"),
    [
        # Resampling 3 holes: the mean of [0, 0, 3] is 3k/3 = k for k ~ Binomial(3, 1/3): P(k <= 2) =
        # 26/27 < 0.975, so the 97.5th percentile is 3; P(k = 0) = 8/27 > 0.025: the 2.5th is 0.
        ([0.0, 0.0, 3.0], (1.0, 0.0, 3.0)),
        # 4 holes, [0, 0, 0, 3]: k ~ Binomial(4, 1/4), P(k <= 2) = 0.949, P(k <= 3) = 0.996: 3 * 3/4.
        ([0.0, 0.0, 0.0, 3.0], (0.75, 0.0, 2.25)),
        # The same difference on every hole: no spread.
        ([2.0] * 50, (2.0, 2.0, 2.0)),
    ],
)
def test_bootstrap_interval_on_known_cases(a: list[float], want: tuple[float, float, float]) -> None:
    report = _paired(a, [0.0] * len(a))
    row = report.compare("a", "b", samples=20_000)["es"]
    assert (row.diff, row.low, row.high) == pytest.approx(want)
    assert row.n == len(a) and row.mean_a == pytest.approx(sum(a) / len(a)) and row.mean_b == 0


def test_bootstrap_interval_matches_the_normal_one_for_many_holes() -> None:
    """400 holes, "a" right on 100 more than "b": the interval of a mean of 0/1 differences is about
    p +- 1.96 sqrt(p (1 - p) / n) = 0.25 +- 0.042; significant. Swapped: the same, negated."""
    a = [1] * 100 + [0] * 300
    report = _paired(a, [0] * 400, metric="em")
    row = report.compare("a", "b")["em"]
    half = 1.96 * math.sqrt(0.25 * 0.75 / 400)
    assert row.diff == pytest.approx(0.25)
    assert row.low == pytest.approx(0.25 - half, abs=0.006) and row.high == pytest.approx(
        0.25 + half, abs=0.006
    )
    assert row.significant
    back = report.compare("b", "a")["em"]
    assert (back.diff, back.low, back.high) == pytest.approx((-row.diff, -row.high, -row.low), abs=0.006)
    assert report.compare("a", "b", seed=1)["em"].low != row.low  # the seed draws the resamples
    assert report.compare("a", "b")["em"] == row  # and the same seed the same


def test_only_holes_both_completed_are_paired() -> None:
    report = _paired([1.0, 1.0, 1.0], [0.0, 0.0, 0.0], metric="es")
    report.records[0].error = "timed out"  # a's t0: left out of the pair
    report.records.append(HoleRecord("t9", "f.py", "line", "python", "a", "x", "x", es=100.0))  # b lacks t9
    row = report.compare("a", "b")["es"]
    assert row.n == 2 and row.diff == 1.0
    with pytest.raises(InvalidParameterError, match="No configuration 'c'"):
        report.compare("a", "c")
    lonely = EvalReport([HoleRecord("t0", "f.py", "line", "python", "a", "x", "x")])
    lonely.records.append(HoleRecord("t1", "f.py", "line", "python", "b", "x", "x"))
    with pytest.raises(InvalidParameterError, match="No hole was completed under both"):
        lonely.compare("a", "b")


def _report() -> EvalReport:
    rows = [
        ("t1", "line", "python", "psm", "x = f(a)", "x = f(a)", 0.5),
        ("t1", "line", "python", "spm", "x = f(a)", "x = g(a)", 0.7),
        ("t2", "call", "go", "psm", "a, b", "a, c", 0.2),
        ("t2", "call", "go", "spm", "a, b", "a, b", None),
    ]
    records = [
        HoleRecord.scored(pred, truth, language, task_id=t, file="m.py", kind=kind, config=config, total_s=s)
        for t, kind, language, config, truth, pred, s in rows
    ]
    records.append(
        HoleRecord("t3", "m.py", "line", "python", "psm", "y", "", error="ConnectionError: refused")
    )
    return EvalReport(records, {"repo": "demo", "seed": 0})


def test_summary_per_config_kind_and_language() -> None:
    report = _report()
    by_config = {row["config"]: row for row in report.summary()}
    assert by_config["psm"]["n"] == 2 and by_config["psm"]["errors"] == 1
    assert by_config["psm"]["em"] == 0.5 and by_config["spm"]["em"] == 0.5
    assert by_config["psm"]["total_s"] == pytest.approx(0.35)
    assert by_config["spm"]["total_s"] == 0.7  # the hole without a time is left out of the mean
    assert by_config["psm"]["first_token_s"] is None
    by_kind = {(row["config"], row["kind"]): row for row in report.summary(("config", "kind"))}
    assert by_kind[("spm", "call")]["es"] == 100.0 and by_kind[("spm", "line")]["em"] == 0
    assert {row["language"] for row in report.summary("language")} == {"python", "go"}
    with pytest.raises(InvalidParameterError, match="record fields"):
        report.summary("colour")


def test_saved_json_recomputes_every_figure(tmp_path: Path) -> None:
    report = _report()
    report.save(tmp_path / "r.json")
    loaded = EvalReport.load(tmp_path / "r.json")
    assert loaded == report
    assert loaded.rescored().summary(("config", "kind")) == report.summary(("config", "kind"))
    # The figures come from prediction and truth: a score edited in the file is not believed.
    data = json.loads((tmp_path / "r.json").read_text())
    data["records"][0]["em"] = 0
    (tmp_path / "r.json").write_text(json.dumps(data))
    edited = EvalReport.load(tmp_path / "r.json")
    assert edited.records[0].em == 0 and edited.rescored().records[0].em == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "Cannot read"),
        ("not json", "Cannot read"),
        ('{"format": "other"}', "is not an evaluation report"),
        ('{"format": "langchain-starcoder-eval/1", "records": [{"file": "x"}]}', "malformed record"),
    ],
)
def test_loading_a_bad_file_is_a_clear_error(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InvalidParameterError, match=message):
        EvalReport.load(path)


def test_html_tables_per_config_kind_and_language() -> None:
    report = _report()
    report.records.append(HoleRecord("t1", "m.py", "line", "python", "<b>psm</b>", "x", "x", em=1))
    page = report._repr_html_()
    assert page.count("<table>") == 3
    assert "&lt;b&gt;psm&lt;/b&gt;" in page and "<b>psm" not in page
    assert "50.0%" in page  # EM as CrossCodeEval shows it
    comparison = report.compare("psm", "spm")._repr_html_()
    assert "psm − spm" in comparison and "95% interval" in comparison


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "util.py").write_text("def scale(v, k=2):\n    return v * k\n\n\nLIMIT = 3\n")
    (root / "pkg" / "app.py").write_text(
        "from pkg.util import scale, LIMIT\n\n\ndef run(xs):\n    total = sum(scale(x) for x in xs)\n"
        "    return min(total, LIMIT)  # capped\n"
    )
    return root


def test_crosscodeeval_jsonl_both_ways(tmp_path: Path) -> None:
    holes = cut_holes(_repo(tmp_path), n=12)
    holes.append(
        Hole(
            "a.py",
            "cross_file",
            "python",
            "x = ",
            "\n",
            "helper()",
            0,
            4,
            context=(ContextFile("b.py", "def helper(): ..."),),
        )
    )
    write_cceval(holes, tmp_path / "holes.jsonl", repository="demo")
    assert read_cceval(tmp_path / "holes.jsonl") == [
        Hole(
            h.file,
            "cross_file",
            h.language,
            h.prefix,
            h.suffix,
            h.truth,
            h.line,
            h.column,
            context=h.context,
            task_id=h.task_id,
        )
        for h in holes
    ]
    line = json.loads((tmp_path / "holes.jsonl").read_text().splitlines()[-1])
    assert line["crossfile_context"]["list"] == [
        {"retrieved_chunk": "def helper(): ...", "filename": "b.py", "score": 0.0}
    ]
    assert line["metadata"]["repository"] == "demo" and line["right_context"] == "\n"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{", "holes.jsonl:2 is not a CrossCodeEval example"),
        ('{"prompt": "x", "groundtruth": "y", "metadata": {"task_id": 1, "file": "a.unknown"}}', "language"),
        ('{"prompt": 1, "groundtruth": "y", "metadata": {"task_id": 1, "file": "a.py"}}', "must be strings"),
    ],
)
def test_reading_bad_crosscodeeval_lines_is_a_clear_error(tmp_path: Path, line: str, message: str) -> None:
    good = '{"prompt": "x = ", "groundtruth": "1", "metadata": {"task_id": "p/0", "file": "a.py"}}'
    (tmp_path / "holes.jsonl").write_text(good + "\n" + line + "\n")
    with pytest.raises(InvalidParameterError, match=message):
        read_cceval(tmp_path / "holes.jsonl")
    assert read_cceval(tmp_path / "holes.jsonl", language="python") if "language" in message else True


def test_their_script_scores_our_files_as_we_do(cceval_reference: Any, tmp_path: Path, monkeypatch) -> None:
    """Our holes written in their format and our predictions as their prediction.jsonl: their
    compute_metric_stmt (its post-processing off: our predictions are what we score) gives our scores."""
    reference = cceval_reference
    monkeypatch.setattr(reference, "postprocess_code_lines", lambda prompt, pred, parser, lang: pred)
    holes = cut_holes(_repo(tmp_path), n=15, seed=2)
    answers = ["", "scale(x)", "min(total, LIMIT)", "return v * k  # doubled", "xs"]
    records = [
        HoleRecord.scored(
            h.truth if k % 3 == 0 else answers[k % len(answers)],
            h.truth,
            h.language,
            task_id=h.task_id,
            file=h.file,
            kind=h.kind,
            config="psm",
        )
        for k, h in enumerate(holes)
    ]
    report = EvalReport(records)
    out = tmp_path / "python"
    out.mkdir()
    write_cceval(holes, out / "prompts.jsonl")
    write_predictions(report, "psm", out / "prediction.jsonl")
    from argparse import Namespace

    args = Namespace(
        output_dir=str(out), prompt_file=str(out / "prompts.jsonl"), ts_lib="", language="python"
    )
    reference.compute_metric_stmt(args)
    theirs = {}
    for line in (out / "detailed_results.json").read_text().splitlines():
        theirs[json.loads(line)["task_id"]] = json.loads(line)
    assert len(theirs) == len(records) == 15
    for r in records:
        for name in ("em", "es", "id_em", "id_f1"):
            assert abs(getattr(r, name) - theirs[r.task_id][name]) <= 1e-9
    assert {r.em for r in records} == {0, 1}


def test_pass_at_1_on_the_judged_holes_only(tmp_path: Path) -> None:
    """pass@1: the mean of ``passed`` over the judged predictions; compared on the holes judged under
    both (a hole whose true middle fails is judged under neither), with the bootstrap of the others."""
    report = _paired([0.0] * 5, [0.0] * 5)
    verdicts = {"a": [True, False, True, None, None], "b": [False, False, True, None, None]}
    for r in report.records:
        r.passed = verdicts[r.config][int(r.task_id[1:])]
        r.exec_status = {True: "passed", False: "failed", None: "truth fails"}[r.passed]
    means = {row["config"]: row["pass@1"] for row in report.summary()}
    assert means == {"a": pytest.approx(2 / 3), "b": pytest.approx(1 / 3)}
    # 3 judged pairs, differences [1, 0, 0]: as the known case [0, 0, 3] above, divided by 3.
    row = report.compare("a", "b", samples=20_000)["pass@1"]
    assert (row.n, row.diff, row.low, row.high) == pytest.approx((3, 1 / 3, 0.0, 1.0))
    assert report.compare("a", "b")["es"].n == 5  # the other metrics pair every hole
    report.save(tmp_path / "r.json")
    loaded = EvalReport.load(tmp_path / "r.json")
    assert loaded == report and loaded.compare("a", "b", samples=20_000)["pass@1"] == row
    assert "<th>pass@1</th>" in report._repr_html_() and "66.7%" in report._repr_html_()
    unjudged = _paired([0.0], [0.0])
    assert unjudged.summary()[0]["pass@1"] is None
    assert "pass@1" not in {d.metric for d in unjudged.compare("a", "b").rows}
    assert "pass@1" not in unjudged._repr_html_()


def test_combined_reports_pair_runs_hole_by_hole() -> None:
    def run(ems: list[int]) -> EvalReport:  # one configuration, "psm", on holes t0, t1, t2
        return EvalReport(
            [
                HoleRecord(f"t{k}", "f.py", "line", "python", "psm", "x", "x", em=em)
                for k, em in enumerate(ems)
            ]
        )

    both = EvalReport.combined({"base": run([0, 1, 0]), "adapter": run([1, 1, 1])})
    assert both.configs == ["base", "adapter"]  # a run of one configuration is named after the run
    row = both.compare("adapter", "base")["em"]
    assert (row.n, row.mean_a, row.mean_b) == (3, 1.0, pytest.approx(1 / 3))
    several = EvalReport.combined({"x": _report(), "y": _report()})  # several configurations: name:config
    assert several.configs == ["x:psm", "x:spm", "y:psm", "y:spm"]
    assert several.compare("y:spm", "x:spm")["es"].diff == 0.0
    assert set(several.metadata["combined"]) == {"x", "y"}


def test_combining_other_holes_is_a_clear_error() -> None:
    one = _report()
    other = EvalReport([dataclasses.replace(r, truth=r.truth + "!") for r in one.records])
    with pytest.raises(InvalidParameterError, match="another true middle in 'b'"):
        EvalReport.combined({"a": one, "b": other})
    moved = EvalReport([dataclasses.replace(r, task_id=r.task_id + "x") for r in one.records])
    with pytest.raises(InvalidParameterError, match="share no hole"):
        EvalReport.combined({"a": one, "b": moved})
    with pytest.raises(InvalidParameterError, match="two reports or more"):
        EvalReport.combined({"a": one})
