"""Build StarCoder2 and StarCoder (GPTBigCode) checkpoints offline, for tests, examples and benchmarks.

Why one file: both families' builders share the tokenizer trainer, its corpus and the weight writers.

The checkpoints have the real layout (Hugging Face ``Starcoder2ForCausalLM`` / ``GPTBigCodeForCausalLM``
weight names and config, a byte-level BPE ``tokenizer.json`` carrying the family's special tokens with
``<|endoftext|>`` at id 0), so transformers, mlx-lm and this package all load them. The weights are
random, so the text they generate is nonsense, but it is deterministic for a given ``seed``.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ModelNotFoundError
from .loading import QUANTIZE_BITS, check_choice, resolve_model_path
from .registry import DEFAULT_MODEL

#: StarCoder2's special tokens, in the order (and so with the ids) of the real tokenizer.
SPECIAL_TOKENS = (
    "<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<repo_name>",
    "<file_sep>", "<issue_start>", "<issue_comment>", "<issue_closed>", "<jupyter_start>",
    "<jupyter_text>", "<jupyter_code>", "<jupyter_output>", "<jupyter_script>", "<empty_output>",
    "<code_to_intermediate>", "<intermediate_to_code>", "<pr>", "<pr_status>", "<pr_is_merged>",
    "<pr_base>", "<pr_file>", "<pr_base_code>", "<pr_diff>", "<pr_diff_hunk>", "<pr_comment>",
    "<pr_event_id>", "<pr_review>", "<pr_review_state>", "<pr_review_comment>",
    "<pr_in_reply_to_review_id>", "<pr_in_reply_to_comment_id>", "<pr_diff_hunk_comment_line>",
    "<NAME>", "<EMAIL>", "<KEY>", "<PASSWORD>",
)  # fmt: skip

_COMMON = {
    "model_type": "starcoder2",
    "architectures": ["Starcoder2ForCausalLM"],
    "hidden_act": "gelu_pytorch_tanh",
    "norm_epsilon": 1e-5,
    "use_bias": True,
    "tie_word_embeddings": True,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "attention_dropout": 0.0,
    "residual_dropout": 0.0,
    "embedding_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
}

#: Shapes of the real checkpoints (their Hugging Face configs), and "tiny" for tests.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=256, vocab_size=1024, rope_theta=10000.0, sliding_window=512,
                 max_position_embeddings=2048, tie_word_embeddings=False),
    "small": dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=1024, vocab_size=1024, rope_theta=10000.0, sliding_window=512,
                  max_position_embeddings=2048, tie_word_embeddings=False),
    "3b": dict(hidden_size=3072, num_hidden_layers=30, num_attention_heads=24, num_key_value_heads=2,
               intermediate_size=12288, vocab_size=49152, rope_theta=999999.4420358813,
               sliding_window=4096, max_position_embeddings=16384),
    "7b": dict(hidden_size=4608, num_hidden_layers=32, num_attention_heads=36, num_key_value_heads=4,
               intermediate_size=18432, vocab_size=49152, rope_theta=1000000.0,
               sliding_window=4096, max_position_embeddings=16384),
    "15b": dict(hidden_size=6144, num_hidden_layers=40, num_attention_heads=48, num_key_value_heads=4,
                intermediate_size=24576, vocab_size=49152, rope_theta=100000.0,
                sliding_window=4096, max_position_embeddings=16384),
}  # fmt: skip

_DTYPES = ("float32", "float16", "bfloat16")

#: A chat template in the shape of starcoder2-15b-instruct's, for building instruct checkpoints.
INSTRUCT_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\n\n' }}"
    "{% elif message['role'] == 'user' %}{{ '### Instruction\n' + message['content'] + '\n\n' }}"
    "{% else %}{{ '### Response\n' + message['content'] + eos_token + '\n\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Response\n' }}{% endif %}"
)


def build_starcoder2(
    path: str | Path,
    *,
    preset: str = "tiny",
    num_layers: int | None = None,
    sliding_window: int | None = None,
    seed: int = 0,
    dtype: str = "float32",
    quantize: int | None = None,
    chat_template: str | None = None,
    group_size: int = 64,
    tie_word_embeddings: bool | None = None,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write a StarCoder2 checkpoint with random weights to ``path`` and return the path.

    Args:
        path: Folder to create (it may exist; the files are replaced).
        preset: "tiny" (a few MB, for tests), "small" (wide enough for every quantization group
            size), or the real shapes "3b", "7b", "15b".
        num_layers: Override the number of layers, to keep a big preset small.
        sliding_window: Override the attention window (``0`` for none, i.e. full attention).
        seed: Seed of the weights; the same seed gives the same checkpoint.
        dtype: Weight dtype on disk: "float32", "float16" or "bfloat16".
        quantize: 4 or 8 to write an MLX-quantized checkpoint laid out like mlx-community's
            (float16 scales and biases, a "quantization" entry in config.json).
        chat_template: A Jinja chat template to store in tokenizer_config.json (instruct models).
        group_size: Quantization group size, with ``quantize``.
        tie_word_embeddings: False writes a separate ``lm_head.weight``. By default the preset's
            choice: tied for the real shapes, untied for "tiny" (random tied weights tend to repeat
            their input token, which makes dull test output).
        max_shard_bytes: Split the weights into ``model-0000x-of-0000y.safetensors`` shards of at
            most this size, with an index, as big hub checkpoints are.
    """
    check_choice("preset", preset, tuple(PRESETS))
    check_choice("dtype", dtype, _DTYPES)
    check_choice("quantize", quantize, QUANTIZE_BITS)

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("model*.safetensors*"):
        old.unlink()

    config = {**_COMMON, **PRESETS[preset], "torch_dtype": dtype}
    if tie_word_embeddings is not None:
        config["tie_word_embeddings"] = tie_word_embeddings
    if num_layers is not None:
        config["num_hidden_layers"] = num_layers
    if sliding_window is not None:
        config["sliding_window"] = sliding_window or None

    _write_tokenizer(path, config["vocab_size"], chat_template)
    weights = _random_weights(config, seed)
    if quantize is not None:
        config = _write_quantized(path, config, weights, bits=quantize, group_size=group_size)
    else:
        _write_safetensors(path, weights, dtype, max_shard_bytes)
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 0}, indent=2))
    return path


def _makers(rng: np.random.Generator) -> tuple[Callable[..., np.ndarray], Callable[..., np.ndarray]]:
    """Random matrices scaled by 1/sqrt(fan-in), and vectors around ``mean``: activations stay O(1)."""

    def dense(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(cols**-0.5)

    def vector(n: int, scale: float = 0.02, mean: float = 0.0) -> np.ndarray:
        return mean + rng.standard_normal(n, dtype=np.float32) * np.float32(scale)

    return dense, vector


def _dense_and_norms(
    prefix: str,
    linears: tuple[tuple[str, int, int], ...],
    norms: tuple[str, ...],
    dense: Any,
    vector: Any,
    width: int | None = None,
) -> dict[str, np.ndarray]:
    """Random weights and biases of ``linears`` (name, rows, cols) and LayerNorms of ``width``
    (the first linear's columns when not given) under ``prefix``."""
    width = width or linears[0][2]
    out = {}
    for name, rows, cols in linears:
        out[f"{prefix}{name}.weight"] = dense(rows, cols)
        out[f"{prefix}{name}.bias"] = vector(rows)
    for norm in norms:
        out[f"{prefix}{norm}.weight"] = vector(width, 0.1, 1.0)
        out[f"{prefix}{norm}.bias"] = vector(width)
    return out


def _random_weights(config: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """Random weights of the Hugging Face layout, scaled so that activations stay O(1)."""
    rng = np.random.default_rng(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim

    dense, vector = _makers(rng)
    embed = rng.standard_normal((config["vocab_size"], hidden), dtype=np.float32) * np.float32(0.3)
    # Keep special tokens rare in random-weight output, so test generations run on as text.
    embed[: len(SPECIAL_TOKENS)] *= np.float32(0.05)
    weights = {"model.embed_tokens.weight": embed}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        linears = (
            ("self_attn.q_proj", hidden, hidden), ("self_attn.k_proj", kv, hidden),
            ("self_attn.v_proj", kv, hidden), ("self_attn.o_proj", hidden, hidden),
            ("mlp.c_fc", inter, hidden), ("mlp.c_proj", hidden, inter),
        )  # fmt: skip
        weights |= _dense_and_norms(
            p, linears, ("input_layernorm", "post_attention_layernorm"), dense, vector
        )
    weights |= _dense_and_norms("model.", (), ("norm",), dense, vector, hidden)
    if not config["tie_word_embeddings"]:
        weights["lm_head.weight"] = dense(config["vocab_size"], hidden)
    return weights


def _write_safetensors(
    path: Path, weights: dict[str, np.ndarray], dtype: str, max_shard_bytes: int | None
) -> None:
    import mlx.core as mx

    target = getattr(mx, dtype)
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for name, value in weights.items():
        array = mx.array(value).astype(target)
        if max_shard_bytes and shards[-1] and size + array.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += array.nbytes
    if len(shards) == 1:
        mx.save_safetensors(str(path / "model.safetensors"), shards[0], metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        mx.save_safetensors(str(path / name), shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(a.nbytes for s in shards for a in s.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _write_quantized(
    path: Path,
    config: dict[str, Any],
    weights: dict[str, np.ndarray],
    *,
    bits: int,
    group_size: int,
) -> dict[str, Any]:
    """Quantize with mlx-lm the way ``mlx_lm.convert`` makes mlx-community checkpoints."""
    import mlx.core as mx
    from mlx_lm.utils import quantize_model, save_model

    from .models.starcoder2 import Model, ModelArgs

    model = Model(ModelArgs.from_dict(config))
    model.load_weights([(k, mx.array(v)) for k, v in model.sanitize(weights).items()])
    model.set_dtype(mx.float16)
    model, config = quantize_model(model, config, group_size=group_size, bits=bits)
    save_model(path, model)
    config["quantization_config"] = config["quantization"]
    config["torch_dtype"] = "float16"
    return config


# --- StarCoder (v1, GPTBigCode) ---------------------------------------------------------------

#: StarCoder's special tokens in the order of bigcode/starcoder's tokenizer (ids 0 to 18), as we know
#: it from its published special_tokens_map (not re-read here: the hub is out of reach).
STARCODER_SPECIAL_TOKENS = (
    "<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<filename>",
    "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>", "<jupyter_start>",
    "<jupyter_text>", "<jupyter_code>", "<jupyter_output>", "<empty_output>", "<commit_before>",
    "<commit_msg>", "<commit_after>", "<reponame>",
)  # fmt: skip

#: The chat tokens and template of HuggingFaceH4/starchat-beta (a StarCoderPlus fine-tune).
STARCHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
STARCHAT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

#: GPTBigCode shapes for tests: "tiny", and "small" (head_dim 64, for kv_bits and every group size).
GPT_BIGCODE_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(n_embd=64, n_layer=2, n_head=4, n_inner=None, n_positions=1024, vocab_size=1024),
    "small": dict(n_embd=256, n_layer=2, n_head=4, n_inner=1024, n_positions=1024, vocab_size=1024),
}


def build_gpt_bigcode(
    path: str | Path,
    *,
    preset: str = "tiny",
    multi_query: bool = True,
    n_positions: int | None = None,
    seed: int = 0,
    dtype: str = "float32",
    chat_template: str | None = None,
    tie_word_embeddings: bool = False,
) -> Path:
    """Write a StarCoder (GPTBigCode) checkpoint with random weights to ``path`` and return the path.

    The layout is Hugging Face's ``GPTBigCodeForCausalLM`` (``transformer.wte``, ``transformer.h.N.attn.
    c_attn``...), so transformers loads it too; the tokenizer carries StarCoder's special tokens.

    Args:
        path: Folder to create (it may exist; the files are replaced).
        preset: "tiny" (``n_inner`` null, i.e. 4 x n_embd) or "small" (head_dim 64).
        multi_query: True for StarCoder's one key/value head, False for multi-head attention.
        n_positions: Override the number of learned positions (the context window).
        seed: Seed of the weights; the same seed gives the same checkpoint.
        dtype: Weight dtype on disk: "float32", "float16" or "bfloat16".
        chat_template: A Jinja chat template for tokenizer_config.json; with
            :data:`STARCHAT_CHAT_TEMPLATE` the vocabulary also gets starchat's chat tokens, and
            ``<|end|>`` is the tokenizer's eos token (as in starchat).
        tie_word_embeddings: True shares ``wte`` with the output layer, as real checkpoints do.
    """
    check_choice("preset", preset, tuple(GPT_BIGCODE_PRESETS))
    check_choice("dtype", dtype, _DTYPES)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("model*.safetensors*"):
        old.unlink()
    config: dict[str, Any] = {
        "model_type": "gpt_bigcode", "architectures": ["GPTBigCodeForCausalLM"],
        **GPT_BIGCODE_PRESETS[preset],
        "activation_function": "gelu_pytorch_tanh", "layer_norm_epsilon": 1e-5, "multi_query": multi_query,
        "scale_attn_weights": True, "attention_softmax_in_fp32": True,
        "scale_attention_softmax_in_fp32": True,
        "tie_word_embeddings": tie_word_embeddings, "bos_token_id": 0, "eos_token_id": 0,
        "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "initializer_range": 0.02,
        "use_cache": True, "torch_dtype": dtype,
    }  # fmt: skip
    if n_positions is not None:
        config["n_positions"] = n_positions
    starchat = chat_template == STARCHAT_CHAT_TEMPLATE
    specials = STARCODER_SPECIAL_TOKENS + (STARCHAT_TOKENS if starchat else ())
    eos = "<|end|>" if starchat else "<|endoftext|>"
    _write_tokenizer(path, config["vocab_size"], chat_template, specials, eos)
    _write_safetensors(path, _random_gpt_bigcode_weights(config, seed), dtype, None)
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 0}, indent=2))
    return path


def _random_gpt_bigcode_weights(config: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """Random weights of the ``GPTBigCodeForCausalLM`` layout, scaled so that activations stay O(1)."""
    rng = np.random.default_rng(seed)
    hidden = config["n_embd"]
    inner = config["n_inner"] or 4 * hidden
    kv = (1 if config["multi_query"] else config["n_head"]) * (hidden // config["n_head"])

    dense, vector = _makers(rng)
    embed = rng.standard_normal((config["vocab_size"], hidden), dtype=np.float32) * np.float32(0.3)
    embed[: len(STARCODER_SPECIAL_TOKENS)] *= np.float32(0.05)  # keep control tokens rare in output
    weights = {
        "transformer.wte.weight": embed,
        "transformer.wpe.weight": rng.standard_normal((config["n_positions"], hidden), dtype=np.float32)
        * np.float32(0.1),
    }
    for i in range(config["n_layer"]):
        p = f"transformer.h.{i}."
        linears = (
            ("attn.c_attn", hidden + 2 * kv, hidden), ("attn.c_proj", hidden, hidden),
            ("mlp.c_fc", inner, hidden), ("mlp.c_proj", hidden, inner),
        )  # fmt: skip
        weights |= _dense_and_norms(p, linears, ("ln_1", "ln_2"), dense, vector)
    weights |= _dense_and_norms("transformer.", (), ("ln_f",), dense, vector, hidden)
    if not config["tie_word_embeddings"]:
        weights["lm_head.weight"] = dense(config["vocab_size"], hidden)
    return weights


# --- tokenizer -------------------------------------------------------------------------------

_WORDS = [
    "self", "value", "index", "count", "total", "result", "items", "data", "config", "model", "token",
    "prompt", "cache", "engine", "request", "response", "stream", "chunk", "buffer", "parser", "reader",
    "writer", "file", "path", "name", "user", "client", "server", "query", "table", "row", "column", "key",
    "node", "tree", "graph", "list", "dict", "string", "number", "error", "message", "window", "layer",
    "weight", "matrix", "vector", "batch", "queue", "thread", "lock", "event", "state", "handler",
    "callback", "future",
]  # fmt: skip
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
                a=a, b=b, c=c, d=d, A=a.title(), B=b.title(), n=rng.randint(0, 999),
                m=rng.randint(0, 99),
            )
        )  # fmt: skip
    return out


def _write_tokenizer(
    path: Path,
    vocab_size: int,
    chat_template: str | None,
    special_tokens: tuple[str, ...] = SPECIAL_TOKENS,
    eos_token: str = "<|endoftext|>",
) -> None:
    """A byte-level BPE shaped like StarCoder's (digits split, no prefix space), trained in seconds."""
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
    tokenizer.train_from_iterator(_corpus(), trainer)
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
            "content": tok, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
        for i, tok in enumerate(special_tokens)
    }  # fmt: skip
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


def copy_checkpoint(src: str | Path, dst: str | Path) -> Path:
    """Copy a built checkpoint folder (tests that damage a checkpoint work on a copy)."""
    return Path(shutil.copytree(src, dst, dirs_exist_ok=True))


def model_or_offline(model: str, default: str = DEFAULT_MODEL, *, instruct: bool = False) -> str:
    """``model`` if it can be had, else, for ``default`` only, a small offline checkpoint (examples, demos).

    A folder is used as it is; a hub id is downloaded here (once; then it is in the local hub cache). With
    no hub access (offline, or ``HF_HUB_OFFLINE=1``) and no cached copy, ``default`` is replaced by a
    checkpoint with random weights built offline once under ``~/.cache/langchain-starcoder`` (its output
    is nonsense, but every step is real), and two lines on stdout say why and where. Any other model that
    cannot be had raises :class:`ModelNotFoundError`. ``instruct`` builds the stand-in with a chat template.
    """
    try:
        resolve_model_path(model)
    except ModelNotFoundError as err:
        if model != default:
            raise
        kind = "instruct " if instruct else ""
        path = Path.home() / ".cache" / "langchain-starcoder" / f"offline-tiny{'-instruct' * instruct}"
        print(f"{err}\n-> Using an offline {kind}checkpoint with random weights at {path}.\n", flush=True)
        if not (path / "config.json").is_file():  # config.json is written last
            build_starcoder2(path, chat_template=INSTRUCT_CHAT_TEMPLATE if instruct else None)
        return str(path)
    return model
