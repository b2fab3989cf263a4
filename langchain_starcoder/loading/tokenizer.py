"""The checkpoint's tokenizer, with a streaming detokenizer that keeps code's leading space."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlx_lm.tokenizer_utils import (
    BPEStreamingDetokenizer,
    NaiveStreamingDetokenizer,
    TokenizerWrapper,
)

from ..errors import CheckpointError
from .config import _FIX


def check_tokenizer_files(path: Path) -> None:
    if (path / "tokenizer.json").is_file() or (
        (path / "vocab.json").is_file() and (path / "merges.txt").is_file()
    ):
        return
    msg = (
        f"{path} has no tokenizer (tokenizer.json, or vocab.json + merges.txt); "
        "copy it from the original checkpoint."
    )
    raise CheckpointError(msg)


class CodeDetokenizer(BPEStreamingDetokenizer):
    """mlx-lm's byte-level streaming detokenizer, minus its trimming of a leading space.

    In code a completion's first space is content (``def f():`` + `` return``), so we keep it.
    """

    def _maybe_trim_space(self, current_text: str) -> str:
        return current_text


def load_tokenizer(path: Path, config: dict[str, Any]) -> TokenizerWrapper:
    """The checkpoint's tokenizer in mlx-lm's wrapper, with a streaming detokenizer for code.

    With a tokenizer.json it is loaded as is: transformers 5's AutoTokenizer, seeing StarCoder's
    ``tokenizer_class: GPT2Tokenizer``, swaps its digit-splitting pre-tokenizer for plain byte-level,
    and code with spaces before digits would encode differently from the model's own tokenizer.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    check_tokenizer_files(path)
    loader = PreTrainedTokenizerFast if (path / "tokenizer.json").is_file() else AutoTokenizer
    try:
        hf_tokenizer = loader.from_pretrained(path, trust_remote_code=False)
    except _config_errors() as e:
        # transformers 5 reads and type-checks config.json too, keys we do not use included.
        msg = (
            f"{path / 'config.json'} does not pass transformers' checks ({e}); it reads the config "
            f"to build the tokenizer. {_FIX}"
        )
        raise CheckpointError(msg) from e
    except Exception as e:  # transformers raises many types for a broken tokenizer
        msg = f"Could not load the tokenizer in {path}: {e}"
        raise CheckpointError(msg) from e
    decoder = {}
    if (path / "tokenizer.json").is_file():
        decoder = json.loads((path / "tokenizer.json").read_text(encoding="utf-8")).get("decoder") or {}
    byte_level = decoder.get("type") == "ByteLevel"
    eos = config.get("eos_token_id")
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    return TokenizerWrapper(
        hf_tokenizer,
        CodeDetokenizer if byte_level else NaiveStreamingDetokenizer,
        eos_token_ids=eos_ids,
    )


def _config_errors() -> tuple[type[Exception], ...]:
    """What transformers raises for a config.json field of the wrong type (huggingface_hub >= 1.0)."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # older versions do not type-check configs
        return ()
    return (StrictDataclassError,)
