"""Our EM, ES, identifier EM and F1 equal CrossCodeEval's own code's on the same predictions.

Their ``scripts/eval_utils.py`` and ``scripts/eval_metric.py`` are vendored verbatim in
tests/data/cceval_reference (README there: commit, what is stubbed); ``compute_metric_stmt``, their whole
scoring of a prediction file, runs here on the predictions this test writes.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import random
import re
import sys
import types
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tree_sitter
import tree_sitter_language_pack as pack

from langchain_starcoder.evaluation import cceval_truncate, score
from langchain_starcoder.evaluation.metrics import edit_similarity, identifiers, keywords, remove_comments

REFERENCE = Path(__file__).parents[1] / "data" / "cceval_reference"
ROOT = Path(__file__).parents[2]
CCEVAL_LANGUAGES = ("python", "java", "csharp", "typescript", "javascript")


class _Parser:
    """py-tree-sitter < 0.22's Parser (``set_language``), which their code calls."""

    def __init__(self) -> None:
        self._parser = tree_sitter.Parser()

    def set_language(self, language: Any) -> None:
        self._parser.language = language

    def parse(self, code: bytes) -> Any:
        return self._parser.parse(code)


class _SerialPool:
    def __init__(self, *_: Any) -> None:
        pass

    def imap_unordered(self, worker: Any, items: Any) -> Any:
        return map(worker, items)


def _stub(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


@contextlib.contextmanager
def load_reference() -> Iterator[Any]:
    """Their eval_metric module (eval_utils and keywords with it), imported from the vendored files;
    what it changed in sys.modules and sys.path is put back after."""
    mp = pytest.MonkeyPatch()
    tokenizer = _stub("sacrebleu.tokenizers.tokenizer_intl", TokenizerV14International=lambda: None)
    stubs = {
        # A wall-clock limit on a parse (SIGALRM, which pytest-timeout uses too): no effect on a value.
        "timeout_decorator": _stub("timeout_decorator", timeout=lambda seconds: lambda f: f),
        # Only their tokenize_string uses it, no metric.
        "sacrebleu": _stub("sacrebleu"),
        "sacrebleu.tokenizers": _stub("sacrebleu.tokenizers"),
        "sacrebleu.tokenizers.tokenizer_intl": tokenizer,
        # fuzzywuzzy as CrossCodeEval's requirements.txt installs it: without python-Levenshtein.
        "Levenshtein": None,
    }
    for name, module in stubs.items():
        mp.setitem(sys.modules, name, module)
    for name in [n for n in sys.modules if n.split(".")[0] in ("fuzzywuzzy", "eval_utils", "eval_metric")]:
        mp.delitem(sys.modules, name)
    mp.syspath_prepend(str(REFERENCE))
    try:
        with pytest.warns(UserWarning, match="SequenceMatcher"):  # theirs, on difflib
            module = importlib.import_module("eval_metric")
        assert importlib.import_module("fuzzywuzzy.fuzz").SequenceMatcher.__module__ == "difflib"
        language = {"c_sharp": "csharp"}
        mp.setattr(module, "Language", lambda lib, name: pack.get_language(language.get(name, name)))
        mp.setattr(module, "Parser", _Parser)
        mp.setattr(module, "mp", Namespace(Pool=_SerialPool, cpu_count=lambda: 2))
        yield module
    finally:
        for name in ("eval_metric", "eval_utils", "keywords", "keywords.keywordlist"):
            sys.modules.pop(name, None)
        mp.undo()


@pytest.fixture(scope="module")
def reference() -> Iterator[Any]:
    with load_reference() as module:
        yield module


def _run_reference(reference: Any, tmp_path: Path, language: str, cases: list[dict]) -> dict[str, dict]:
    """Their compute_metric_stmt on ``cases``: per task id, their detailed result and truncated prediction."""
    out = tmp_path / language
    out.mkdir()
    prompts = out / "prompts.jsonl"
    with prompts.open("w") as f:
        for c in cases:
            example = {"prompt": c["prompt"], "groundtruth": c["truth"], "metadata": {"task_id": c["id"]}}
            f.write(json.dumps(example) + "\n")
    with (out / "prediction.jsonl").open("w") as f:
        for c in cases:
            f.write(json.dumps({"task_id": c["id"], "pred": c["pred"]}) + "\n")
    args = Namespace(output_dir=str(out), prompt_file=str(prompts), ts_lib="", language=language)
    reference.compute_metric_stmt(args)
    found = {}
    with (out / "detailed_results.json").open() as f:
        for line in f:
            found[json.loads(line)["task_id"]] = json.loads(line)
    with (out / "prediction_truncated.jsonl").open() as f:
        for line in f:
            row = json.loads(line)
            found[row["task_id"]]["pred"] = row["pred"]
    return found


# --- predictions: truths cut from real code, each answered in many ways -------------------------

_JAVA = """\
package demo.store;

import java.util.HashMap;
import java.util.Map;

public class Inventory {
    private final Map<String, Integer> counts = new HashMap<>();

    public void add(String item, int quantity) {
        if (quantity <= 0) {
            throw new IllegalArgumentException("quantity must be positive: " + quantity);
        }
        counts.merge(item, quantity, Integer::sum);
    }

    public int count(String item) {
        return counts.getOrDefault(item, 0); // none yet
    }

    public boolean remove(String item, int quantity) {
        int have = count(item);
        if (have < quantity) { return false; }
        counts.put(item, have - quantity);
        return true;
    }
}
"""
_CSHARP = """\
using System;
using System.Collections.Generic;

namespace Demo.Store
{
    public class Ledger
    {
        private readonly List<decimal> entries = new List<decimal>();

        public void Record(decimal amount, string memo)
        {
            if (string.IsNullOrEmpty(memo)) { throw new ArgumentException("memo is required"); }
            entries.Add(amount);
            Console.WriteLine($"recorded {amount} for {memo}"); // log it
        }

        public decimal Balance()
        {
            decimal total = 0m;
            foreach (var entry in entries) { total += entry; }
            return total;
        }
    }
}
"""


def _sources() -> dict[str, list[str]]:
    """Real code per language: this repository's Python and TypeScript, and a Java and a C# file."""
    python = sorted((ROOT / "langchain_starcoder" / "evaluation").glob("*.py"))
    python += sorted((ROOT / "langchain_starcoder" / "repo").glob("*.py"))
    typescript = sorted((ROOT / "labextension" / "src").glob("*.ts"))
    return {
        "python": [p.read_text(encoding="utf-8") for p in python],
        "typescript": [p.read_text(encoding="utf-8") for p in typescript],
        "java": [_JAVA],
        "csharp": [_CSHARP],
    }


def _holes(texts: list[str], rng: random.Random, n: int) -> list[tuple[str, str, str]]:
    """``n`` (prompt, truth, next lines) from ``texts``: the rest of a line from a token boundary, the
    prompt from the last unindented line before it (a whole statement to parse, as a file's start)."""
    spots = [
        (lines, i) for lines in (t.split("\n") for t in texts) for i, line in enumerate(lines) if line.strip()
    ]
    holes = []
    for lines, i in rng.sample(spots, n):
        line = lines[i]
        starts = [m.start() for m in re.finditer(r"\b\w|[^\w\s]", line)]
        at = rng.choice(starts)
        top = max((k for k in range(max(0, i - 12), i) if lines[k][:1].strip()), default=max(0, i - 12))
        prompt = "\n".join(lines[top:i]) + ("\n" if i > top else "") + line[:at]
        holes.append((prompt, line[at:], "\n".join(lines[i + 1 : i + 4])))
    return holes


def _answers(truth: str, after: str, other: str, rng: random.Random) -> list[str]:
    """Ways a model answers: right, empty, over-long, re-spaced, comments only or added, cut, renamed."""
    words = re.findall(r"[A-Za-z_]\w*", truth)
    renamed = truth.replace(words[0], words[0] + "2", 1) if words else truth + "x"
    half = truth[: max(1, len(truth) // 2)]
    return [
        truth,
        "",
        "   \n\t\n",
        truth + "\n" + after,
        "  " + truth.replace(" ", "  ") + " \t\n\n",
        "\n\n" + truth + "\n\n" + after.replace("\n", "\n\n"),
        "# " + truth,
        "// " + truth + "\n// more",
        truth + "  # why" if rng.random() < 0.5 else truth + " // why",
        half,
        renamed,
        other,
        truth.replace('"', "'").replace("(", "( ", 1),
        after or truth[::-1],
    ]


def _cases() -> dict[str, list[dict]]:
    rng = random.Random(40)
    cases: dict[str, list[dict]] = {}
    per_language = {"python": 24, "typescript": 16, "java": 10, "csharp": 8}
    for language, texts in _sources().items():
        holes = _holes(texts, rng, per_language[language])
        truths = [t for _, t, _ in holes]
        rows = cases[language] = []
        for k, (prompt, truth, after) in enumerate(holes):
            for j, pred in enumerate(_answers(truth, after, rng.choice(truths), rng)):
                rows.append({"id": f"{language}/{k}/{j}", "prompt": prompt, "truth": truth, "pred": pred})
    return cases


def _same_words(text: str) -> bool:
    """Whether nltk's installed tokenizer reads ``\\w+`` as stdlib ``re`` does (nltk < 3.10, as
    CrossCodeEval ran it) on this text: 3.10's ``regex`` engine differs on rare characters."""
    from nltk.tokenize import RegexpTokenizer

    return RegexpTokenizer(r"\w+").tokenize(text) == re.findall(r"\w+", text)


@pytest.mark.parametrize("truncate", [True, False], ids=["their-postprocessing", "as-is"])
def test_scores_equal_crosscodeevals_own_code(reference: Any, tmp_path: Path, monkeypatch, truncate) -> None:
    """>= 500 predictions in Python, TypeScript, Java and C#: their compute_metric_stmt and ours agree
    to 1e-9 on EM, ES, identifier EM and F1, and (their post-processing on) on the text they score."""
    if not truncate:  # their scoring of the completion as it stands: our prediction is what is scored
        monkeypatch.setattr(reference, "postprocess_code_lines", lambda prompt, pred, parser, lang: pred)
    total = 0
    kinds = {"em": set(), "id_em": set(), "empty": 0, "partial_es": 0}
    for language, cases in _cases().items():
        cases = [c for c in cases if _same_words(c["pred"] + c["truth"])]
        theirs = _run_reference(reference, tmp_path, language, cases)
        for c in cases:
            pred = cceval_truncate(c["prompt"], c["pred"], language) if truncate else c["pred"]
            ours, want = score(pred, c["truth"], language), theirs[c["id"]]
            assert remove_comments(pred) == want["pred"], c  # the text they score
            for name in ("em", "es", "id_em", "id_f1"):
                assert abs(getattr(ours, name) - want[name]) <= 1e-9, (name, c, ours, want)
            kinds["em"].add(ours.em)
            kinds["id_em"].add(ours.id_em)
            kinds["empty"] += not c["pred"].strip()
            kinds["partial_es"] += 0 < ours.es < 100
        total += len(cases)
    assert total >= 500
    # The predictions reach every branch: matches and misses, empty ones, partial similarity.
    assert kinds["em"] == {0, 1} and kinds["id_em"] == {0, 1}
    assert kinds["empty"] >= 50 and kinds["partial_es"] >= 100


def test_their_postprocessing_cuts_statements(reference: Any) -> None:
    """cceval_truncate cuts as theirs does, and the cases cut at all: Python's first statement, the
    bracket languages' first ``;{}`` (one at index 0 keeps everything), other languages unchanged."""
    parser = _Parser()
    parser.set_language(pack.get_language("python"))
    cases = [
        ("python", "x = 1\n", "y = x + 1\nz = 2\n", "y = x + 1"),
        ("python", "def f(a):\n    ", "return a\n    b = 2", "return a"),
        ("python", "x = (", "1,\n 2)\nprint(x)", "1,\n 2)"),
        ("python", "", "y = 1", "y = 1"),  # the end of text: their IndexError keeps it whole
        ("java", "", "a.b(c);\n d();", "a.b(c);"),
        ("csharp", "", "if (x) {\n y();\n}", "if (x) {"),
        ("typescript", "", ";rest();", ";rest();"),
        ("typescript", "", "no statement end", "no statement end"),
    ]
    for language, prompt, completion, want in cases:
        assert cceval_truncate(prompt, completion, language) == want
        assert reference.postprocess_code_lines(prompt, completion, parser, language) == want
    assert cceval_truncate("", "a;b", "go") == "a;b"


def test_keyword_lists_are_theirs(reference: Any) -> None:
    get_language_keywords = sys.modules["keywords.keywordlist"].get_language_keywords
    for language in CCEVAL_LANGUAGES:
        assert keywords(language) == get_language_keywords(language), language
    assert "self" not in keywords("python") and "True" not in keywords("python")
    assert {"func", "defer"} <= keywords("go") and {"fn", "impl"} <= keywords("rust")


def test_edge_cases_of_their_definitions() -> None:
    """What their code does at the edges, written out (each differs from a naive implementation)."""
    assert edit_similarity("", "") == 100.0  # equal before empty
    assert edit_similarity("x", "") == 0.0
    assert edit_similarity("  abc\n", "abc") == 100.0
    blank = score("", "", "python")
    assert (blank.em, blank.id_em, blank.id_f1) == (1, 1, 0)  # no identifiers: F1 0
    # Comments go wherever "#" or "//" stands, strings too; string literals never hold identifiers.
    assert score('url = "http://a"', 'url = "http:', "python").em == 1
    assert identifiers('f("name", x) + y_2 + 3d', "python") == ["f", "x", "y_2"]
    assert identifiers("def get(self): return None or True", "python") == ["get", "self", "True"]
    # Identifier EM keeps order and repeats; F1 takes sets.
    swapped = score("g(a, b)", "g(b, a)", "python")
    assert (swapped.id_em, swapped.id_f1) == (0, 1.0)


def test_words_as_crosscodeeval_read_them() -> None:
    """Rare characters are read as nltk read them with stdlib ``re`` (CrossCodeEval's nltk), not as
    nltk 3.10's ``regex`` engine: "x²" is one word, a combining mark splits one."""
    assert identifiers("x² + e\u0301t", "python") == ["x²", "e", "t"]
