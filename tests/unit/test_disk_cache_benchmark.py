"""The disk prompt-cache benchmark (benchmarks/disk_cache.py, issue 22) runs end to end on a tiny
checkpoint and really serves the new process from the file (speeds on tiny mean nothing)."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.cases import BENCHMARKS, OPTIONAL, Context
from benchmarks.disk_cache import bench_disk_cache
from benchmarks.harness import Checkpoints


def test_the_new_process_is_served_from_the_file(tmp_path: Path) -> None:
    assert BENCHMARKS["disk_cache"] is bench_disk_cache and "disk_cache" in OPTIONAL
    ctx = Context(Checkpoints(tmp_path, tiny=True, log=lambda _: None), reps=1, warmup=0)
    section = bench_disk_cache(ctx)
    data = section.data
    assert 0 < data["cached_tokens"] < data["prompt_tokens"]
    assert data["prompt_tokens"] - data["cached_tokens"] <= 40  # only the hole's end is prefilled
    assert data["bytes_per_token"] > 0 and data["max_latency_writing"] > 0
    assert [r.b for r in section.rows] == ["cold prefill", "in-memory hit", "no disk cache", "just before it"]
    assert all(math.isfinite(r.ratio) and r.ratio > 0 for r in section.rows)
    assert [p for p in tmp_path.rglob("*") if "prompt-cache" in p.name] == []  # its folders are removed
