"""Prompt-cache folders under attack (issue 29, items 7 and 8): the folder and its files are private
whatever the umask; a folder, file or digest memo that another user could have written is not
trusted; a crafted file's header is checked against the model's cache layout before its data is read.

Another user's files are made with ``chown`` to uid 65534 (nobody): the tests run as root, as CI does.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.backends.prompt_cache import PromptCacheNotice
from langchain_starcoder.backends.prompt_cache.files import read_cache_file
from langchain_starcoder.backends.prompt_cache.fingerprint import weight_files
from langchain_starcoder.testing import build_starcoder2
from langchain_starcoder.types import Completion

SHARED = "".join(f"def handler_{i}(request):\n    return respond(request, code={i * 7})\n" for i in range(36))
PROMPT = SHARED + "\n\ndef main():\n    "
OTHER = "# another file\n" * 120 + SHARED  # shares no prefix with PROMPT: a file of its own
NOBODY = 65534


def keep(model: Path, folder: Path) -> list[int]:
    """Generate PROMPT with a new engine keeping its cache in ``folder``: the ids (and one file)."""
    engine = StarCoderEngine.load(model, prompt_cache_dir=folder)
    try:
        return engine.generate(PROMPT, max_tokens=12).token_ids
    finally:
        engine.close()


def answer(model: Path, folder: Path, prompts: list[str]) -> tuple[list[Completion], list[str]]:
    """Generate ``prompts`` with a new engine on ``folder``: the completions and the notices (the
    engine is closed inside, so its writer's notices are caught too)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = StarCoderEngine.load(model, prompt_cache_dir=folder)
        try:
            done = [engine.generate(p, max_tokens=12) for p in prompts]
        finally:
            engine.close()
    return done, [str(w.message) for w in caught if issubclass(w.category, PromptCacheNotice)]


def fresh(model: Path, prompt: str) -> list[int]:
    engine = StarCoderEngine.load(model)
    try:
        return engine.generate(prompt, max_tokens=12).token_ids
    finally:
        engine.close()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def cache_file(folder: Path) -> Path:
    (path,) = folder.glob("*.safetensors")
    return path


def listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# --- item 7: private folders and files -----------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask 022", "umask 000"])
def test_the_folder_its_parents_and_files_are_private(tmp_path: Path, umask: int) -> None:
    model = build_starcoder2(tmp_path / "model", seed=11)  # new weights: their digests are written too
    folder = tmp_path / "home" / ".cache" / "prompt-cache"
    old = os.umask(umask)
    try:
        keep(model, folder)
    finally:
        os.umask(old)
    assert [mode(p) for p in (folder.parent.parent, folder.parent, folder)] == [0o700] * 3
    files = {p.name: mode(p) for p in folder.iterdir()}
    assert {".fingerprints.json", ".lock", cache_file(folder).name} == set(files)
    assert files == dict.fromkeys(files, 0o600)


def _another_user_owns(path: Path) -> None:
    os.chown(path, NOBODY, NOBODY)


def _group_can_write(path: Path) -> None:
    path.chmod(0o770)


def _anyone_can_write(path: Path) -> None:
    path.chmod(0o1777)  # as /tmp is: sticky, but anyone adds files


@pytest.mark.parametrize(
    ("loosen", "why"),
    [
        (_another_user_owns, f"is owned by another user (uid {NOBODY})"),
        (_group_can_write, "can be written by its group (mode 770)"),
        (_anyone_can_write, "can be written by its group and others (mode 1777)"),
    ],
    ids=["another user's", "group-writable", "world-writable"],
)
def test_a_folder_others_could_write_is_not_used(
    tiny_path: Path, tmp_path: Path, loosen: Callable[[Path], None], why: str
) -> None:
    folder = tmp_path / "shared"
    expected = keep(tiny_path, folder)
    loosen(folder)
    before = listing(folder)
    done, notices = answer(tiny_path, folder, [PROMPT, OTHER])
    assert len(notices) == 1, notices
    assert f"The prompt-cache folder {folder} {why}" in notices[0] and "chmod go-w" in notices[0]
    assert [d.cached_tokens for d in done] == [0, 0]  # its file is not read
    assert done[0].token_ids == expected
    assert listing(folder) == before  # nothing written, nothing removed


def _file_of_another_user(path: Path) -> None:
    os.chown(path, NOBODY, NOBODY)


def _group_writable_file(path: Path) -> None:
    path.chmod(0o660)


def _link_to_a_file_elsewhere(path: Path) -> None:
    elsewhere = path.parent.parent / "elsewhere"
    elsewhere.mkdir()
    path.rename(elsewhere / path.name)
    path.symlink_to(elsewhere / path.name)


@pytest.mark.parametrize(
    ("plant", "why"),
    [
        (_file_of_another_user, f"it is owned by another user (uid {NOBODY})"),
        (_group_writable_file, "it can be written by its group (mode 660)"),
        (_link_to_a_file_elsewhere, "it is a symbolic link"),
    ],
    ids=["another user's", "group-writable", "a link"],
)
def test_a_file_others_could_have_written_is_skipped_and_removed(
    tiny_path: Path, tmp_path: Path, plant: Callable[[Path], None], why: str
) -> None:
    folder = tmp_path / "cache"
    expected = keep(tiny_path, folder)
    path = cache_file(folder)
    plant(path)  # the file would be valid: only who could have written it is wrong
    done, notices = answer(tiny_path, folder, [PROMPT])
    assert notices == [f"Skipped and removed the prompt-cache file {path}: {why}."]
    assert done[0].cached_tokens == 0 and done[0].token_ids == expected
    # Written anew by this engine: ours, a regular file, 0600.
    assert stat.S_ISREG(path.lstat().st_mode) and path.stat().st_uid == os.geteuid() and mode(path) == 0o600


@pytest.mark.parametrize(
    "loosen", [_file_of_another_user, _group_writable_file], ids=["another user's", "group-writable"]
)
def test_forged_digests_do_not_make_one_model_answer_from_anothers_caches(
    tmp_path: Path, loosen: Callable[[Path], None]
) -> None:
    model_a = build_starcoder2(tmp_path / "a", seed=12)
    model_b = build_starcoder2(tmp_path / "b", seed=13)  # same shapes and tokenizer, other weights
    folder = tmp_path / "cache"
    keep(model_a, folder)
    memo_path = folder / ".fingerprints.json"
    memo = json.loads(memo_path.read_text())
    digest_a = {Path(p).name: e["digest"] for p, e in memo.items() if Path(p).parent == model_a.resolve()}
    for file in weight_files(model_b):  # B's files as they are, with A's digests
        st = file.stat()
        memo[str(file.resolve())] = {
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "ino": st.st_ino,
            "digest": digest_a[file.name],
        }
    memo_path.write_text(json.dumps(memo))
    loosen(memo_path)
    done, _ = answer(model_b, folder, [PROMPT])
    assert done[0].cached_tokens == 0  # B's own digests: another key than A's file
    assert done[0].token_ids == fresh(model_b, PROMPT)
    st = memo_path.lstat()  # rewritten by this engine, with B's true digests
    assert st.st_uid == os.geteuid() and mode(memo_path) == 0o600
    assert all(
        json.loads(memo_path.read_text())[str(f.resolve())]["digest"] != digest_a[f.name]
        for f in weight_files(model_b)
        if f.suffix == ".safetensors"
    )


def test_caches_of_an_older_version_are_used_and_made_private(tiny_path: Path, tmp_path: Path) -> None:
    """An older version made the folder 0755 and its files 0644: no one else could write them, so
    they are used; a file's token ids print the prompts' source, so it becomes 0600 when read. The
    folder keeps the mode it has (it may be one the user chose)."""
    folder = tmp_path / "cache"
    expected = keep(tiny_path, folder)
    folder.chmod(0o755)
    path = cache_file(folder)
    path.chmod(0o644)
    done, notices = answer(tiny_path, folder, [PROMPT])
    assert notices == []
    assert done[0].cached_tokens == done[0].prompt_tokens - 1 and done[0].token_ids == expected
    assert (mode(folder), mode(path)) == (0o755, 0o600)


# --- item 8: a crafted file is refused before its data is read ----------------------------------

_WIDTH = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4, "I32": 4}
HUGE = 2 << 30  # bytes of data the crafted headers describe (a sparse file: no disk is used)


def write_sparse(path: Path, entries: dict[str, dict], metadata: dict[str, str]) -> int:
    """Write a header of ``entries`` (laid end to end, in the order given) and ``metadata`` at
    ``path`` and extend the file, sparse, to the size it describes; that size."""
    header, offset = {}, 0
    for name, entry in entries.items():
        nbytes = math.prod(entry["shape"]) * _WIDTH[entry["dtype"]]
        header[name] = {**entry, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps({**header, "__metadata__": metadata}).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    return 8 + len(raw) + offset


def _larger_shapes(entries: dict[str, dict], metadata: dict[str, str]) -> None:
    """The first layer's keys claim HUGE bytes of positions; the tokens are the real ones."""
    keys = entries["0.0"]
    *head, dim = keys["shape"]
    keys["shape"] = [*head[:2], HUGE // (head[0] * head[1] * dim * _WIDTH[keys["dtype"]]), dim]


def _more_tokens_than_the_context(entries: dict[str, dict], metadata: dict[str, str]) -> None:
    """Consistent shapes for far more tokens than the model's context (the real ones first)."""
    tokens = json.loads(metadata["0.tokens"])
    per_token = sum(
        math.prod(e["shape"]) * _WIDTH[e["dtype"]] // len(tokens) for e in entries.values() if e["shape"]
    )
    n = HUGE // per_token
    metadata["0.tokens"] = json.dumps(tokens + [1] * (n - len(tokens)), separators=(",", ":"))
    for entry in entries.values():
        if entry["shape"]:
            entry["shape"][2] = n


def bytes_read() -> int:
    """What this process has read through read() so far (page cache included), from /proc."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.parametrize("craft", [_larger_shapes, _more_tokens_than_the_context], ids=["shapes", "tokens"])
def test_a_huge_crafted_file_is_refused_before_its_data_is_read(
    tiny_path: Path, tmp_path: Path, craft: Callable[[dict, dict], None]
) -> None:
    folder = tmp_path / "cache"
    expected = keep(tiny_path, folder)
    path = cache_file(folder)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    metadata = header.pop("__metadata__")  # the right key: as if copied from a real file
    entries = {name: {"dtype": e["dtype"], "shape": e["shape"]} for name, e in header.items()}
    craft(entries, metadata)
    size = write_sparse(path, entries, metadata)
    assert size > HUGE and path.stat().st_blocks * 512 < 64 << 20  # sparse: no disk used
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = StarCoderEngine.load(tiny_path, prompt_cache_dir=folder)
        try:
            before = bytes_read()
            done = engine.generate(PROMPT, max_tokens=12)
            read = bytes_read() - before
            engine.backend._disk.flush()
        finally:
            engine.close()
    notices = [str(w.message) for w in caught if issubclass(w.category, PromptCacheNotice)]
    assert len(notices) == 1 and path.name in notices[0], notices
    assert read < 1 << 20, f"{read} bytes read for a request beside a {size}-byte file"
    assert done.cached_tokens == 0 and done.token_ids == expected
    read_cache_file(path)  # written anew by this engine: whole
    assert path.stat().st_size < 16 << 20
