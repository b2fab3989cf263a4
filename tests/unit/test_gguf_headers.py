"""Hostile GGUF headers and bad GGUF metadata: each ends in one clear error, fast and in bounded memory,
whether the file is loaded, converted or used as the tokenizer of a remote engine.

The files are the tiny checkpoint written by llama.cpp's ``gguf`` package (``write_gguf``), then edited
in place through the package's own memory map (``GGUFReader(..., "r+")``) or, where its writer would
refuse to write them, by hand."""

from __future__ import annotations

import shutil
import struct
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import pytest

from langchain_starcoder import StarCoderEngine, cli
from langchain_starcoder.errors import CheckpointError, UnsupportedModelError
from langchain_starcoder.testing.gguf import write_gguf

WINDOW = 512  # the tiny preset's window (GGUF files do not carry it)
#: What any hostile header may cost before its error: the requirement, generously (a 1 MB file that
#: declared a million blocks took 20 s and 2.4 GB).
SECONDS, BYTES = 5.0, 64 * 2**20


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory, tiny_path: Path) -> Path:
    return write_gguf(tiny_path, tmp_path_factory.mktemp("good") / "tiny.gguf")


def edited(good: Path, dst: Path, edit: Callable[[gguf.GGUFReader], None]) -> Path:
    """A copy of ``good`` edited in place through the gguf package's writable memory map."""
    shutil.copy(good, dst)
    reader = gguf.GGUFReader(dst, "r+")
    edit(reader)
    reader.data.flush()
    del reader
    return dst


def set_value(key: str, value: int) -> Callable[[gguf.GGUFReader], None]:
    def edit(reader: gguf.GGUFReader) -> None:
        field = reader.fields[key]
        field.parts[field.data[0]][0] = value

    return edit


def set_part(key: str, part: int, value: int) -> Callable[[gguf.GGUFReader], None]:
    """A metadata entry's ``part``: 0 its key's length; of an array, 4 its length."""

    def edit(reader: gguf.GGUFReader) -> None:
        reader.fields[key].parts[part][0] = value

    return edit


def set_tensor(name: str, part: int, value: Any) -> Callable[[gguf.GGUFReader], None]:
    """A tensor's entry's ``part``: 2 its number of dimensions, 3 the dimensions, 4 its ggml type."""

    def edit(reader: gguf.GGUFReader) -> None:
        field = next(t.field for t in reader.tensors if t.name == name)
        field.parts[part][...] = value

    return edit


def header_count(offset: int, value: int) -> Callable[[Path, Path], Path]:
    """The tensor count (offset 8) or the metadata count (16) of the fixed header, set by hand."""

    def make(good: Path, dst: Path) -> Path:
        data = bytearray(good.read_bytes())
        struct.pack_into("<Q", data, offset, value)
        dst.write_bytes(data)
        return dst

    return make


def nested_arrays(depth: int) -> Callable[[Path, Path], Path]:
    """One metadata entry: an array of an array of ... ``depth`` deep (the gguf writer cannot nest)."""

    def make(good: Path, dst: Path) -> Path:
        header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"x" + struct.pack("<I", 9)
        dst.write_bytes(header + struct.pack("<IQ", 9, 1) * depth + struct.pack("<IQ", 4, 0))
        return dst

    return make


def via(edit: Callable[[gguf.GGUFReader], None]) -> Callable[[Path, Path], Path]:
    return lambda good, dst: edited(good, dst, edit)


#: Every count a header declares, far past what the file holds -> what the error says.
HOSTILE = {
    "a million blocks": (via(set_value("starcoder2.block_count", 10**6)), "block_count is 1000000"),
    "four million blocks": (via(set_value("starcoder2.block_count", 4 * 10**6)), "block_count is 4000000"),
    "tensor count": (header_count(8, 2**60), "declares 1152921504606846976 tensors"),
    "metadata count": (header_count(16, 2**60), "declares 1152921504606846976 metadata entries"),
    "string array length": (via(set_part("tokenizer.ggml.tokens", 4, 2**61)), "items in metadata"),
    "number array length": (via(set_part("tokenizer.ggml.token_type", 4, 2**61)), "items in metadata"),
    "string length": (via(set_part("general.architecture", 0, 2**62)), "runs past the end of the file"),
    "dimension count": (via(set_tensor("blk.0.attn_q.weight", 2, 2**31)), "2147483648 dimensions"),
    "dimensions": (via(set_tensor("blk.0.attn_q.weight", 3, 2**62)), "is truncated: its tensors need"),
    "nested arrays": (nested_arrays(200_000), "nests arrays more than 8 deep"),
}


def load(file: Path, **kwargs: Any) -> None:
    StarCoderEngine.load(file, **kwargs).close()


def connect(file: Path) -> None:
    # The error comes from the file's header, before the server (nothing listens there) is asked.
    StarCoderEngine.connect("http://127.0.0.1:9", model="tiny", tokenizer=file).close()


ENTRIES = ("load", "connect", "convert")


def error_of(entry: str, file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The error ``entry`` ends in for ``file``: a CheckpointError, or convert's one line on stderr."""
    if entry == "convert":
        code = cli.main(["convert", str(file), str(tmp_path / "out")])
        err = capsys.readouterr().err.strip()
        assert code == 1 and err.startswith("langchain-starcoder: error:"), err
        return err
    with pytest.raises(CheckpointError) as info:
        load(file) if entry == "load" else connect(file)
    return str(info.value)


@pytest.fixture(scope="module", autouse=True)
def warm(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each entry run once on a non-GGUF file, so that the measured runs import nothing."""
    tmp = tmp_path_factory.mktemp("warm")
    (tmp / "x.gguf").write_bytes(b"PK\x03\x04" + bytes(100))
    for entry in (load, connect):
        with pytest.raises(CheckpointError):
            entry(tmp / "x.gguf")
    assert cli.main(["convert", str(tmp / "x.gguf"), str(tmp / "out")]) == 1


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_headers_fail_fast_in_bounded_memory(
    case: str, entry: str, good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make, message = HOSTILE[case]
    file = make(good, tmp_path / "hostile.gguf")
    tracemalloc.start()
    start = time.perf_counter()
    try:
        text = error_of(entry, file, tmp_path, capsys)
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert message in text and str(file) in text and "\n" not in text, text
    assert seconds < SECONDS and peak < BYTES, (seconds, peak)
    load(good, sliding_window=WINDOW)  # the next load works


def test_a_declared_block_count_is_checked_against_the_files_tensors(good: Path, tmp_path: Path) -> None:
    """Fewer blocks than the file holds fail as clearly, naming what the file has."""
    file = edited(good, tmp_path / "one.gguf", set_value("starcoder2.block_count", 1))
    with pytest.raises(
        CheckpointError, match=r"block_count is 1, but its tensors are of blocks 0 to 1 \(2 in all\)"
    ):
        load(file)


def test_a_key_llama_cpp_requires_is_required(good: Path, tmp_path: Path) -> None:
    """config.json may leave out the context length (a default applies); a llama.cpp file may not."""

    def rename(reader: gguf.GGUFReader) -> None:
        reader.fields["starcoder2.context_length"].parts[1][-1] = ord("X")

    file = edited(good, tmp_path / "no-context.gguf", rename)
    with pytest.raises(CheckpointError, match=r"has no 'starcoder2\.context_length' in its metadata"):
        load(file)


def test_an_unknown_ggml_type_is_unsupported_not_truncated(good: Path, tmp_path: Path) -> None:
    file = edited(good, tmp_path / "t77.gguf", set_tensor("blk.1.attn_v.weight", 4, 77))
    with pytest.raises(UnsupportedModelError) as info:
        load(file)
    message = str(info.value)
    assert "blk.1.attn_v.weight has ggml type 77" in message and "truncated" not in message
    for supported in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q2_K", "Q4_K", "Q6_K"):
        assert supported in message


# --- metadata: the rules of config.json, plus token ids against the vocabulary ---------------------

#: Metadata written (or replaced) with the gguf package -> the error and what its message names.
BAD_METADATA = {
    "string window": ({"starcoder2.attention.sliding_window": "4096"}, "sliding_window is '4096'"),
    "negative window": ({"starcoder2.attention.sliding_window": -5}, "sliding_window is -5"),
    "eos past the vocabulary": (
        {"tokenizer.ggml.eos_token_id": 5000},
        "tokenizer.ggml.eos_token_id is 5000, but the vocabulary has 1024 tokens",
    ),
    "negative eos": ({"tokenizer.ggml.eos_token_id": -1}, "tokenizer.ggml.eos_token_id is -1"),
    "negative bos": ({"tokenizer.ggml.bos_token_id": -1}, "tokenizer.ggml.bos_token_id is -1"),
    "padding past the tokens": (
        {"tokenizer.ggml.padding_token_id": 1024},
        "tokenizer.ggml.padding_token_id is 1024, but it must be the id of one of its 1024 tokens",
    ),
    "string rope base": ({"starcoder2.rope.freq_base": "1e6"}, "starcoder2.rope.freq_base is '1e6'"),
    "fractional block count": ({"starcoder2.block_count": 2.5}, "starcoder2.block_count is 2.5"),
    "integer epsilon": (  # llama.cpp and config.json's rules want a float
        {"starcoder2.attention.layer_norm_epsilon": 1},
        "starcoder2.attention.layer_norm_epsilon is 1, but it must be a positive float",
    ),
    "heads do not divide": (
        {"starcoder2.attention.head_count": 5},
        "starcoder2.embedding_length 64, starcoder2.attention.head_count 5",
    ),
    "tokens not strings": ({"tokenizer.ggml.tokens": list(range(1024))}, "must be strings"),
}


@pytest.mark.parametrize("entry", ["load", "connect"])
@pytest.mark.parametrize("case", list(BAD_METADATA))
def test_bad_metadata_gets_config_jsons_rules(
    case: str, entry: str, tiny_path: Path, tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metadata, message = BAD_METADATA[case]
    file = write_gguf(tiny_path, tmp_path / "bad.gguf", metadata=metadata)
    text = error_of(entry, file, tmp_path, capsys)
    assert message in text and str(file) in text and "re-convert" in text.lower() and "\n" not in text, text
    load(good, sliding_window=WINDOW)  # the next load works


def test_architecture_of_the_wrong_type_is_unsupported(tiny_path: Path, tmp_path: Path) -> None:
    file = write_gguf(tiny_path, tmp_path / "arch.gguf", metadata={"general.architecture": ["starcoder2"]})
    with pytest.raises(UnsupportedModelError, match=r"holds a \['starcoder2'\] model"):
        load(file)


def test_good_metadata_still_loads(tiny_path: Path, tmp_path: Path) -> None:
    """A window of 0 is full attention; an eos id inside the vocabulary is where generation stops."""
    file = write_gguf(
        tiny_path, tmp_path / "ok.gguf", sliding_window=0, metadata={"tokenizer.ggml.eos_token_id": 5}
    )
    engine = StarCoderEngine.load(file)
    try:
        assert engine.sliding_window is None and engine.eos_token_ids == {5}
    finally:
        engine.close()
