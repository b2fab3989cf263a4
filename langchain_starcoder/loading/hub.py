"""Where a checkpoint is: a local folder as it is, or a hub id downloaded (safetensors only)."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelNotFoundError

#: What a download fetches: configs, tokenizer, safetensors weights. Never pickled ``.bin`` files.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.jinja", "tokenizer.model"]


def resolve_model_path(model: str | os.PathLike[str], revision: str | None = None) -> Path:
    """A local folder as it is, or a hub id downloaded (and cached) with huggingface_hub.

    ``HF_HUB_OFFLINE=1`` makes this use the local hub cache only. Only configs, tokenizer files and
    safetensors weights are fetched.
    """
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            msg = f"{path} is a file; pass the checkpoint folder that holds config.json."
            raise ModelNotFoundError(msg)
        return path
    name = str(model)
    if not is_hub_id(name):
        msg = (
            f"No model folder at {path} and {name!r} is not a hub id (owner/name). "
            "Check the path, or build an offline checkpoint with "
            "`langchain-starcoder build-test-model DST`."
        )
        raise ModelNotFoundError(msg)
    return _download(name, revision)


def is_hub_id(name: str) -> bool:
    """Whether ``name`` has the shape of a hub id (owner/name) rather than of a local path."""
    return not name.startswith((".", "/", "~")) and name.count("/") == 1


def _download(repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=ALLOW_PATTERNS)
    except Exception as e:  # raised "from None": the hub's chained errors (50 lines of httpx) bury it
        raise download_error(e, repo_id, revision) from None
    return Path(folder)


def download_error(
    error: Exception, repo_id: str, revision: str | None, filename: str | None = None
) -> Exception:
    """The hub client's ``error`` as one ModelNotFoundError that says what to do (others as they are)."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = repr(repo_id) if filename is None else f"{filename} of {repo_id!r}"
    if isinstance(error, RevisionNotFoundError):
        msg = f"Hub model {repo_id!r} has no revision {revision!r}; check the branch, tag or commit."
    elif isinstance(error, GatedRepoError):
        msg = f"Hub model {repo_id!r} is gated: accept its licence on the hub and log in (`hf auth login`)."
    elif isinstance(error, RepositoryNotFoundError):
        msg = f"Hub model {repo_id!r} does not exist (or is private: log in with `hf auth login`)."
    elif isinstance(error, HFValidationError):
        msg = f"{repo_id!r} is neither a local folder nor a valid hub id: {error}"
    elif isinstance(error, LocalEntryNotFoundError):  # (before EntryNotFoundError: it is one)
        msg = (
            f"Could not download {what}: the hub cannot be reached (or HF_HUB_OFFLINE is set) "
            "and it is not in the local cache. Connect once to download it, or pass a local "
            "folder (`langchain-starcoder build-test-model DST` builds one offline)."
        )
    elif isinstance(error, EntryNotFoundError):
        msg = f"Hub model {repo_id!r} has no file {filename!r}; check the name (case matters)."
    elif isinstance(error, (OSError, ValueError)):
        msg = f"Download of {what} failed: {error}. Nothing was loaded; run again to resume it."
    else:
        return error
    return ModelNotFoundError(msg)
