"""GGUF files converted from checkpoint folders once and kept in the user's cache.

A file is named after its folder and type, and trusted for what it holds inside: the fingerprint of the
files it was converted from (``SOURCE_KEY``: config, tokenizer and weights, each hashed whole) and their
stamps (``SOURCE_FILES_KEY``). Every load checks it: a file whose sources kept their stamps is used
without reading them again; a changed one is hashed again, and a stale conversion or another model's
file under this name is converted again, never served.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..errors import CheckpointError, StarCoderError
from ..loading.digests import file_digest, file_stamp
from ..loading.private_folder import Folder, NotPrivateError
from .header import read_header
from .write import convert_to_gguf

#: Where converted files go: ``$LANGCHAIN_STARCODER_CACHE/gguf``, else the user's cache folder.
CACHE_ENV = "LANGCHAIN_STARCODER_CACHE"
#: Metadata keys of a converted file: the fingerprint of its sources, and their stamps and digests (JSON).
SOURCE_KEY = "langchain_starcoder.source_fingerprint"
SOURCE_FILES_KEY = "langchain_starcoder.source_files"
_TEXT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    if not root:
        root = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "langchain-starcoder"
    return Path(root).expanduser() / "gguf"


def source_files(checkpoint: Path) -> list[Path]:
    """The files a conversion reads: config, tokenizer and weights."""
    texts = [checkpoint / name for name in _TEXT_FILES if (checkpoint / name).is_file()]
    return texts + sorted(checkpoint.glob("*.safetensors"))


def source_fingerprint(digests: dict[str, str], outtype: str) -> str:
    """One digest of the source files' names and contents and the GGUF type they are converted to."""
    text = json.dumps([outtype, sorted(digests.items())])
    return hashlib.blake2b(text.encode(), digest_size=20).hexdigest()


def cached_gguf(checkpoint: Path, outtype: str, directory: Path | None = None) -> Path:
    """``checkpoint`` as a GGUF file of ``outtype``: the cached one if it was converted from these
    files, else converted now (written beside its place, then moved there: a crash leaves no half file)."""
    directory = directory or cache_dir()
    config = json.loads((checkpoint / "config.json").read_text())
    where = hashlib.blake2b(str(checkpoint.resolve()).encode(), digest_size=10).hexdigest()
    name = f"{config.get('model_type', 'model')}-{where}-{outtype}.gguf"
    target = directory / name
    files = source_files(checkpoint)
    _private_folder(directory)
    if target.is_file() and _converted_from(target, files, outtype):
        return target
    # stamped before they are read: an edit during the conversion is seen at the next load
    stamps = {file.name: file_stamp(file) for file in files}
    digests = {file.name: file_digest(file, stamps[file.name]) for file in files}
    record = {name: {**stamp.fields(), "digest": digests[name]} for name, stamp in stamps.items()}
    metadata = {SOURCE_KEY: source_fingerprint(digests, outtype), SOURCE_FILES_KEY: json.dumps(record)}
    partial = directory / f".{name}.{os.getpid()}.partial"
    try:
        convert_to_gguf(checkpoint, partial, outtype=outtype, metadata=metadata)
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def _converted_from(gguf: Path, files: list[Path], outtype: str) -> bool:
    """Whether ``gguf`` holds the fingerprint of ``files`` now: a file whose stamp is the one stored
    is not read again; any other is hashed whole."""
    try:
        metadata = read_header(gguf).metadata
        stored = json.loads(metadata.get(SOURCE_FILES_KEY, "{}"))
    except (CheckpointError, TypeError, ValueError):  # damaged, or not one of ours: convert again
        return False
    if not isinstance(stored, dict):
        return False
    digests = {}
    for file in files:
        stamp, entry = file_stamp(file), stored.get(file.name)
        known = entry.get("digest") if stamp.matches(entry) else None
        digests[file.name] = file_digest(file, stamp, known if isinstance(known, str) else None)
    return metadata.get(SOURCE_KEY) == source_fingerprint(digests, outtype)


def _private_folder(directory: Path) -> None:
    """Make the cache folder (0700), and refuse one that another user owns or that its group or others
    may write: whoever can write it could put other weights there, fingerprint and all, for us to serve."""
    try:
        with Folder.made(directory, "The GGUF cache folder"):
            pass
    except NotPrivateError as err:
        msg = (
            f"{err}: it is not yours alone, and another user could replace the converted model there. Use a "
            f"folder only you can write (llama_cpp cache_dir=..., or ${CACHE_ENV}), or chmod go-w it."
        )
        raise StarCoderError(msg) from None
