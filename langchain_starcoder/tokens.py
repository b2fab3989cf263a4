"""Text as data, and control tokens as ids, from whatever tokenizer a caller holds.

A prompt's control tokens (``<fim_prefix>``, ``<file_sep>``...) are inserted as ids; text from users
and files is encoded with special-token parsing off, so a literal ``<file_sep>`` in it stays text.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import InvalidParameterError

Encoded = tuple[list[int], list[tuple[int, int]] | None]


@dataclass(frozen=True)
class Codec:
    """What prompt building needs from a tokenizer."""

    encode: Callable[[str], Encoded]
    """Text as data (control-token strings are plain text): ids and, if known, char offsets."""
    token_id: Callable[[str], int | None]
    """The id of a control token, or None if the vocabulary lacks it."""

    def encode_data(self, text: str) -> list[int]:
        return self.encode(text)[0]


_codecs: weakref.WeakKeyDictionary[Any, Codec] = weakref.WeakKeyDictionary()


def tokenizer_copy(backend: Any, *, parse_special_tokens: bool) -> Any:
    """A private copy of a ``tokenizers.Tokenizer`` that parses control-token strings, or reads them
    as plain text. Private: transformers flips the shared one's ``encode_special_tokens`` whenever
    anyone encodes with ``split_special_tokens=True``."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(backend.to_str())
    copy.encode_special_tokens = not parse_special_tokens
    return copy


# ``encode_batch`` lets other Python threads run while it works (``encode`` holds the GIL): a long
# prompt tokenized in a helper thread then never stalls an event loop or the engine's worker.


def _fast_encoder(data: Any) -> Callable[[str], Encoded]:
    def encode(text: str) -> Encoded:
        if not text:
            return [], []
        [encoding] = data.encode_batch([text], add_special_tokens=False)
        return list(encoding.ids), list(encoding.offsets)

    return encode


def codec_for(tokenizer: Any) -> Codec:
    """The codec of a transformers tokenizer, an mlx-lm ``TokenizerWrapper`` or a
    ``tokenizers.Tokenizer`` (built once per tokenizer)."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import Tokenizer

    inner = tokenizer._tokenizer if isinstance(tokenizer, TokenizerWrapper) else tokenizer
    with contextlib.suppress(TypeError):  # not weak-referenceable: build it each time
        if inner in _codecs:
            return _codecs[inner]
    backend = inner if isinstance(inner, Tokenizer) else getattr(inner, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        codec = Codec(_fast_encoder(tokenizer_copy(backend, parse_special_tokens=False)), backend.token_to_id)
    elif callable(getattr(inner, "encode", None)) and callable(getattr(inner, "get_vocab", None)):
        vocab = inner.get_vocab()  # a Python (slow) transformers tokenizer

        def encode(text: str) -> Encoded:
            ids = inner.encode(text, add_special_tokens=False, split_special_tokens=True) if text else []
            return list(ids), None

        codec = Codec(encode, vocab.get)
    else:
        msg = (
            "Expected a StarCoderEngine, a transformers tokenizer, an mlx-lm TokenizerWrapper or a "
            f"tokenizers.Tokenizer, not {type(tokenizer).__name__}."
        )
        raise InvalidParameterError(msg)
    with contextlib.suppress(TypeError):
        _codecs[inner] = codec
    return codec


def parsing_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """Encode text with control-token strings parsed (a hand-written prompt)."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    inner = tokenizer._tokenizer if isinstance(tokenizer, TokenizerWrapper) else tokenizer
    parsed = tokenizer_copy(getattr(inner, "backend_tokenizer", inner), parse_special_tokens=True)
    return lambda text: parsed.encode_batch([text], add_special_tokens=False)[0].ids


def encode_segments(
    codec: Codec, control_tokens: Iterable[str], segments: Iterable[tuple[str, bool]]
) -> list[int]:
    """Ids of a prompt given in pieces ``(text, is_data)``: control-token strings become control
    tokens only in pieces that are not data. Each run of text between two control tokens is
    encoded in one piece, as the tokenizer splits a hand-written prompt, so ordinary text gets
    exactly the ids of the joined string."""
    controls = sorted(control_tokens, key=len, reverse=True)
    split = re.compile("(" + "|".join(map(re.escape, controls)) + ")") if controls else None
    ids: list[int] = []
    run: list[str] = []
    for text, is_data in segments:
        parts = [text] if is_data or split is None else split.split(text)
        for i, part in enumerate(parts):
            if i % 2:  # a control token of template text
                ids += codec.encode_data("".join(run))
                ids.append(codec.token_id(part))
                run = []
            elif part:
                run.append(part)
    return ids + codec.encode_data("".join(run))
