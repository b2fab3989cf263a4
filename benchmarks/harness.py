"""What every benchmark shares: interleaved timing, offline checkpoints, results and their reports."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
#: Where checkpoints and other built inputs are kept between runs (``--workdir``).
DEFAULT_WORKDIR = Path.home() / ".cache" / "langchain-starcoder" / "benchmarks"


# --- shapes and checkpoints ----------------------------------------------------------------------


def recipe_key(recipe: Any) -> str:
    """A short name for what built a cached artefact: the same recipe, the same folder."""
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Shape:
    """A checkpoint shape: a preset of ``build_starcoder2``, fewer layers, and config overrides."""

    preset: str
    layers: int | None = None
    overrides: tuple[tuple[str, Any], ...] = ()

    def config(self) -> dict[str, Any]:
        from langchain_starcoder.testing import PRESETS

        config = {**PRESETS[self.preset], **dict(self.overrides)}
        if self.layers is not None:
            config["num_hidden_layers"] = self.layers
        return config

    def describe(self) -> str:
        c = self.config()
        base = f"{self.preset} ({c['num_hidden_layers']} layers"
        if self.overrides and "hidden_size" in dict(self.overrides):
            base = f"{self.preset}-derived ({c['num_hidden_layers']} layers"
            base += f", hidden {c['hidden_size']}, {c['num_attention_heads']} heads, "
            base += f"{c['num_key_value_heads']} KV heads, MLP {c['intermediate_size']}"
        return base + f", vocab {c['vocab_size']}, window {c['sliding_window']})"


#: The real StarCoder2-3b layer shape, with two layers so that one decode step takes ~0.5 s here.
WIDE = Shape("3b", layers=2)
#: One 3b layer: enough to compare per-weight kernel costs (the dtype comparison).
WIDE_1 = Shape("3b", layers=1)
#: A narrow model for long prompts and many tokens: 3b's vocabulary, window and head size.
NARROW = Shape(
    "3b",
    layers=2,
    overrides=(("hidden_size", 512), ("num_attention_heads", 4), ("intermediate_size", 2048)),
)
#: The typing replay's model: 3b's vocabulary, window and head size, 4 layers of hidden 1024, so that a
#: 2,000-token prefill takes seconds here as the 3b's does (1.3 s on llama.cpp, 4.0 s on MLX with OpenBLAS).
TYPING = Shape(
    "3b",
    layers=4,
    overrides=(("hidden_size", 1024), ("num_attention_heads", 8), ("intermediate_size", 4096)),
)
#: 3b layers without 3b's 49152-row output matrix: per token, attention over the window weighs
#: against the layer weights as in the 30-layer model (the head is 1/20 of that model's weights).
WIDE_LAYERS = Shape("3b", layers=2, overrides=(("vocab_size", 1024),))
#: The default model's shape: all 30 layers of StarCoder2-3b (built 4-bit, layer by layer).
FULL = Shape("3b")
TINY = Shape("tiny")


class Checkpoints:
    """Builds checkpoints with ``build_starcoder2`` once and keeps them in ``workdir``."""

    def __init__(self, workdir: Path, *, tiny: bool = False, log: Callable[[str], None] = print):
        self.workdir = Path(workdir)
        self.tiny = tiny
        self.log = log

    def shape(self, shape: Shape) -> Shape:
        """The shape a benchmark gets: the tiny preset replaces every shape in test runs."""
        return TINY if self.tiny else shape

    def get(
        self,
        shape: Shape,
        *,
        quantize: int | None = None,
        dtype: str = "float32",
        seed: int = 0,
    ) -> Path:
        """The checkpoint of ``shape``, built on first use (one layer at a time: the 30-layer 3b's float32
        weights, 12 GB, are never all in memory)."""
        from langchain_starcoder import testing

        shape = self.shape(shape)
        spec = {"config": shape.config(), "quantize": quantize, "dtype": dtype, "seed": seed, "v": 2}
        key = recipe_key(spec)
        path = self.workdir / f"{shape.preset}-{shape.config()['num_hidden_layers']}L-q{quantize}-{key}"
        marker = path / ".bench-complete"
        if marker.is_file():
            return path
        self.log(f"  building checkpoint {path.name} ({shape.describe()}, quantize={quantize})")
        preset = shape.preset
        if shape.overrides:
            # build_starcoder2 takes presets; a derived shape is registered as one for this process.
            preset = f"bench-{key}"
            testing.PRESETS[preset] = {**testing.PRESETS[shape.preset], **dict(shape.overrides)}
        testing.build_starcoder2(
            path, preset=preset, num_layers=shape.layers, quantize=quantize, dtype=dtype, seed=seed
        )
        marker.write_text(json.dumps(spec, indent=2))
        return path


# --- timing ----------------------------------------------------------------------------------------


def interleave(
    variants: Sequence[tuple[str, Callable[[], float]]], reps: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Run each variant ``warmup`` times untimed, then A, B, A, B, ... ``reps`` rounds.

    Each callable returns its own measurement (a rate or a duration), so setup it does before its
    timed part is not counted. Interleaving spreads the noise of a shared machine over all variants.
    """
    for _ in range(warmup):
        for _, run in variants:
            run()
    samples: dict[str, list[float]] = {name: [] for name, _ in variants}
    for _ in range(reps):
        for name, run in variants:
            samples[name].append(run())
    return samples


def rate_from_marks(marks: Sequence[tuple[float, int]]) -> float:
    """Tokens per second between the first and the last arrival, from (time, tokens arrived) marks.

    The tokens that arrived with the first mark are not counted: they include the prefill.
    """
    if len(marks) < 2:
        return float("nan")
    (t0, _), (t1, _) = marks[0], marks[-1]
    tokens = sum(n for _, n in marks[1:])
    return tokens / (t1 - t0) if t1 > t0 else float("nan")


class Clock:
    """Collects (time, tokens) marks as a stream arrives."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.marks: list[tuple[float, int]] = []

    def mark(self, tokens: int = 1) -> None:
        self.marks.append((time.perf_counter(), tokens))

    @property
    def elapsed(self) -> float:
        return (self.marks[-1][0] if self.marks else time.perf_counter()) - self.start

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.marks)

    @property
    def decode_rate(self) -> float:
        return rate_from_marks(self.marks)


# --- results ---------------------------------------------------------------------------------------


@dataclass
class Row:
    """One comparison: A against B, their samples, and the ratio of their medians."""

    item: int
    title: str
    metric: str
    a: str
    b: str
    a_samples: list[float]
    b_samples: list[float]
    unit: str
    shape: str
    goal: tuple[str, float] | None = None
    """("<=" or ">=", value) on the ratio A/B; None for context rows."""
    note: str = ""

    @property
    def a_median(self) -> float:
        return statistics.median(self.a_samples)

    @property
    def b_median(self) -> float:
        return statistics.median(self.b_samples)

    @property
    def ratio(self) -> float:
        return self.a_median / self.b_median if self.b_median else float("nan")

    @property
    def met(self) -> bool | None:
        if self.goal is None:
            return None
        op, value = self.goal
        return self.ratio >= value if op == ">=" else self.ratio <= value

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["goal"] = None if self.goal is None else {"op": self.goal[0], "value": self.goal[1]}
        data.update(
            a_median=self.a_median,
            b_median=self.b_median,
            a_min=min(self.a_samples),
            a_max=max(self.a_samples),
            b_min=min(self.b_samples),
            b_max=max(self.b_samples),
            ratio=self.ratio,
            met=self.met,
        )
        return data


@dataclass
class Section:
    """What one benchmark found: comparison rows, explanatory notes, and any other figures."""

    key: str
    item: int
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    skipped: str | None = None
    """Why the benchmark did not run (an optional dependency is missing), if it did not."""

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "item": self.item,
            "title": self.title,
            "rows": [r.to_json() for r in self.rows],
            "notes": self.notes,
            "data": self.data,
            "seconds": self.seconds,
            "skipped": self.skipped,
        }


def conditions() -> dict[str, Any]:
    """The machine and library versions the numbers were measured on."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in ("mlx", "mlx-lm", "transformers", "torch", "ngsolve-openblas"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "versions": versions,
        "load_average_at_start": load,
    }


def _fmt(x: float) -> str:
    if x != x:  # NaN
        return "n/a"
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 0.1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _cell(samples: Sequence[float], unit: str) -> str:
    median = statistics.median(samples)
    if len(samples) == 1:
        return f"{_fmt(median)} {unit}"
    return f"{_fmt(median)} {unit} ({_fmt(min(samples))}–{_fmt(max(samples))})"


def _goal(row: Row, preset: str) -> str:
    if row.goal is None:
        return "context"
    op, value = row.goal
    shown = f"1/{round(1 / value)}" if 0 < value < 0.1 else _fmt(value)
    if preset != "real":  # the goals are about the real shapes: a tiny run's ratio cannot meet or miss them
        return f"{op} {shown} (real shapes only; not judged on {preset})"
    return f"{op} {shown} {'✅' if row.met else '❌'}"


def markdown_table(sections: Iterable[Section], preset: str = "real") -> str:
    """The comparisons, one row each; with ``preset`` "tiny" the goals are shown but not marked."""
    lines = [
        "| # | Comparison | A | B | A/B | Goal |",
        "|---|---|---|---|---|---|",
    ]
    for section in sections:
        if section.skipped:
            lines.append(f"| {section.item} | {section.title} | skipped: {section.skipped} | | | |")
        for row in section.rows:
            ratio = f"1/{_fmt(1 / row.ratio)}" if 0 < row.ratio < 0.1 else _fmt(row.ratio)  # NaN: n/a
            lines.append(
                f"| {row.item} | {row.title}: {row.metric} | {row.a}: {_cell(row.a_samples, row.unit)} | "
                f"{row.b}: {_cell(row.b_samples, row.unit)} | {ratio} | {_goal(row, preset)} |"
            )
    return "\n".join(lines)


def markdown_report(sections: Sequence[Section], meta: dict[str, Any]) -> str:
    cond = meta["conditions"]
    versions = ", ".join(f"{k} {v}" for k, v in cond["versions"].items() if v)
    out = [
        "# Benchmark results",
        "",
        f"`{meta['command']}` — {cond['when']}, {cond['cpu']}, {cond['cores']} cores, {cond['platform']}; "
        f"{versions}. Load average at start: {cond['load_average_at_start']}. "
        f"Medians of {meta['reps']} interleaved runs (min–max in brackets), after {meta['warmup']} "
        "untimed warm-up run(s) of each variant.",
        "",
        markdown_table(sections, meta.get("preset", "real")),
        "",
        "Shapes:",
        "",
    ]
    shapes = sorted({(r.item, r.shape) for s in sections for r in s.rows})
    out += [f"- {item}: {shape}" for item, shape in shapes]
    for section in sections:
        if section.notes:
            out += ["", f"## {section.item}. {section.title}", ""]
            out += [f"- {note}" for note in section.notes]
    return "\n".join(out) + "\n"


def write_results(sections: Sequence[Section], meta: dict[str, Any], json_path: Path, md_path: Path) -> None:
    data = _finite({**meta, "sections": [s.to_json() for s in sections]})
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(data, indent=2, default=_json_default, allow_nan=False))
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(markdown_report(sections, meta))


def _finite(value: Any) -> Any:
    """NaN and infinities (a rate from a stream too short to time) become null: strict JSON."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    msg = f"not JSON serializable: {type(value).__name__}"
    raise TypeError(msg)


# --- subprocesses ----------------------------------------------------------------------------------


def run_child(task: str, args: dict[str, Any], *, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python -m benchmarks.child`` (a fresh process: needed where the BLAS must differ)."""
    cmd = [sys.executable, "-m", "benchmarks.child", task, json.dumps(args, default=_json_default)]
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full_env.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, cwd=REPO, check=False)
    if proc.returncode != 0:
        msg = f"benchmark child {task} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
        raise RuntimeError(msg)
    return json.loads(proc.stdout.strip().splitlines()[-1])
