"""Prompt caches kept on disk (issue 22): reused in a new process with the same output, only by the
same weights and settings, damaged files skipped and removed, a folder that cannot be written
tolerated, two writers at once, and the byte limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.backends.prompt_cache import PromptCacheNotice
from langchain_starcoder.backends.prompt_cache.disk import MIN_NEW_TOKENS
from langchain_starcoder.backends.prompt_cache.files import read_cache_file
from langchain_starcoder.checkpoints import quantize_checkpoint
from langchain_starcoder.errors import InvalidParameterError
from langchain_starcoder.testing import build_starcoder2

REPO = Path(__file__).resolve().parents[2]
#: Longer than the tiny model's 512-token window, so a reused cache must hold positions past it.
SHARED = "".join(f"def handler_{i}(request):\n    return respond(request, code={i * 7})\n" for i in range(36))
ENDINGS = ["\n\ndef main():\n    ", "\n\nclass Router:\n    def route(self, path):\n        "]

# One process: load with the settings given, generate each prompt greedily, report ids and counts
# and the notices (the engine is closed inside, so the writer's notices are caught too).
RUNNER = r"""
import json, resource, signal, sys, warnings
spec = json.loads(sys.argv[1])
if spec.get("no_writes"):  # a full disk: no byte can be written (SIGXFSZ ignored: writes fail instead)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
from langchain_starcoder import StarCoderEngine
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    engine = StarCoderEngine.load(spec["model"], **spec["load"])
    out = []
    for prompt in spec["prompts"]:
        c = engine.generate(prompt, max_tokens=12)
        out.append({"ids": c.token_ids, "cached": c.cached_tokens, "prompt": c.prompt_tokens})
    engine.close()
notices = [str(w.message) for w in caught if w.category.__name__ == "PromptCacheNotice"]
print(json.dumps({"out": out, "notices": notices}))
"""


def run_process(model: Path, prompts: list[str], **load: object) -> dict:
    """Generate ``prompts`` in a new Python process; its results and notices."""
    no_writes = load.pop("no_writes", False)
    load = {k: str(v) if isinstance(v, Path) else v for k, v in load.items()}
    spec = json.dumps({"model": str(model), "load": load, "prompts": prompts, "no_writes": no_writes})
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, spec],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def fresh(model: Path, prompt: str, **load: object) -> list[int]:
    """What an engine with no kept caches generates for ``prompt``."""
    engine = StarCoderEngine.load(model, **load)
    try:
        return engine.generate(prompt, max_tokens=12).token_ids
    finally:
        engine.close()


def cache_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def test_a_new_process_reuses_the_cache_and_answers_the_same(
    tiny_path: Path, tiny_engine: StarCoderEngine, tmp_path: Path
) -> None:
    folder = tmp_path / "prompt-cache"
    first = run_process(tiny_path, [SHARED + ENDINGS[0]], prompt_cache_dir=folder)
    assert first["out"][0]["cached"] == 0
    assert first["out"][0]["prompt"] > MIN_NEW_TOKENS + 256  # past the window and worth a file
    assert len(cache_files(folder)) == 1
    # A new process: the same prompt, and another sharing its long prefix.
    second = run_process(tiny_path, [SHARED + ENDINGS[0], SHARED + ENDINGS[1]], prompt_cache_dir=folder)
    same, other = second["out"]
    assert same["cached"] == same["prompt"] - 1
    assert other["cached"] >= len(tiny_engine.encode(SHARED)) - 2
    assert same["ids"] == first["out"][0]["ids"] == fresh(tiny_path, SHARED + ENDINGS[0])
    assert other["ids"] == fresh(tiny_path, SHARED + ENDINGS[1])
    assert second["notices"] == []


def test_a_draft_model_reuses_the_file_and_answers_the_same(tiny_path: Path, tmp_path: Path) -> None:
    """Files hold the model's layers only: with a draft model a new process loads them, prefills the
    draft's own layers afresh, and speculative decoding still gives the plain engine's tokens."""
    draft = quantize_checkpoint(tiny_path, tmp_path / "q8", bits=8, progress=False)
    folder, prompt = tmp_path / "prompt-cache", SHARED + ENDINGS[0]
    load = {"prompt_cache_dir": folder, "draft_model": draft, "num_draft_tokens": 3}
    first = run_process(tiny_path, [prompt], **load)
    second = run_process(tiny_path, [prompt], **load)
    assert second["out"][0]["cached"] == second["out"][0]["prompt"] - 1
    assert second["out"][0]["ids"] == first["out"][0]["ids"] == fresh(tiny_path, prompt)
    assert second["notices"] == []


def test_mlx_lm_reads_the_files(tiny_path: Path, tmp_path: Path) -> None:
    from mlx_lm.models.cache import KVCache, load_prompt_cache

    engine = StarCoderEngine.load(tiny_path, prompt_cache_dir=tmp_path)
    done = engine.generate(SHARED, max_tokens=4)
    engine.close()
    (path,) = cache_files(tmp_path)
    cache, metadata = load_prompt_cache(str(path), return_metadata=True)
    held = json.loads(metadata["tokens"])
    assert held == engine.encode(SHARED) + done.token_ids[:-1]  # the last token is never fed
    assert all(type(c) is KVCache and c.offset == len(held) for c in cache)
    tensors, _ = read_cache_file(path)
    assert np.array_equal(np.array(cache[1].keys), tensors["1.0"].data)


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ({"kv_bits": None}, {"kv_bits": 8}),
        ({"kv_bits": 8}, {"kv_bits": None}),
        ({"dtype": "float32"}, {"dtype": "bfloat16"}),
    ],
    ids=["kv_bits 8 after none", "none after kv_bits 8", "bfloat16 after float32"],
)
def test_other_settings_do_not_reuse(small_path: Path, tmp_path: Path, first: dict, then: dict) -> None:
    prompt = SHARED + ENDINGS[0]
    run_process(small_path, [prompt], prompt_cache_dir=tmp_path, **first)
    assert len(cache_files(tmp_path)) == 1
    other = run_process(small_path, [prompt, prompt], prompt_cache_dir=tmp_path, **then)
    assert other["out"][0]["cached"] == 0  # a file of the first settings is never used
    assert other["out"][0]["ids"] == fresh(small_path, prompt, **then)
    assert other["notices"] == []  # another model's or settings' files are left alone, not "damaged"
    assert len(cache_files(tmp_path)) == 2
    # The same settings again (kv_bits 8 and bfloat16 files included) reuse their own file, exactly.
    again = run_process(small_path, [prompt], prompt_cache_dir=tmp_path, **then)
    assert again["out"][0]["cached"] == again["out"][0]["prompt"] - 1
    assert again["out"][0]["ids"] == other["out"][0]["ids"]


def test_weights_rebuilt_in_place_are_not_reused(tmp_path: Path) -> None:
    model, folder = tmp_path / "model", tmp_path / "cache"
    build_starcoder2(model, seed=3)
    prompt = SHARED + ENDINGS[0]
    run_process(model, [prompt], prompt_cache_dir=folder)
    build_starcoder2(model, seed=4)  # same shapes, same path, other weights
    rebuilt = run_process(model, [prompt], prompt_cache_dir=folder)
    assert rebuilt["out"][0]["cached"] == 0
    assert rebuilt["out"][0]["ids"] == fresh(model, prompt)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _random_bytes(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))


def _flip_a_data_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x40  # inside the arrays: the header still reads, the numbers are wrong
    path.write_bytes(bytes(data))


def _empty(path: Path) -> None:
    path.write_bytes(b"")


@pytest.mark.parametrize("damage", [_truncate, _random_bytes, _flip_a_data_byte, _empty])
def test_a_damaged_file_is_skipped_with_one_notice_and_removed(
    tiny_path: Path, tmp_path: Path, damage
) -> None:
    prompt = SHARED + ENDINGS[0]
    engine = StarCoderEngine.load(tiny_path, prompt_cache_dir=tmp_path)
    expected = engine.generate(prompt, max_tokens=12).token_ids
    engine.close()
    (path,) = cache_files(tmp_path)
    damage(path)
    engine = StarCoderEngine.load(tiny_path, prompt_cache_dir=tmp_path)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            done = [engine.generate(prompt, max_tokens=12) for _ in range(2)]
            engine.backend._disk.flush()
        notices = [w for w in caught if issubclass(w.category, PromptCacheNotice)]
        assert len(notices) == 1, [str(w.message) for w in caught]
        assert path.name in str(notices[0].message)
        assert done[0].cached_tokens == 0
        assert [d.token_ids for d in done] == [expected, expected]
        assert done[1].cached_tokens > 0  # the in-memory cache meanwhile
        assert not path.exists() or read_cache_file(path)  # removed, or rewritten whole by this engine
    finally:
        engine.close()


def test_a_folder_that_cannot_be_written_still_answers(tiny_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    prompts = [SHARED + ENDINGS[0], "# another file\n" * 120 + SHARED]
    run_process(tiny_path, prompts[:1], prompt_cache_dir=folder)
    before = {p.name: p.read_bytes() for p in cache_files(folder)}
    # No byte can be written (as on a full disk): the kept cache is still used, the new one is not kept.
    full = run_process(tiny_path, prompts, prompt_cache_dir=folder, no_writes=True)
    kept, new = full["out"]
    assert kept["cached"] == kept["prompt"] - 1
    assert new["cached"] == 0
    assert [o["ids"] for o in full["out"]] == [fresh(tiny_path, p) for p in prompts]
    assert len(full["notices"]) == 1 and "Could not write" in full["notices"][0]
    assert {p.name: p.read_bytes() for p in cache_files(folder)} == before
    assert [p.name for p in folder.iterdir() if p.name.endswith(".tmp")] == []


def test_a_folder_that_cannot_be_made_gives_one_notice(tiny_path: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = StarCoderEngine.load(tiny_path, prompt_cache_dir=blocker / "cache")
        try:
            answers = [engine.generate(SHARED + e, max_tokens=12).token_ids for e in ENDINGS]
        finally:
            engine.close()
    notices = [w for w in caught if issubclass(w.category, PromptCacheNotice)]
    assert len(notices) == 1 and "cannot be written" in str(notices[0].message)
    assert answers == [fresh(tiny_path, SHARED + e) for e in ENDINGS]


def test_a_file_as_the_folder_is_refused(tiny_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    path.write_text("")
    with pytest.raises(InvalidParameterError, match="is a file"):
        StarCoderEngine.load(tiny_path, prompt_cache_dir=path)


def test_two_processes_writing_at_once(tiny_path: Path, tmp_path: Path) -> None:
    prompts = [f"# module {i}\n" + SHARED[i * 40 :] + ENDINGS[i % 2] for i in range(4)]
    specs = [prompts[:3], prompts[1:]]  # two of them written by both processes at once
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = []
    for p in specs:
        spec = json.dumps(
            {"model": str(tiny_path), "prompts": p, "load": {"prompt_cache_dir": str(tmp_path)}}
        )
        argv = [sys.executable, "-c", RUNNER, spec]
        procs.append(
            subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env
            )
        )
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["notices"] == [] for r in results)
    files = cache_files(tmp_path)
    assert len(files) == 4  # one per prompt: a second writer of the same cache replaces it whole
    for path in files:
        read_cache_file(path)  # whole and undamaged
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    again = run_process(tiny_path, prompts, prompt_cache_dir=tmp_path)
    assert all(o["cached"] == o["prompt"] - 1 for o in again["out"])
    assert [o["ids"] for o in again["out"]] == [fresh(tiny_path, p) for p in prompts]


def test_the_byte_limit_keeps_the_most_recently_used(tiny_path: Path, tmp_path: Path) -> None:
    prompts = [f"# part {i}\n" + SHARED for i in range(4)]
    engine = StarCoderEngine.load(tiny_path, prompt_cache_dir=tmp_path)
    engine.generate(prompts[0], max_tokens=2)
    engine.backend._disk.flush()
    (first,) = cache_files(tmp_path)
    size = first.stat().st_size
    engine.close()
    limit = int(size * 2.5)  # room for two files
    engine = StarCoderEngine.load(tiny_path, prompt_cache_dir=tmp_path, max_prompt_cache_dir_bytes=limit)
    try:
        for prompt in prompts[1:3]:
            engine.generate(prompt, max_tokens=2)
            engine.backend._disk.flush()
        engine.clear_cache()  # from here on a hit can only come from disk
        assert engine.generate(prompts[1], max_tokens=2).cached_tokens > 0  # used: most recent now
        engine.generate(prompts[3], max_tokens=2)
        engine.backend._disk.flush()
        held = [json.loads(read_cache_file(p)[1]["0.tokens"]) for p in cache_files(tmp_path)]
        assert sum(p.stat().st_size for p in cache_files(tmp_path)) <= limit
        starts = sorted(engine.decode(tokens[:4]) for tokens in held)
        assert starts == sorted(engine.decode(engine.encode(prompts[i])[:4]) for i in (1, 3))
    finally:
        engine.close()


def test_nothing_is_written_outside_the_folder(tiny_path: Path, tmp_path: Path) -> None:
    def listing() -> dict[str, int]:
        return {str(p): p.stat().st_mtime_ns for p in tiny_path.rglob("*")}

    before = listing()
    folder = tmp_path / "cache"
    run_process(tiny_path, [SHARED + ENDINGS[0]], prompt_cache_dir=folder)
    assert listing() == before
    assert [p for p in tmp_path.rglob("*") if folder not in (p, *p.parents)] == []


def test_a_gguf_file_is_keyed_by_its_contents_and_window(tiny_path: Path, tmp_path: Path) -> None:
    from langchain_starcoder.testing.gguf import write_gguf

    gguf, folder, prompt = tmp_path / "tiny.gguf", tmp_path / "cache", SHARED + ENDINGS[0]

    def answer(**load: object) -> tuple[list[int], int]:
        engine = StarCoderEngine.load(gguf, prompt_cache_dir=folder, **load)
        try:
            done = engine.generate(prompt, max_tokens=12)
            return done.token_ids, done.cached_tokens
        finally:
            engine.close()

    write_gguf(tiny_path, gguf, ftype="Q8_0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the GGUF notices (its window filled in)
        first, _ = answer(sliding_window=512)
        again, cached = answer(sliding_window=512)
        assert cached > 0 and again == first
        _, cached = answer(sliding_window=0)  # full attention: other KV values
        assert cached == 0
        other = build_starcoder2(tmp_path / "other", seed=5)
        write_gguf(other, gguf, ftype="Q8_0")  # rebuilt in place: other weights, same shapes and types
        rebuilt, cached = answer(sliding_window=512)
    assert cached == 0
    engine = StarCoderEngine.load(gguf, sliding_window=512)
    try:
        assert rebuilt == engine.generate(prompt, max_tokens=12).token_ids
    finally:
        engine.close()
