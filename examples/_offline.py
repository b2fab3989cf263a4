"""The examples' one fallback for a model they cannot get (a helper, not an example).

Every example's default model comes from the Hugging Face hub. With no hub access (offline, or
``HF_HUB_OFFLINE=1``) and no copy in the local hub cache, the example says so and runs on a small
checkpoint with random weights, built offline once under ``~/.cache/langchain-starcoder`` (its output
is nonsense, but every step is real). A model you named yourself that cannot be found ends the
example with its one-line message instead.
"""

from __future__ import annotations

from pathlib import Path

from langchain_starcoder import ModelNotFoundError
from langchain_starcoder.loading import resolve_model_path
from langchain_starcoder.registry import DEFAULT_MODEL
from langchain_starcoder.testing import INSTRUCT_CHAT_TEMPLATE, build_starcoder2


def model_or_offline(model: str, default: str = DEFAULT_MODEL, *, instruct: bool = False) -> str:
    """``model`` if it can be had (a folder, or a hub id downloaded or cached), else the offline checkpoint.

    Only the example's ``default`` falls back; any other model that cannot be found exits with the
    error's message. ``instruct`` builds the offline checkpoint with a chat template.
    """
    try:
        resolve_model_path(model)  # a hub id is downloaded once here; loading it then reads the cache
    except ModelNotFoundError as err:
        if model != default:
            raise SystemExit(f"error: {err}") from None
        kind = "instruct " if instruct else ""
        path = Path.home() / ".cache" / "langchain-starcoder" / f"offline-tiny{'-instruct' * instruct}"
        print(f"{err}\n-> Using an offline {kind}checkpoint with random weights at {path}.\n", flush=True)
        if not (path / "config.json").is_file():  # config.json is written last
            build_starcoder2(path, chat_template=INSTRUCT_CHAT_TEMPLATE if instruct else None)
        return str(path)
    return model
