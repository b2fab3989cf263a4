"""Building a remote engine: the tokenizer of a served checkpoint and the byte table the remote
backend rebuilds withheld ids with (:meth:`~langchain_starcoder.StarCoderEngine.connect` documents
the options; ``load`` builds its MLX backend in the class itself)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..backends import Backend
from ..tokens import codec_for


def connect_backend(
    base_url: str,
    *,
    model: str,
    tokenizer: str | os.PathLike[str] | None,
    api_key: str | None,
    timeout: float,
    deadline: float | None,
    max_retries: int,
    max_concurrency: int,
) -> tuple[Backend, Any]:
    """The backend of a vLLM or llama.cpp server and the tokenizer of its model."""
    from ..backends.remote import RemoteBackend
    from ..loading import load_tokenizer, model_args, read_config

    source = model if tokenizer is None else tokenizer
    from ..gguf_format import gguf_tokenizer, is_gguf, read_gguf

    if is_gguf(source, None) and os.path.isfile(source):
        gguf = read_gguf(source)  # its header: the tokenizer and config, not the weights
        config, tokenizer_ = gguf.config, gguf_tokenizer(gguf)
    else:
        path = _tokenizer_folder(source)
        config = read_config(path)
        tokenizer_ = load_tokenizer(path, config)
    args = model_args(config)
    backend = RemoteBackend(
        base_url, model=model, api_key=api_key, timeout=timeout, deadline=deadline,
        max_retries=max_retries, max_concurrency=max_concurrency, vocab_size=args.vocab_size,
        context_length=args.max_position_embeddings, token_bytes=_token_bytes(tokenizer_),
    )  # fmt: skip
    return backend, tokenizer_


#: The files a remote engine needs from the hub: the tokenizer and configs, never weights.
_TOKENIZER_PATTERNS = ["*.json", "*.txt", "*.jinja", "tokenizer.model"]


def _tokenizer_folder(source: str | os.PathLike[str]) -> Any:
    """A local folder as it is; a hub id's tokenizer and config files, downloaded (and cached)."""
    from ..errors import ModelNotFoundError
    from ..loading import is_hub_id

    path = Path(source).expanduser()
    if path.is_dir():
        return path
    name = os.fspath(source)
    if path.exists() or not is_hub_id(name):
        msg = (
            f"The tokenizer comes from a checkpoint folder or a hub id (owner/name); {name!r} is "
            "neither. Pass tokenizer= with the served model's checkpoint folder or hub id."
        )
        raise ModelNotFoundError(msg)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, allow_patterns=_TOKENIZER_PATTERNS))
    except Exception as e:  # the hub client raises many types; ours says which model and why
        msg = f"Could not fetch the tokenizer of {name!r} from the hub: {e}"
        raise ModelNotFoundError(msg) from None


def _token_bytes(tokenizer: Any) -> dict[bytes, int] | None:
    """Each non-control token's bytes -> its id, for a byte-level BPE vocabulary (else None)."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, _byte_decoder

    if not isinstance(tokenizer.detokenizer, BPEStreamingDetokenizer):
        return None
    codec = codec_for(tokenizer)
    decoder, special = _byte_decoder(), {codec.token_id(t) for t in codec.control_tokens}
    table: dict[bytes, int] = {}
    for token, i in tokenizer.get_vocab().items():
        if i not in special and all(c in decoder for c in token):
            table.setdefault(bytes(decoder[c] for c in token), i)
    return table
