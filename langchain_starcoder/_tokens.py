"""Text as data, and control tokens as ids, from whatever tokenizer a caller holds.

A prompt's control tokens (``<fim_prefix>``, ``<file_sep>``...) are inserted as ids; text from users
and files is encoded with special-token parsing off, so a literal ``<file_sep>`` in it stays text.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import re
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidParameterError

Encoded = tuple[list[int], list[tuple[int, int]] | None]


@dataclass(frozen=True)
class Codec:
    """What prompt building needs from a tokenizer."""

    encode: Callable[[str], Encoded]
    """Text as data (control-token strings are plain text): ids and, if known, char offsets."""
    encode_data: Callable[[str], list[int]]
    """Text as data, ids only (no offsets: a long prompt costs half the memory)."""
    control_tokens: frozenset[str]
    """The control-token strings (see :func:`control_tokens`)."""
    token_id: Callable[[str], int | None]
    """The id of a control token, or None if the tokenizer has no such control token."""
    longest_token: int | None
    """The most characters of text one token stands for, or None where the tokenizer bounds it not
    (see :func:`max_text_chars`)."""


_codecs: weakref.WeakKeyDictionary[Any, Codec] = weakref.WeakKeyDictionary()


def tokenizer_copy(backend: Any, *, parse_special_tokens: bool) -> Any:
    """A private copy of a ``tokenizers.Tokenizer`` that parses control-token strings, or reads them
    as plain text. Private: transformers flips the shared one's ``encode_special_tokens`` whenever
    anyone encodes with ``split_special_tokens=True``."""
    return _copy(backend.to_str(), parse_special_tokens)


def _copy(spec: str, parse_special_tokens: bool) -> Any:
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(spec)
    copy.encode_special_tokens = not parse_special_tokens
    return copy


# ``encode_batch`` lets other Python threads run while it works (``encode`` holds the GIL): a long
# prompt tokenized in a helper thread then never stalls an event loop or the engine's worker.


def _fast_encoders(data: Any) -> tuple[Callable[[str], Encoded], Callable[[str], list[int]]]:
    def encode(text: str) -> Encoded:
        if not text:
            return [], []
        [encoding] = data.encode_batch([text], add_special_tokens=False)
        ids, offsets = list(encoding.ids), list(encoding.offsets)
        del encoding
        _give_back(text)
        return ids, offsets

    def encode_ids(text: str) -> list[int]:
        return _ids(data, text) if text else []

    return encode, encode_ids


#: From this many characters on, a tokenization's memory goes back to the system at once: glibc
#: keeps what the tokenizer's threads freed (measured: ~110 MiB per MB of text, until the next one
#: reuses it); ``malloc_trim`` returns it in ~1% of the tokenizing time (29 ms after a 2 MB text).
_GIVE_BACK_CHARS = 1 << 20


def _ids(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
    _give_back(text)  # once the encoding is freed
    return ids


def _give_back(text: str) -> None:
    """Return a long text's tokenization memory, freed by now, to the system."""
    if len(text) >= _GIVE_BACK_CHARS and (trim := _malloc_trim()) is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc
    except (AttributeError, OSError):  # macOS and musl have none (and need none)
        return None


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
        spec = backend.to_str()
        controls = frozenset(t.content for t in backend.get_added_tokens_decoder().values() if t.special)
        encode, encode_ids = _fast_encoders(_copy(spec, parse_special_tokens=False))
        token_id, longest = backend.token_to_id, _longest_token(json.loads(spec))
    elif all(callable(getattr(inner, name, None)) for name in ("encode", "get_vocab")) and isinstance(
        getattr(inner, "added_tokens_decoder", None), Mapping
    ):  # a Python (slow) transformers tokenizer
        controls = frozenset(t.content for t in inner.added_tokens_decoder.values() if t.special)
        token_id, longest = inner.get_vocab().get, None

        def encode(text: str) -> Encoded:
            ids = inner.encode(text, add_special_tokens=False, split_special_tokens=True) if text else []
            return list(ids), None

        def encode_ids(text: str) -> list[int]:
            return encode(text)[0]
    else:
        msg = (
            "Expected a StarCoderEngine, a transformers tokenizer, an mlx-lm TokenizerWrapper, a "
            "tokenizers.Tokenizer, or a tokenizer with encode, get_vocab and added_tokens_decoder (its "
            f"control tokens), not {type(tokenizer).__name__}."
        )
        raise InvalidParameterError(msg)
    codec = Codec(
        encode, encode_ids, controls, lambda token: token_id(token) if token in controls else None, longest
    )
    with contextlib.suppress(TypeError):
        _codecs[inner] = codec
    return codec


def control_tokens(tokenizer: Any) -> frozenset[str]:
    """The control-token strings of a tokenizer: its added tokens marked special.

    The one definition everywhere (raw prompts, template text, chat templates, FIM tokens, stops):
    the tokenizer's own, so that what a hand-written prompt parses is what a template's text does.
    Not ``all_special_tokens``: that lists only what tokenizer_config.json names, and a valid
    tokenizer.json may mark ``<file_sep>`` and the FIM tokens special without it.
    """
    return codec_for(tokenizer).control_tokens


def max_text_chars(tokenizer: Any, max_tokens: int) -> int | None:
    """The longest text, in characters, that can encode to ``max_tokens`` tokens or fewer.

    A longer text cannot fit in ``max_tokens``, so it can be refused before it is tokenized
    (tokenizing 40 MB takes minutes and GBs). The bound is ``max_tokens`` times the most characters
    one token stands for: its vocabulary entry's length (a byte-level entry has a character per byte,
    and text has at least a byte per character), computed once per tokenizer. None where the
    tokenizer bounds no such length: a normalizer or pre-tokenizer that may drop text, a non-BPE
    model, an unknown token that swallows runs, or an added token that strips whitespace.
    """
    longest = codec_for(tokenizer).longest_token
    return None if longest is None else max_tokens * longest


# Pre-tokenizers that keep every character of the text (others, e.g. Whitespace, drop some).
_KEEPING_PRE_TOKENIZERS = frozenset(
    {"ByteLevel", "Digits", "Metaspace", "Punctuation", "Split", "UnicodeScripts"}
)


def _keeps_text(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return True
    if pre_tokenizer.get("type") == "Sequence":
        return all(_keeps_text(p) for p in pre_tokenizer.get("pretokenizers", []))
    return pre_tokenizer.get("type") in _KEEPING_PRE_TOKENIZERS and pre_tokenizer.get("behavior") != "Removed"


def _longest_token(spec: dict[str, Any]) -> int | None:
    """See :func:`max_text_chars`; ``spec`` is the tokenizer.json."""
    model, added = spec.get("model") or {}, spec.get("added_tokens") or []
    if (
        spec.get("normalizer") is not None
        or not _keeps_text(spec.get("pre_tokenizer"))
        or model.get("type") != "BPE"
        or (model.get("unk_token") is not None and model.get("fuse_unk"))
        or any(t.get("lstrip") or t.get("rstrip") for t in added)
    ):
        return None
    return max(map(len, [*model.get("vocab", {}), *(t["content"] for t in added)]), default=1)


def parsing_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """Encode text with control-token strings parsed (a hand-written prompt)."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    inner = tokenizer._tokenizer if isinstance(tokenizer, TokenizerWrapper) else tokenizer
    parsed = tokenizer_copy(getattr(inner, "backend_tokenizer", inner), parse_special_tokens=True)
    return functools.partial(_ids, parsed)


def encode_segments(codec: Codec, segments: Iterable[tuple[str, bool]]) -> list[int]:
    """Ids of a prompt given in pieces ``(text, is_data)``: control-token strings become control
    tokens only in pieces that are not data. Each run of text between two control tokens is
    encoded in one piece, as the tokenizer splits a hand-written prompt, so ordinary text gets
    exactly the ids of the joined string."""
    controls = sorted(codec.control_tokens, key=len, reverse=True)
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
