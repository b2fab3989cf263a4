"""The tokenizers of the built checkpoints: a byte-level BPE shaped like StarCoder's, trained in seconds on
a small synthetic corpus of code, carrying the family's special tokens with ``<|endoftext|>`` at id 0."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Special tokens both families have, in this order (StarCoder2's ids 7 to 13, StarCoder's 7 to 13).
_ISSUES_AND_NOTEBOOKS = (
    "<issue_start>",
    "<issue_comment>",
    "<issue_closed>",
    "<jupyter_start>",
    "<jupyter_text>",
    "<jupyter_code>",
    "<jupyter_output>",
)

#: StarCoder2's special tokens, in the order (and so with the ids) of the real tokenizer.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<fim_prefix>",
    "<fim_middle>",
    "<fim_suffix>",
    "<fim_pad>",
    "<repo_name>",
    "<file_sep>",
    *_ISSUES_AND_NOTEBOOKS,
    "<jupyter_script>",
    "<empty_output>",
    "<code_to_intermediate>",
    "<intermediate_to_code>",
    "<pr>",
    "<pr_status>",
    "<pr_is_merged>",
    "<pr_base>",
    "<pr_file>",
    "<pr_base_code>",
    "<pr_diff>",
    "<pr_diff_hunk>",
    "<pr_comment>",
    "<pr_event_id>",
    "<pr_review>",
    "<pr_review_state>",
    "<pr_review_comment>",
    "<pr_in_reply_to_review_id>",
    "<pr_in_reply_to_comment_id>",
    "<pr_diff_hunk_comment_line>",
    "<NAME>",
    "<EMAIL>",
    "<KEY>",
    "<PASSWORD>",
)

#: StarCoder's special tokens in the order of bigcode/starcoder's tokenizer (ids 0 to 18), as we know
#: it from its published special_tokens_map (not re-read here: the hub is out of reach).
STARCODER_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<fim_prefix>",
    "<fim_middle>",
    "<fim_suffix>",
    "<fim_pad>",
    "<filename>",
    "<gh_stars>",
    *_ISSUES_AND_NOTEBOOKS,
    "<empty_output>",
    "<commit_before>",
    "<commit_msg>",
    "<commit_after>",
    "<reponame>",
)

_WORDS = [
    "self",
    "value",
    "index",
    "count",
    "total",
    "result",
    "items",
    "data",
    "config",
    "model",
    "token",
    "prompt",
    "cache",
    "engine",
    "request",
    "response",
    "stream",
    "chunk",
    "buffer",
    "parser",
    "reader",
    "writer",
    "file",
    "path",
    "name",
    "user",
    "client",
    "server",
    "query",
    "table",
    "row",
    "column",
    "key",
    "node",
    "tree",
    "graph",
    "list",
    "dict",
    "string",
    "number",
    "error",
    "message",
    "window",
    "layer",
    "weight",
    "matrix",
    "vector",
    "batch",
    "queue",
    "thread",
    "lock",
    "event",
    "state",
    "handler",
    "callback",
    "future",
]
_TEMPLATES = (
    'def {a}_{b}({c}, {d}=None):\n    """Return the {b} of {c}."""\n    if {d} is None:\n'
    "        {d} = {n}\n    return [{c}.{a} for {c} in {d}]\n\n",
    "class {A}{B}:\n    def __init__(self, {c}: int = {n}) -> None:\n        self.{c} = {c}\n\n"
    '    def {a}(self) -> str:\n        return f"{{self.{c}}} {b}"\n\n',
    "for {c} in range({n}):\n    {d} += {c} * {m}  # {a} {b}\nprint({d}, {c})\n",
    "import {a}\nfrom {b} import {A}, {B}\n\n{c} = {A}({d}={n}, {b}='{a}')\n",
    "function {a}{B}({c}, {d}) {{\n  const {b} = {c}.map((x) => x + {n});\n"
    "  return {b}.filter(Boolean);\n}}\n",
    '// {a}: {b} 的 {c} 数据 🚀\nlet {d} = "{a}-{b}"; // café naïve façade ✓\n',
    "if ({c} >= {n} && {d} != {m}) {{\n    {a}[{c}] = {b}({d});\n}} else {{\n    return -1;\n}}\n",
)


def _corpus(seed: int = 1234, documents: int = 3000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(documents):
        a, b, c, d = (rng.choice(_WORDS) for _ in range(4))
        out.append(
            rng.choice(_TEMPLATES).format(
                a=a,
                b=b,
                c=c,
                d=d,
                A=a.title(),
                B=b.title(),
                n=rng.randint(0, 999),
                m=rng.randint(0, 99),
            )
        )
    return out


def write_tokenizer(
    path: Path,
    vocab_size: int,
    chat_template: str | None,
    special_tokens: tuple[str, ...] = SPECIAL_TOKENS,
    eos_token: str = "<|endoftext|>",
    corpus: Sequence[str] | None = None,
) -> None:
    """A byte-level BPE shaped like StarCoder's (digits split, no prefix space), trained in seconds
    on ``corpus`` (default: a small synthetic corpus of code)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=True)
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus() if corpus is None else corpus, trainer)
    spec = json.loads(tokenizer.to_str())
    # Pad the vocabulary to the model's size with tokens no merge produces, so every id decodes.
    vocab = spec["model"]["vocab"]
    i = 0
    while len(vocab) < vocab_size:
        vocab.setdefault(f"<|unused_{i}|>", len(vocab))
        i += 1
    (path / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))

    added = {
        str(i): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, tok in enumerate(special_tokens)
    }
    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": list(special_tokens),
        "bos_token": "<|endoftext|>",
        "eos_token": eos_token,
        "unk_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1000000000000000019884624838656,
        "vocab_size": vocab_size,
    }
    if chat_template is not None:
        tokenizer_config["chat_template"] = chat_template
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    special_map = {
        "bos_token": "<|endoftext|>",
        "eos_token": eos_token,
        "unk_token": "<|endoftext|>",
        "additional_special_tokens": list(special_tokens),
    }
    (path / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2))
