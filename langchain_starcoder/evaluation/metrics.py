"""A completion's scores against the true middle, computed as CrossCodeEval's reference code computes them.

amazon-science/cceval (``scripts/eval_utils.py``, ``scripts/eval_metric.py`` at 25f9cab7): comments are cut
from both texts by two regular expressions (``#...`` and ``//...`` to the line's end, in strings too);
exact match compares the non-blank lines, stripped; edit similarity is fuzzywuzzy's ``fuzz.ratio`` of the
stripped texts, as their ``requirements.txt`` installs it (without python-Levenshtein:
``difflib.SequenceMatcher``, rounded to an integer); identifiers are the ``\\w+`` words of the text
without its string literals that start like a name and are not the language's keywords, matched exactly
(same list) and by F1 (sets). ``tests/unit/test_evaluation_metrics.py`` runs their code on the same
predictions and asserts equal values.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidParameterError
from .keywords import CCEVAL, DPU_UTILS, PYTHON

_COMMENTS = (re.compile(r"#.*"), re.compile(r"//.*"))
_STRINGS = re.compile(r'"([^"\\]*(\\.[^"\\]*)*)"|\'([^\'\\]*(\\.[^\'\\]*)*)\'')
# nltk's RegexpTokenizer(r"\w+") as CrossCodeEval used it (nltk < 3.10 compiled with ``re``; 3.10's
# ``regex`` engine reads \w a little differently on rare characters: combining marks, "²", "½").
_WORDS = re.compile(r"\w+", re.UNICODE | re.MULTILINE | re.DOTALL)
_IDENTIFIER = re.compile("[_a-zA-Z][_a-zA-Z0-9]*")
#: The languages whose statement CrossCodeEval's post-processing cuts (:func:`cceval_truncate`).
_BRACKET_LANGUAGES = ("java", "csharp", "typescript")


@dataclass(frozen=True)
class Scores:
    """One completion's scores, on CrossCodeEval's scales: ``em`` 1 if the non-blank lines, comments cut
    and stripped, are the same, else 0; ``es`` the edit similarity, 0 to 100 (an integer value); ``id_em``
    1 if the identifiers are the same, in the same order, else 0; ``id_f1`` the F1 of the sets of
    identifiers, 0 to 1 (0 when neither has any)."""

    em: int
    es: float
    id_em: int
    id_f1: float


def remove_comments(code: str) -> str:
    """``code`` without ``#`` and ``//`` comments, as CrossCodeEval cuts them (in strings too)."""
    for comment in _COMMENTS:
        code = comment.sub("", code)
    return code


def edit_similarity(prediction: str, truth: str) -> float:
    """fuzzywuzzy's ``fuzz.ratio`` (difflib) of the stripped texts: 0 to 100, rounded to an integer."""
    a, b = prediction.strip(), truth.strip()
    if a == b:
        return 100.0
    if not a or not b:
        return 0.0
    return float(round(100 * difflib.SequenceMatcher(None, a, b).ratio()))  # round half to even


@functools.cache
def keywords(language: str) -> frozenset[str]:
    """The words identifier matching leaves out for ``language`` (a tree-sitter-language-pack name).

    CrossCodeEval's lists for Python, Java, C#, JavaScript and TypeScript (TSX too), dpu-utils' (which
    theirs come from) for C, C++, Go, PHP and Ruby; for another language the keywords its tree-sitter
    grammar names (words it parses as tokens of their own: an approximation, no list to match).
    """
    language = language.lower()
    if language == "python":
        return PYTHON
    language = {"tsx": "typescript", "c_sharp": "csharp"}.get(language, language)
    found = CCEVAL.get(language, DPU_UTILS.get(language))
    if found is not None:
        return found
    return _grammar_keywords(language)


def _grammar_keywords(language: str) -> frozenset[str]:
    try:
        import tree_sitter_language_pack as pack

        grammar: Any = pack.get_language(language)  # type: ignore[arg-type]
    except Exception as exc:  # the pack names the languages it has
        msg = f"No keyword list or tree-sitter grammar for language {language!r}: {exc}"
        raise InvalidParameterError(msg) from exc
    kinds = (grammar.node_kind_for_id(i) for i in range(grammar.node_kind_count) if _is_token(grammar, i))
    return frozenset(k for k in kinds if k and _IDENTIFIER.fullmatch(k))


def _is_token(grammar: Any, kind: int) -> bool:
    return not grammar.node_kind_is_named(kind) and grammar.node_kind_is_visible(kind)


def identifiers(code: str, language: str) -> list[str]:
    """The identifiers of ``code`` in order, repeats kept: CrossCodeEval's ``extract_identifiers``."""
    words = keywords(language)
    return [t for t in _WORDS.findall(_STRINGS.sub("", code)) if _IDENTIFIER.match(t) and t not in words]


def score(prediction: str, truth: str, language: str) -> Scores:
    """``prediction``'s scores against ``truth`` (both as they stand: run :func:`cceval_truncate` first
    to score a left-to-right completion as CrossCodeEval does)."""
    prediction, truth = remove_comments(prediction), remove_comments(truth)
    em = int(_lines(prediction) == _lines(truth))
    predicted, true = identifiers(prediction, language), identifiers(truth, language)
    return Scores(em, edit_similarity(prediction, truth), int(predicted == true), _f1(predicted, true))


def _lines(code: str) -> list[str]:
    return [line.strip() for line in code.split("\n") if line.strip()]


def _f1(predicted: list[str], true: list[str]) -> float:
    found, wanted = set(predicted), set(true)
    tp = len(found & wanted)
    wrong = len(found - wanted) + len(wanted - found)
    return 2 * tp / (2 * tp + wrong) if tp or wrong else 0


def cceval_truncate(prompt: str, completion: str, language: str) -> str:
    """CrossCodeEval's post-processing of a left-to-right completion (``postprocess_code_lines``): for
    Java, C# and TypeScript up to the first ``;``, ``{`` or ``}`` (kept; one at index 0 keeps all, as
    theirs does), for Python its first statement (the shortest start after which ``prompt`` plus it
    parses without an error node and a newline follows); other languages unchanged."""
    try:
        if language in _BRACKET_LANGUAGES:
            end = next((i for i, c in enumerate(completion) if c in ";}{"), None)
            return completion[: end + 1] if end else completion
        if language == "python":
            return _python_statement(prompt, completion)
    except Exception:  # theirs keeps the completion whole on any failure (the end of text reached)
        return completion
    return completion


def _python_statement(prompt: str, completion: str) -> str:
    parser = _python_parser()
    for i in range(len(completion) - 1):
        # theirs stops only where a newline follows: parse only there (once per line, not per character)
        if completion[i + 1] != "\n":
            continue
        if not _has_error(parser.parse((prompt + completion[: i + 1]).encode("utf8")).root_node):
            return completion[: i + 1].rstrip()
    return completion


@functools.cache
def _python_parser() -> Any:
    import tree_sitter_language_pack as pack

    return pack.get_parser("python")


def _has_error(root: Any) -> bool:
    """Whether any node of the tree is an ERROR node (a MISSING one is not, as in theirs)."""
    if not root.has_error:  # neither kind anywhere: no walk
        return False
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "ERROR":
            return True
        stack.extend(node.children)
    return False
