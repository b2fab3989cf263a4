"""CrossCodeEval's JSONL: read its holes (a user with its data runs it through our paths), write ours in
that format and our predictions as its ``prediction.jsonl`` (its scripts score them).

A line of theirs: ``{"prompt", "groundtruth", "right_context", "metadata": {"task_id", "repository",
"file", "context_start_lineno", "groundtruth_start_lineno", "right_context_start_lineno"},
"crossfile_context": {"text", "list": [{"retrieved_chunk", "filename", "score"}]}}``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import InvalidParameterError
from ..fim.request import ContextFile
from ..repo.symbols import LANGUAGES, language_of
from .holes import Hole
from .report import EvalReport


def read_cceval(path: str | os.PathLike[str], *, language: str | None = None) -> list[Hole]:
    """The holes of a CrossCodeEval JSONL file (kind ``cross_file``; their retrieved chunks as each
    hole's context). ``language``: all its holes' (its files are one language each); by default each
    hole's file ending says."""
    if language is not None and language not in set(LANGUAGES.values()):
        msg = f"language must be one of {', '.join(sorted(set(LANGUAGES.values())))}, not {language!r}."
        raise InvalidParameterError(msg)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"Cannot read CrossCodeEval data from {str(path)!r}: {exc}"
        raise InvalidParameterError(msg) from exc
    holes = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            holes.append(_hole(json.loads(line), language))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            msg = f"{path}:{number} is not a CrossCodeEval example ({type(exc).__name__}: {exc})."
            raise InvalidParameterError(msg) from exc
    return holes


def _hole(example: dict[str, Any], language: str | None) -> Hole:
    meta = example["metadata"]
    file = str(meta.get("file", ""))
    language = language or language_of(file)
    if language is None:
        msg = f"the language of {file!r} is unknown: pass language="
        raise ValueError(msg)
    prompt, truth = example["prompt"], example["groundtruth"]
    if not isinstance(prompt, str) or not isinstance(truth, str):
        msg = "prompt and groundtruth must be strings"
        raise TypeError(msg)
    context = example.get("crossfile_context") or {}
    chunks = tuple(
        ContextFile(str(c.get("filename", "")), str(c["retrieved_chunk"])) for c in context.get("list") or ()
    )
    return Hole(
        file=file,
        kind="cross_file",
        language=language,
        prefix=prompt,
        suffix=str(example.get("right_context") or ""),
        truth=truth,
        line=int(meta.get("groundtruth_start_lineno", prompt.count("\n"))),
        column=len(prompt) - prompt.rfind("\n") - 1,
        context=chunks,
        task_id=str(meta["task_id"]),
    )


def write_cceval(holes: Iterable[Hole], path: str | os.PathLike[str], *, repository: str = "") -> None:
    """``holes`` as CrossCodeEval's JSONL (their ``--prompt_file``; the task id is the hole's)."""
    with Path(path).open("w", encoding="utf-8") as f:
        for h in holes:
            example = {
                "prompt": h.prefix,
                "groundtruth": h.truth,
                "right_context": h.suffix,
                "metadata": {
                    "task_id": h.task_id,
                    "repository": repository,
                    "file": h.file,
                    "context_start_lineno": 0,
                    "groundtruth_start_lineno": h.line,
                    "right_context_start_lineno": h.line + h.truth.count("\n"),
                },
                "crossfile_context": {
                    "text": "\n".join(c.text for c in h.context),
                    "list": [
                        {"retrieved_chunk": c.text, "filename": c.path, "score": 0.0} for c in h.context
                    ],
                },
            }
            f.write(json.dumps(example, ensure_ascii=False) + "\n")


def write_predictions(report: EvalReport, config: str, path: str | os.PathLike[str]) -> None:
    """A configuration's predictions as CrossCodeEval's ``prediction.jsonl`` (``task_id``, ``pred``);
    a hole without a completion gets an empty one (their script wants one per example)."""
    if config not in report.configs:
        msg = f"No configuration {config!r} in this report; it has {', '.join(report.configs) or 'none'}."
        raise InvalidParameterError(msg)
    with Path(path).open("w", encoding="utf-8") as f:
        for r in report.records:
            if r.config == config:
                pred = r.prediction if r.error is None else ""
                f.write(json.dumps({"task_id": r.task_id, "pred": pred}, ensure_ascii=False) + "\n")
