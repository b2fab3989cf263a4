"""An evaluation's results: one record per hole and configuration, figures per configuration, hole kind and
language, paired comparisons with bootstrap intervals, a Jupyter table, and a JSON file they recompute from.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidParameterError
from .metrics import score

#: The scores of a completion (CrossCodeEval's): exact match, edit similarity, identifier EM and F1.
METRICS = ("em", "es", "id_em", "id_f1")
#: What the runner measures besides: whether the completion ended where the true middle ends, time to
#: the first token and to the end, tokens of the prompt, of it served from cache, and generated.
MEASURES = ("ended", "first_token_s", "total_s", "prompt_tokens", "cached_tokens", "completion_tokens")
#: The share of judged predictions that pass ``--exec``'s command (the mean of the records' ``passed``).
PASS_AT_1 = "pass@1"
#: Shown as percentages (0 to 1 in the records).
PERCENT = frozenset({"em", "id_em", "id_f1", "ended", PASS_AT_1})
FORMAT = "langchain-starcoder-eval/1"
#: Bootstrap resamples drawn at a time (memory: this many times the holes, in int64).
_BATCH = 1000


@dataclass
class HoleRecord:
    """One hole completed under one configuration, and its scores."""

    task_id: str
    file: str
    kind: str
    language: str
    config: str
    truth: str
    prediction: str
    """The text scored (after any post-processing: CrossCodeEval's, for ``line`` and ``cross_file``)."""
    em: int = 0
    es: float = 0.0
    id_em: int = 0
    id_f1: float = 0.0
    line: int = 0
    identifier: str | None = None
    ended: bool | None = None
    """Whether the completion ended where the true middle ends (None: not measured)."""
    first_token_s: float | None = None
    total_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    raw: str | None = None
    """The completion as generated, before post-processing (None: not kept)."""
    passed: bool | None = None
    """Whether ``--exec``'s command passed with the prediction in place (None: not judged)."""
    exec_status: str | None = None
    """How that run ended: ``passed``, ``failed``, ``timed out``, or why the hole was not judged
    (``truth fails``, ``truth timed out``: the command does not pass with the true middle either;
    ``not run: ...``: its file is not in the repository)."""
    exec_s: float | None = None
    """Seconds the command ran with the prediction in place."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The prompt settings it was completed with (FIM mode, end rule, context budget...)."""
    error: str | None = None
    """Why it has no completion (then its scores are left out of every figure)."""

    @classmethod
    def scored(cls, prediction: str, truth: str, language: str, **fields: Any) -> HoleRecord:
        """A record with ``prediction``'s scores against ``truth``."""
        s = score(prediction, truth, language)
        return cls(prediction=prediction, truth=truth, language=language, **dataclasses.asdict(s), **fields)


@dataclass(frozen=True)
class Difference:
    """One metric of a paired comparison: ``a`` minus ``b`` on the holes both completed."""

    metric: str
    n: int
    mean_a: float
    mean_b: float
    diff: float
    low: float
    """The paired bootstrap's 95% interval of ``diff``: its 2.5th percentile..."""
    high: float
    """... and its 97.5th."""

    @property
    def significant(self) -> bool:
        """Whether the interval leaves out 0."""
        return self.low > 0 or self.high < 0


@dataclass(frozen=True)
class Comparison:
    a: str
    b: str
    rows: tuple[Difference, ...]

    def __getitem__(self, metric: str) -> Difference:
        for row in self.rows:
            if row.metric == metric:
                return row
        raise KeyError(metric)

    def _repr_html_(self) -> str:
        head = ["metric", "n", self.a, self.b, f"{self.a} − {self.b}", "95% interval", ""]
        rows = [
            [
                r.metric,
                str(r.n),
                _shown(r.metric, r.mean_a),
                _shown(r.metric, r.mean_b),
                _shown(r.metric, r.diff, signed=True),
                f"[{_shown(r.metric, r.low, signed=True)}, {_shown(r.metric, r.high, signed=True)}]",
                "significant" if r.significant else "",
            ]
            for r in self.rows
        ]
        return _table(head, rows)


@dataclass
class EvalReport:
    """Per-hole records of an evaluation, with the figures that come from them."""

    records: list[HoleRecord] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    """How it was run: the repository, the target, the seed, the hole kinds..."""

    @property
    def configs(self) -> list[str]:
        """The configurations, in the order of their first record."""
        return list(dict.fromkeys(r.config for r in self.records))

    def summary(self, by: Sequence[str] | str = ("config",)) -> list[dict[str, Any]]:
        """Per group of records (by ``config``, ``kind``, ``language``, ``file``: any record field), the
        number of holes, of errors, the mean of every metric and measure (None where none has one), and
        ``pass@1``: the share of the judged predictions that pass ``--exec``'s command."""
        keys = (by,) if isinstance(by, str) else tuple(by)
        known = {f.name for f in dataclasses.fields(HoleRecord)}
        if not keys or any(k not in known for k in keys):
            msg = f"summary(by=...) takes record fields ({', '.join(sorted(known))}), not {by!r}."
            raise InvalidParameterError(msg)
        groups: dict[tuple, list[HoleRecord]] = {}
        for r in self.records:
            groups.setdefault(tuple(getattr(r, k) for k in keys), []).append(r)
        rows = []
        for values, records in groups.items():
            done = [r for r in records if r.error is None]
            row: dict[str, Any] = dict(zip(keys, values, strict=True))
            row.update(n=len(done), errors=len(records) - len(done))
            for name in METRICS + MEASURES:
                row[name] = _mean(getattr(r, name) for r in done)
            row[PASS_AT_1] = _mean(r.passed for r in done)
            rows.append(row)
        return rows

    def compare(self, a: str, b: str, *, samples: int = 10_000, seed: int = 0) -> Comparison:
        """``a`` against ``b`` on the holes both completed: per metric and measure, the mean
        difference ``a - b`` and its paired bootstrap 95% interval (``samples`` resamples of the holes,
        the same for every metric; deterministic for ``seed``); ``pass@1`` on the holes judged under both
        (with its own resamples: fewer holes)."""
        pairs = self._pairs(a, b)
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            msg = f"samples must be a positive integer, not {samples!r}."
            raise InvalidParameterError(msg)
        picks = _resamples(len(pairs), samples, seed)
        rows = []
        for name in METRICS + MEASURES:
            both = [(getattr(x, name), getattr(y, name)) for x, y in pairs]
            if any(u is None or v is None for u, v in both):
                continue  # measured for some holes only: a pairing of those would mislead
            rows.append(_difference(name, np.array(both, dtype=float), picks))
        judged = [(x.passed, y.passed) for x, y in pairs if x.passed is not None and y.passed is not None]
        if judged:
            values = np.array(judged, dtype=float)
            rows.append(_difference(PASS_AT_1, values, _resamples(len(judged), samples, seed)))
        return Comparison(a, b, tuple(rows))

    def _pairs(self, a: str, b: str) -> list[tuple[HoleRecord, HoleRecord]]:
        for name in (a, b):
            if name not in self.configs:
                msg = f"No configuration {name!r} in this report; it has {', '.join(self.configs) or 'none'}."
                raise InvalidParameterError(msg)
        of_b = {r.task_id: r for r in self.records if r.config == b and r.error is None}
        pairs = [
            (r, of_b[r.task_id])
            for r in self.records
            if r.config == a and r.error is None and r.task_id in of_b
        ]
        if not pairs:
            msg = f"No hole was completed under both {a!r} and {b!r}: nothing to compare."
            raise InvalidParameterError(msg)
        return pairs

    @classmethod
    def combined(cls, reports: Mapping[str, EvalReport]) -> EvalReport:
        """Several runs on the same holes as one report, each run's configurations named after it
        (``name``, or ``name:config`` for a run of several), so :meth:`compare` pairs them hole by hole:
        the base against the base with an adapter, one server against another. The same seed, kinds
        and files cut the same holes; a hole whose true middle differs between runs is refused."""
        if len(reports) < 2:
            msg = f"Combining takes two reports or more, not {len(reports)}."
            raise InvalidParameterError(msg)
        records, truths = [], {}
        for name, report in reports.items():
            several = len(report.configs) > 1
            for r in report.records:
                if truths.setdefault(r.task_id, r.truth) != r.truth:
                    msg = (
                        f"Hole {r.task_id} has another true middle in {name!r}: the reports were cut from "
                        "other files or settings. Run each with the same --seed, --kinds, --holes and "
                        "--since on the same files."
                    )
                    raise InvalidParameterError(msg)
                config = f"{name}:{r.config}" if several else name
                records.append(dataclasses.replace(r, config=config))
        seen = [{r.task_id for r in report.records} for report in reports.values()]
        if not set.intersection(*seen):
            msg = (
                "The reports share no hole: run each with the same --seed, --kinds and --holes on the same "
                "files."
            )
            raise InvalidParameterError(msg)
        return cls(records, {"combined": {name: r.metadata for name, r in reports.items()}})

    def rescored(self) -> EvalReport:
        """The same records with every score computed again from their prediction and truth."""
        records = [
            r if r.error is not None else _with_scores(r, score(r.prediction, r.truth, r.language))
            for r in self.records
        ]
        return EvalReport(records, dict(self.metadata))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the report as JSON: every record's prompt settings, prediction, truth and scores."""
        data = {
            "format": FORMAT,
            "metadata": self.metadata,
            "records": [dataclasses.asdict(r) for r in self.records],
        }
        # Written beside and renamed over: an interrupted save never leaves half a report.
        target = Path(path)
        partial = target.with_name(f".{target.name}.partial")
        partial.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(partial, target)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> EvalReport:
        """A report :meth:`save` wrote."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            msg = f"Cannot read an evaluation report from {str(path)!r}: {exc}"
            raise InvalidParameterError(msg) from exc
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            msg = f"{str(path)!r} is not an evaluation report (no format {FORMAT!r})."
            raise InvalidParameterError(msg)
        known = {f.name for f in dataclasses.fields(HoleRecord)}
        try:
            records = [HoleRecord(**{k: v for k, v in r.items() if k in known}) for r in data["records"]]
        except (KeyError, TypeError, AttributeError) as exc:
            msg = f"{str(path)!r} has a malformed record: {exc}"
            raise InvalidParameterError(msg) from exc
        return cls(records, dict(data.get("metadata") or {}))

    def _repr_html_(self) -> str:
        names = [m for m in METRICS + MEASURES if any(getattr(r, m) is not None for r in self.records)]
        if any(r.passed is not None for r in self.records):
            names.append(PASS_AT_1)
        parts = []
        for by in (("config",), ("config", "kind"), ("config", "language")):
            rows = self.summary(by)
            head = [*by, "n", "errors", *names]
            cells = [
                [str(row[k]) for k in by]
                + [str(row["n"]), str(row["errors"])]
                + [_shown(m, row[m]) for m in names]
                for row in rows
            ]
            parts.append(_table(head, cells))
        return "\n".join(parts)


def _resamples(n: int, samples: int, seed: int) -> list[np.ndarray]:
    """``samples`` draws of ``n`` indices with replacement, in batches (deterministic for ``seed``)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n, size=(min(_BATCH, samples - k), n)) for k in range(0, samples, _BATCH)]


def _difference(name: str, values: np.ndarray, picks: list[np.ndarray]) -> Difference:
    """The mean of ``values[:, 0] - values[:, 1]`` and its bootstrap 95% interval over ``picks``."""
    diffs = values[:, 0] - values[:, 1]
    means = np.concatenate([diffs[p].mean(axis=1) for p in picks])
    low, high = np.percentile(means, [2.5, 97.5])
    mean_a, mean_b = values.mean(axis=0)
    return Difference(
        name, len(values), float(mean_a), float(mean_b), float(diffs.mean()), float(low), float(high)
    )


def _with_scores(record: HoleRecord, scores: Any) -> HoleRecord:
    return dataclasses.replace(record, **dataclasses.asdict(scores))


def _mean(values: Iterable[Any]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return math.fsum(kept) / len(kept) if kept else None


def _shown(metric: str, value: float | None, *, signed: bool = False) -> str:
    if value is None:
        return "–"
    if metric in PERCENT:
        return f"{100 * value:{'+' if signed else ''}.1f}%"
    return f"{value:{'+' if signed else ''}.{3 if metric.endswith('_s') else 1}f}"


def _table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"
