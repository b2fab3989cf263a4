"""The tokenizer a GGUF file carries (``tokenizer.ggml.*``), as the model's Hugging Face tokenizer."""

from __future__ import annotations

import reprlib
from typing import Any

from ..errors import CheckpointError, UnsupportedModelError
from ..loading import model_args
from .checkpoint import GGUFCheckpoint

_CONTROL, _USER_DEFINED = 3, 4
_PRE_TOKENIZERS = ("starcoder",)
#: The special tokens a file may name by id (``tokenizer.ggml.{name}_token_id``).
_SPECIAL = ("bos", "eos", "unknown", "padding")


def gguf_tokenizer(checkpoint: GGUFCheckpoint) -> Any:
    """The tokenizer a GGUF file carries (``tokenizer.ggml.*``), as the Hugging Face tokenizer of
    the same model: byte-level BPE, digits split, control tokens special (so never parsed from
    data), in mlx-lm's wrapper with our code detokenizer."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from ..loading import CodeDetokenizer

    meta, path = checkpoint.header.metadata, checkpoint.path
    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
    if pre is None:  # files converted before llama.cpp recorded it (spring 2024)
        pre = "starcoder"
        checkpoint.notices.append(f"{path.name} does not name its pre-tokenizer; using StarCoder's.")
    tokens, merges = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges")
    if kind != "gpt2" or not isinstance(tokens, list) or not isinstance(merges, list):
        msg = (
            f"{path} carries no byte-level BPE tokenizer (tokenizer.ggml.model is {reprlib.repr(kind)}, "
            "with tokens and merges): StarCoder files have one. Re-convert it with llama.cpp."
        )
        raise CheckpointError(msg)
    if pre not in _PRE_TOKENIZERS:
        msg = (
            f"{path}: tokenizer.ggml.pre {reprlib.repr(pre)} is not StarCoder's; "
            f"supported: {list(_PRE_TOKENIZERS)}."
        )
        raise UnsupportedModelError(msg)
    types = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    if not all(isinstance(t, str) for t in [*tokens, *merges]) or not (
        isinstance(types, list) and len(types) == len(tokens) and all(type(t) is int for t in types)
    ):
        msg = (
            f"{path}: the tokenizer's tokens and merges must be strings and its token types one whole "
            "number a token; re-convert the file."
        )
        raise CheckpointError(msg)
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens) or len(tokens) > checkpoint.config["vocab_size"]:
        msg = (
            f"{path}: the tokenizer's {len(tokens)} tokens are not unique or outnumber the "
            f"embedding's {checkpoint.config['vocab_size']} rows; re-convert the file."
        )
        raise CheckpointError(msg)
    special: dict[str, int] = {}
    for key in _SPECIAL:
        name = f"tokenizer.ggml.{key}_token_id"
        if name in meta:
            i = special[key] = meta[name]
            if type(i) is not int or not 0 <= i < len(tokens):
                msg = (
                    f"{path}: {name} is {reprlib.repr(i)}, but it must be the id of one of its "
                    f"{len(tokens)} tokens (0 to {len(tokens) - 1}); re-convert the file."
                )
                raise CheckpointError(msg)
    try:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        bpe = models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False)
    except Exception as e:  # tokenizers raises a bare Exception for a merge of unknown tokens
        msg = f"{path}: the tokenizer's merges do not fit its tokens ({e}); re-convert the file."
        raise CheckpointError(msg) from e
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=True)
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    control = [t for t, kind in zip(tokens, types, strict=False) if kind == _CONTROL]
    user = [t for t, kind in zip(tokens, types, strict=False) if kind == _USER_DEFINED]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])

    def token(key: str) -> str | None:
        return tokens[special[key]] if key in special else None

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=token("bos"),
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding"),
        additional_special_tokens=control,
        clean_up_tokenization_spaces=False,
        model_max_length=model_args(checkpoint.config).max_position_embeddings,
    )
    template = meta.get("tokenizer.chat_template")  # instruct models carry theirs (ChatStarCoder uses it)
    if isinstance(template, str):
        hf.chat_template = template
    eos = checkpoint.config.get("eos_token_id")
    return TokenizerWrapper(hf, CodeDetokenizer, eos_token_ids=[] if eos is None else [eos])
