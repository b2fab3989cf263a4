"""Structured output (issue 32): decode tokens/s and time to first token with a 10-field JSON Schema
against unconstrained decoding, side by side in one run on the narrow 3b shape.

- The checkpoint: the "narrow" shape (StarCoder2-3b's 49,152-token vocabulary, window and head size, 2
  layers of hidden 512), with a byte-level BPE of 49,152 tokens trained on the Python standard library in
  place of the built checkpoint's (whose vocabulary is mostly padding tokens that a grammar's mask skips
  at once): the mask walks a real code vocabulary. The weights are random; the tokenizer is trained once
  and kept in the work folder.
- Variants, interleaved: ``engine.stream(prompt, max_tokens=n)`` greedy, unconstrained; the same with
  ``json_schema=SCHEMA`` (10 fields: strings, integers, numbers, booleans, an enum, an array, a nested
  object), its grammar compiled once before the timed runs (cached per schema, as every repeated schema
  is). The prompt cache is cleared before every call, so both prefill the same prompt.
- Decode tokens/s: completion tokens after the first over the time between the first and the last
  (``Completion.generation_tps``); time to first token: from the call to the first chunk.
- Context: the first request of a schema not seen before (its compile included), and llguidance's mask
  cost per token on this vocabulary (a matcher stepped through a valid instance, no model).
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from .harness import NARROW, Row, Section, interleave

ITEM = 23  # the row number in the report (22 is the typing benchmark's)
TITLE = "Structured output"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "path": {"type": "string"},
        "line": {"type": "integer"},
        "score": {"type": "number"},
        "public": {"type": "boolean"},
        "kind": {"enum": ["function", "class", "method", "variable"]},
        "calls": {"type": "array", "items": {"type": "string"}},
        "doc": {"type": "string"},
        "tests": {"type": "integer"},
        "owner": {"type": "object", "properties": {"team": {"type": "string"}, "since": {"type": "integer"}}},
    },
    "required": ["name", "path", "line", "score", "public", "kind", "calls", "doc", "tests", "owner"],
    "additionalProperties": False,
}
INSTANCE = {
    "name": "parse_config",
    "path": "src/config/parse.py",
    "line": 128,
    "score": 0.875,
    "public": True,
    "kind": "function",
    "calls": ["read_text", "loads", "validate"],
    "doc": "Read and check the settings.",
    "tests": 12,
    "owner": {"team": "platform", "since": 2021},
}
PROMPT = (
    "# One record per symbol, as JSON.\n"
    'def parse_config(path):\n    """Read and check the settings."""\n'
    "    return validate(loads(read_text(path)))\n"
    "\nrecord = "
)


def stdlib_tokenizer(folder: Path, log: Any) -> Path:
    """A 49,152-token byte-level BPE trained on the standard library's Python files (once)."""
    from langchain_starcoder.testing.tokenizer import write_tokenizer

    if (folder / "tokenizer_config.json").is_file():
        return folder
    log("  training a 49,152-token BPE on the standard library (once, about a minute)")
    root = Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    texts, total = [], 0
    for path in sorted(root.rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        total += len(text)
        if total > 12_000_000:
            break
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_tokenizer(tmp, 49152, None, corpus=texts)
    tmp.rename(folder)
    return folder


def checkpoint(ctx: Any) -> Path:
    """The narrow checkpoint with the standard-library tokenizer (its weights linked, not copied)."""
    source = ctx.checkpoints.get(NARROW)
    if ctx.tiny:
        return source
    path = ctx.checkpoints.workdir / f"{source.name}-stdlib-tokenizer"
    if (path / "config.json").is_file():
        return path
    tokenizer = stdlib_tokenizer(ctx.checkpoints.workdir / "stdlib-bpe-49152", ctx.log)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for item in source.iterdir():
        if item.name.startswith("model"):
            (tmp / item.name).symlink_to(item.resolve())
        elif item.is_file() and item.name != "config.json":
            shutil.copyfile(item, tmp / item.name)
    for item in tokenizer.iterdir():
        shutil.copyfile(item, tmp / item.name)
    shutil.copyfile(source / "config.json", tmp / "config.json")  # last: a folder with it is whole
    tmp.rename(path)
    return path


def mask_cost(engine: Any) -> dict[str, float]:
    """Microseconds per token of llguidance's mask and step, through a valid instance (no model)."""
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    from langchain_starcoder.types import GenerationParams

    grammar = engine._parts.grammars.compile(GenerationParams.create(json_schema=SCHEMA).constraint)
    ids = engine.encode(json.dumps(INSTANCE), special_tokens=False)
    words = allocate_token_bitmask(1, engine.vocab_size)
    per_token = []
    for _ in range(5):
        matcher = grammar.matcher()
        for token in ids:
            start = time.perf_counter()
            fill_next_token_bitmask(matcher, words)
            matcher.consume_token(token)
            per_token.append(time.perf_counter() - start)
    return {
        "tokens": len(ids),
        "median_us": statistics.median(per_token) * 1e6,
        "mean_us": statistics.fmean(per_token) * 1e6,
    }


def bench_structured(ctx: Any) -> Section:
    from langchain_starcoder import StarCoderEngine

    section = Section("structured", ITEM, TITLE)
    shape = ctx.checkpoints.shape(NARROW)
    engine = StarCoderEngine.load(checkpoint(ctx), dtype="float32")
    n = ctx.size(64, 48, 16)
    ids = engine.encode(PROMPT)
    # Plain decoding in both (prompt lookup off): the grammar's cost alone is compared.
    plain = {"prompt_lookup_num_tokens": 0}
    kept: dict[str, list[Any]] = {"unconstrained": [], "schema": []}  # each decode run's completion

    def first_token(**settings: Any) -> float:
        """Seconds of a whole one-token call (checks, grammar lookup, prefill, the first step)."""
        engine.clear_cache()  # both prefill the same prompt
        start = time.perf_counter()
        engine.generate(ids, max_tokens=1, **plain, **settings)
        return time.perf_counter() - start

    def decode(name: str, **settings: Any) -> float:
        """Tokens per second after the first (the prefill left out)."""
        engine.clear_cache()
        done = engine.generate(ids, max_tokens=n, **plain, **settings)
        kept[name].append(done)
        return (done.completion_tokens - 1) / max(done.generation_seconds, 1e-9)

    start = time.perf_counter()
    engine._parts.grammars.compile(("regex", "[0-9]+"))  # llguidance's copy of the tokenizer: once per engine
    tokenizer_seconds = time.perf_counter() - start
    start = time.perf_counter()
    engine.generate(ids, max_tokens=1, json_schema=SCHEMA, **plain)  # a schema not seen before
    cold = time.perf_counter() - start
    samples = interleave(
        [
            ("ttft unconstrained", first_token),
            ("ttft schema", lambda: first_token(json_schema=SCHEMA)),
            ("decode unconstrained", lambda: decode("unconstrained")),
            ("decode schema", lambda: decode("schema", json_schema=SCHEMA)),
        ],
        ctx.reps if ctx.tiny or ctx.quick else max(ctx.reps, 9),
        ctx.warmup,
    )
    decode_u, decode_s = samples["decode unconstrained"], samples["decode schema"]
    ttft_u, ttft_s = samples["ttft unconstrained"], samples["ttft schema"]
    section.rows += [
        Row(
            ITEM,
            TITLE,
            "decode tokens/s",
            "10-field JSON schema",
            "unconstrained",
            decode_s,
            decode_u,
            "tok/s",
            shape.describe(),
            (">=", 0.9),
        ),
        Row(
            ITEM,
            TITLE,
            "time to first token",
            "10-field JSON schema (compiled grammar cached)",
            "unconstrained",
            ttft_s,
            ttft_u,
            "s",
            shape.describe(),
            ("<=", 1.2),
        ),
        Row(
            ITEM,
            TITLE,
            "time to first token",
            "a schema not seen before (compiled in the call)",
            "unconstrained",
            [cold],
            ttft_u,
            "s",
            shape.describe(),
        ),
    ]
    cost = mask_cost(engine)
    timed = kept["schema"][-len(decode_s) :]  # (the warm-up run left out)
    section.data.update(
        mask=cost,
        tokenizer_seconds=tokenizer_seconds,
        cold_seconds=cold,
        completion_tokens=[c.completion_tokens for c in timed],
        finish_reasons=[c.finish_reason for c in timed],
        text=timed[-1].text,
        paired_decode=_paired(decode_s, decode_u),
        paired_ttft=_paired(ttft_s, ttft_u),
    )
    section.notes += [
        f"{len(ids)}-token prompt, greedy, float32, prompt lookup off and the prompt cache cleared before "
        f"every call. Decode: {n} new tokens (the constrained output ran "
        f"{statistics.median(section.data['completion_tokens']):.0f}, finish_reason "
        f"{timed[-1].finish_reason!r}), tokens after the first over the time from the first to the last. "
        "Time to first token: the wall time of a whole one-token call.",
        f"Round by round (each A right after its B): decode {_describe(section.data['paired_decode'])}; "
        f"time to first token {_describe(section.data['paired_ttft'])}.",
        f"llguidance's mask and step on this vocabulary, no model: median {cost['median_us']:.0f} µs, mean "
        f"{cost['mean_us']:.0f} µs per token over a {cost['tokens']}-token instance of the schema. Each "
        "constrained step waits for its token (the mask needs it); the mask is computed as the model runs.",
        f"Once per engine: llguidance's copy of the 49,152-token tokenizer, {tokenizer_seconds:.2f} s (left "
        "out of the not-seen-before row).",
    ]
    engine.close()
    return section


def _paired(a: list[float], b: list[float]) -> list[float]:
    return sorted(x / y for x, y in zip(a, b, strict=True))


def _describe(ratios: list[float]) -> str:
    middle = statistics.median(ratios)
    return f"median A/B {middle:.3f}, range {ratios[0]:.3f}-{ratios[-1]:.3f} ({len(ratios)} rounds)"
