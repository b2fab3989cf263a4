"""The GGUF files kept for ``backend="llama.cpp"``: each is used only for the files it was converted from.

A cached file carries the fingerprint of its sources (config, tokenizer, weights, each hashed whole); a load
uses it only when the checkpoint still has that fingerprint, and reads no weights again while their stamps
(size, mtime, inode) are the ones stored beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from langchain_starcoder.errors import StarCoderError
from langchain_starcoder.gguf_format import convert_to_gguf
from langchain_starcoder.gguf_format.cache import SOURCE_KEY, cached_gguf
from langchain_starcoder.gguf_format.header import read_header
from langchain_starcoder.testing import build_starcoder2

REPO = Path(__file__).resolve().parents[2]
gguf = pytest.importorskip("gguf")


def _tensors(path: Path) -> dict[str, np.ndarray]:
    return {t.name: np.array(t.data) for t in gguf.GGUFReader(str(path)).tensors}


def _same_tensors(a: Path, b: Path) -> bool:
    ta, tb = _tensors(a), _tensors(b)
    return ta.keys() == tb.keys() and all(np.array_equal(ta[k], tb[k]) for k in ta)


def _fresh(checkpoint: Path, out: Path, outtype: str = "f32") -> Path:
    """What converting the checkpoint as it is now gives."""
    return convert_to_gguf(checkpoint, out, outtype=outtype)


def test_an_edit_between_the_old_samples_is_converted_again(tmp_path: Path) -> None:
    """The old key hashed 33 pieces of 1 MB of each weights file: a 50 MB file edited between two of them
    kept its key, and the stale conversion was served while MLX served the edited weights."""
    checkpoint = build_starcoder2(tmp_path / "model", preset="small", num_layers=16, sliding_window=0)
    weights = checkpoint / "model.safetensors"
    size = weights.stat().st_size
    assert size > 40 << 20  # larger than what the old key sampled
    stale = cached_gguf(checkpoint, "f32", tmp_path / "cache")
    stale_copy = shutil.copy(stale, tmp_path / "stale.gguf")

    # one float32 in the middle of the gap after the old key's 17th piece, in a tensor's data
    offset = (size - (1 << 20)) * 16 // 32 + (1 << 20) + (100 << 10)
    offset -= offset % 4
    with open(weights, "r+b") as f:
        f.seek(offset)
        (value,) = struct.unpack("<f", f.read(4))
        f.seek(offset)
        f.write(struct.pack("<f", value + 1.0))
    assert weights.stat().st_size == size

    served = cached_gguf(checkpoint, "f32", tmp_path / "cache")
    assert _same_tensors(served, _fresh(checkpoint, tmp_path / "fresh.gguf"))
    assert not _same_tensors(served, Path(stale_copy))


def test_another_models_file_under_this_name_is_converted_again(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    model_a = build_starcoder2(tmp_path / "a", preset="small", num_layers=1, seed=1)
    model_b = build_starcoder2(tmp_path / "b", preset="small", num_layers=1, seed=2)
    a_file, b_file = cached_gguf(model_a, "f32", cache), cached_gguf(model_b, "f32", cache)
    assert a_file != b_file
    shutil.copyfile(b_file, a_file)  # B's conversion under A's name
    served = cached_gguf(model_a, "f32", cache)
    assert _same_tensors(served, _fresh(model_a, tmp_path / "fresh.gguf"))
    shutil.copyfile(tmp_path / "fresh.gguf", a_file)  # a conversion without our fingerprint: not used
    assert SOURCE_KEY in read_header(cached_gguf(model_a, "f32", cache)).metadata


@pytest.mark.parametrize("outtype", ["f32", "q4_0"])
def test_a_valid_file_is_used_as_it_is(tmp_path: Path, outtype: str) -> None:
    """The fingerprint survives llama-quantize (q4_0), so a second load converts nothing."""
    checkpoint = build_starcoder2(tmp_path / "model", preset="small", num_layers=1)
    first = cached_gguf(checkpoint, outtype, tmp_path / "cache")
    before = first.stat()
    again = cached_gguf(checkpoint, outtype, tmp_path / "cache")
    after = again.stat()
    assert again == first and (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert list((tmp_path / "cache").iterdir()) == [first]


def _hashes_in_a_new_process(checkpoint: Path, cache: Path) -> dict[str, object]:
    """Which files a fresh process hashes whole to check the cached file, and whether it converted."""
    script = textwrap.dedent(f"""
        import hashlib, json
        from pathlib import Path
        import langchain_starcoder.gguf_format.cache as cache
        hashed, converted = [], []
        real_digest, real_convert = hashlib.file_digest, cache.convert_to_gguf
        def counting_digest(f, *args):
            hashed.append(Path(f.name).name)
            return real_digest(f, *args)
        def counting_convert(*args, **kwargs):
            converted.append(1)
            return real_convert(*args, **kwargs)
        hashlib.file_digest, cache.convert_to_gguf = counting_digest, counting_convert
        cache.cached_gguf(Path({str(checkpoint)!r}), "f32", Path({str(cache)!r}))
        print(json.dumps({{"hashed": sorted(hashed), "converted": len(converted)}}))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_sources_are_hashed_again_only_when_their_stamp_changes(tmp_path: Path) -> None:
    checkpoint = build_starcoder2(tmp_path / "model", preset="small", num_layers=1)
    cache = tmp_path / "cache"
    cached_gguf(checkpoint, "f32", cache)
    assert _hashes_in_a_new_process(checkpoint, cache) == {"hashed": [], "converted": 0}
    weights = checkpoint / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # touched
    assert _hashes_in_a_new_process(checkpoint, cache) == {"hashed": ["model.safetensors"], "converted": 0}


def test_a_cache_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    checkpoint = build_starcoder2(tmp_path / "model", preset="small", num_layers=1)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(StarCoderError, match="not yours alone"):
        cached_gguf(checkpoint, "f32", shared)
    assert list(shared.iterdir()) == []  # nothing converted there
    made = cached_gguf(checkpoint, "f32", tmp_path / "new" / "gguf")
    assert made.parent.stat().st_mode & 0o777 == 0o700
