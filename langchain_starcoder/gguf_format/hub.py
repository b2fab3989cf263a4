"""Where a GGUF file is: a local path, a file in a folder, or one file of a hub repo, downloaded."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelNotFoundError
from ..loading import is_hub_id
from ..loading.hub import download_error


def is_gguf(model: str | os.PathLike[str], gguf_file: str | None) -> bool:
    return gguf_file is not None or os.fspath(model).lower().endswith(".gguf")


def resolve_gguf_file(model: str | os.PathLike[str], gguf_file: str | None, revision: str | None) -> Path:
    """The local GGUF file: ``model`` itself (a .gguf path), ``gguf_file`` in a local folder, or
    ``gguf_file`` of a hub repo downloaded (that one file) with huggingface_hub."""
    path = Path(model).expanduser()
    if gguf_file is None:
        if not path.is_file():
            msg = f"No GGUF file at {path}."
            raise ModelNotFoundError(msg)
        return path
    if path.is_dir():
        file = path / gguf_file
        if not file.is_file():
            found = sorted(p.name for p in path.glob("*.gguf"))
            msg = f"{path} has no {gguf_file}" + (f"; it has {found}." if found else ".")
            raise ModelNotFoundError(msg)
        return file
    name = os.fspath(model)
    if not is_hub_id(name):
        msg = f"No folder at {path} and {name!r} is not a hub id (owner/name) to fetch {gguf_file} from."
        raise ModelNotFoundError(msg)
    return _download(name, gguf_file, revision)


def _download(repo_id: str, filename: str, revision: str | None) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        file = hf_hub_download(repo_id, filename, revision=revision)
    except Exception as e:  # raised "from None", as loading's: the hub's chained errors bury it
        raise download_error(e, repo_id, revision, filename) from None
    return Path(file)
