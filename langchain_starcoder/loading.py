"""From a folder or hub id to a ready MLX model and tokenizer: clear errors, CPU-aware dtypes.

Why one file: every check before loading (config, weight files, their shapes) reads the same family
dispatch, and each error names what the loader would have failed on.
"""

from __future__ import annotations

import json
import math
import os
import re
import reprlib
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.tokenizer_utils import (
    BPEStreamingDetokenizer,
    NaiveStreamingDetokenizer,
    TokenizerWrapper,
)

from .errors import (
    CheckpointError,
    InvalidParameterError,
    ModelNotFoundError,
    UnsupportedModelError,
)
from .models import gpt_bigcode, starcoder2

DTYPES = ("auto", "float32", "float16", "bfloat16")
QUANTIZE_BITS = (None, 4, 8)
GROUP_SIZES = (32, 64, 128)
KV_BITS = (None, 4, 8)

#: What a download fetches: configs, tokenizer, safetensors weights. Never pickled ``.bin`` files.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.jinja", "tokenizer.model"]


#: The model families this package runs: config.json's ``model_type`` -> its MLX module.
FAMILIES = {"starcoder2": starcoder2, "gpt_bigcode": gpt_bigcode}

ModelArgs = starcoder2.ModelArgs | gpt_bigcode.ModelArgs


@dataclass
class LoadedModel:
    model: nn.Module
    args: ModelArgs
    config: dict[str, Any]


def check_choice(name: str, value: Any, allowed: tuple[Any, ...]) -> None:
    """``value`` if it is one of ``allowed``, else a clear error naming the setting."""
    if value not in allowed or isinstance(value, bool):
        msg = f"{name} must be one of {', '.join(map(repr, allowed))}; not {value!r}."
        raise InvalidParameterError(msg)


def validate_load_options(quantize: int | None, group_size: int, dtype: str, kv_bits: int | None) -> None:
    """Refuse nonsense settings before touching the disk or the network."""
    check_choice("quantize", quantize, QUANTIZE_BITS)
    check_choice("group_size", group_size, GROUP_SIZES)
    check_choice("dtype", dtype, DTYPES)
    check_choice("kv_bits", kv_bits, KV_BITS)


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
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    # Raised "from None": the hub's chained errors (50 lines of httpx) would bury the message.
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=ALLOW_PATTERNS))
    except RevisionNotFoundError:
        msg = f"Hub model {repo_id!r} has no revision {revision!r}; check the branch, tag or commit."
        raise ModelNotFoundError(msg) from None
    except GatedRepoError:
        msg = f"Hub model {repo_id!r} is gated: accept its licence on the hub and log in (`hf auth login`)."
        raise ModelNotFoundError(msg) from None
    except RepositoryNotFoundError:
        msg = f"Hub model {repo_id!r} does not exist (or is private: log in with `hf auth login`)."
        raise ModelNotFoundError(msg) from None
    except HFValidationError as e:
        msg = f"{repo_id!r} is neither a local folder nor a valid hub id: {e}"
        raise ModelNotFoundError(msg) from None
    except LocalEntryNotFoundError:
        msg = (
            f"Could not download {repo_id!r}: the hub cannot be reached (or HF_HUB_OFFLINE is set) "
            "and the model is not in the local cache. Connect once to download it, or pass a local "
            "folder (`langchain-starcoder build-test-model DST` builds one offline)."
        )
        raise ModelNotFoundError(msg) from None
    except OSError as e:
        msg = f"Download of {repo_id!r} failed: {e}. Nothing was loaded; run again to resume it."
        raise ModelNotFoundError(msg) from None


def read_config(path: Path) -> dict[str, Any]:
    """config.json, checked: a StarCoder2 or StarCoder (GPTBigCode) config whose sizes and settings
    the model can be built from."""
    config_file = path / "config.json"
    if not config_file.is_file():
        msg = f"{path} has no config.json: it is not a Hugging Face checkpoint folder."
        raise CheckpointError(msg)
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        msg = f"{config_file} is not valid JSON ({e}); re-download or rebuild the checkpoint."
        raise CheckpointError(msg) from e
    if not isinstance(config, dict):
        msg = (
            f"{config_file} holds {reprlib.repr(config)}, not a JSON object of settings; "
            "re-download or rebuild the checkpoint."
        )
        raise CheckpointError(msg)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        msg = (
            f"{path} holds a {reprlib.repr(model_type)} model; langchain-starcoder runs StarCoder2 "
            "(model_type 'starcoder2', e.g. mlx-community/starcoder2-3b-4bit) and StarCoder "
            "(model_type 'gpt_bigcode', e.g. bigcode/starcoderbase-1b) checkpoints."
        )
        raise UnsupportedModelError(msg)
    validate_config(config, config_file)
    return config


#: MLX array dimensions are 32-bit ints: no size can be larger.
MAX_SIZE = 2**31 - 1


def _is_size(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SIZE


def _is_positive(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < math.inf


def _is_token_id(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SIZE


_SIZE = (_is_size, f"a whole number from 1 to {MAX_SIZE}")

#: What each config.json entry the model uses must be: key -> (required, test, what it must be).
#: An optional key may be absent (ModelArgs's default applies).
CONFIG_RULES: dict[str, tuple[bool, Callable[[Any], bool], str]] = {
    "hidden_size": (True, *_SIZE),
    "num_hidden_layers": (True, *_SIZE),
    "num_attention_heads": (True, *_SIZE),
    "num_key_value_heads": (True, *_SIZE),
    "intermediate_size": (True, *_SIZE),
    "vocab_size": (False, *_SIZE),
    "max_position_embeddings": (False, *_SIZE),
    "sliding_window": (
        False,
        lambda v: v is None or _is_size(v),
        "null (full attention) or a whole number >= 1",
    ),
    "rope_theta": (False, lambda v: v is None or _is_positive(v), "a positive number"),
    "rope_parameters": (False, lambda v: v is None or isinstance(v, dict), "null or an object"),
    # transformers refuses an int here: be as strict, and say so first
    "norm_epsilon": (
        False,
        lambda v: isinstance(v, float) and _is_positive(v),
        "a positive float (e.g. 1e-05)",
    ),
    "hidden_act": (False, lambda v: isinstance(v, str), "the name of an activation"),
    "use_bias": (False, lambda v: isinstance(v, bool), "true or false"),
    "tie_word_embeddings": (False, lambda v: isinstance(v, bool), "true or false"),
    "eos_token_id": (
        False,
        lambda v: v is None or _is_token_id(v) or (isinstance(v, list) and all(map(_is_token_id, v))),
        "null, a token id or a list of token ids",
    ),
    "quantization": (
        False,
        lambda v: isinstance(v, dict) and _is_size(v.get("bits")) and _is_size(v.get("group_size")),
        'an object with whole-number "bits" and "group_size"',
    ),
}

#: The same for a GPTBigCode (StarCoder v1) config.json, whose names are GPT-2's.
GPT_BIGCODE_RULES: dict[str, tuple[bool, Callable[[Any], bool], str]] = {
    "n_embd": (True, *_SIZE),
    "n_layer": (True, *_SIZE),
    "n_head": (True, *_SIZE),
    "n_positions": (False, *_SIZE),
    "n_inner": (False, lambda v: v is None or _is_size(v), "null (4 x n_embd) or a whole number >= 1"),
    "activation_function": (False, lambda v: isinstance(v, str), "the name of an activation"),
    "layer_norm_epsilon": (False, CONFIG_RULES["norm_epsilon"][1], CONFIG_RULES["norm_epsilon"][2]),
    "multi_query": (False, lambda v: isinstance(v, bool), "true or false"),
    "scale_attn_weights": (False, lambda v: isinstance(v, bool), "true or false"),
    "add_cross_attention": (False, lambda v: v is False, "false (a decoder-only model)"),
    **{k: CONFIG_RULES[k] for k in ("vocab_size", "tie_word_embeddings", "eos_token_id", "quantization")},
}

_RULES = {"starcoder2": CONFIG_RULES, "gpt_bigcode": GPT_BIGCODE_RULES}

_FIX = "Fix config.json, or re-download or rebuild the checkpoint."


def validate_config(
    config: dict[str, Any], source: Path, *, names: Mapping[str, str] | None = None, fix: str = _FIX
) -> None:
    """Refuse a config the model cannot be built from, before anything is allocated: one clear error.

    ``source`` is the file the config came from; ``names`` what it calls each setting where that
    differs (a GGUF file's metadata keys), and ``fix`` what to do about a bad one.
    """
    names = names or {}

    def name(key: str) -> str:
        return names.get(key, key)

    family = config.get("model_type", "starcoder2")
    for key, (required, test, expected) in _RULES[family].items():
        if key not in config:
            if required:
                msg = f"{source} has no {name(key)!r}, which must be {expected}. {fix}"
                raise CheckpointError(msg)
        elif not test(config[key]):
            msg = f"{source}: {name(key)} is {reprlib.repr(config[key])}, but it must be {expected}. {fix}"
            raise CheckpointError(msg)
    if family == "gpt_bigcode":
        if config["n_embd"] % config["n_head"]:
            msg = (
                f"{source}: {name('n_embd')} {config['n_embd']} and {name('n_head')} {config['n_head']} "
                f"do not fit: the heads must divide {name('n_embd')}. {fix}"
            )
            raise CheckpointError(msg)
    else:
        _validate_starcoder2(config, source, name, fix)
    try:  # well formed, but is it a model this package runs (activation, RoPE type)?
        args = model_args(config)
    except UnsupportedModelError as e:
        msg = f"{source}: {e} langchain-starcoder runs StarCoder and StarCoder2 checkpoints as published."
        raise UnsupportedModelError(msg) from e
    _validate_eos(config, args.vocab_size, source, name, fix)


def _validate_starcoder2(config: dict[str, Any], source: Path, name: Callable[[str], str], fix: str) -> None:
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope and not _is_positive(rope["rope_theta"]):
        msg = (
            f"{source}: rope_parameters.rope_theta is {reprlib.repr(rope['rope_theta'])}, "
            f"but it must be a positive number. {fix}"
        )
        raise CheckpointError(msg)
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    if hidden % heads or heads % kv_heads:
        msg = (
            f"{source}: {name('hidden_size')} {hidden}, {name('num_attention_heads')} {heads} and "
            f"{name('num_key_value_heads')} {kv_heads} do not fit: the heads must divide "
            f"{name('hidden_size')} and the key/value heads must divide the heads. {fix}"
        )
        raise CheckpointError(msg)


def _validate_eos(
    config: dict[str, Any], vocab_size: int, source: Path, name: Callable[[str], str], fix: str
) -> None:
    """The end-of-text ids must be in the vocabulary: one past it would never stop a generation."""
    eos = config.get("eos_token_id")
    ids = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if any(i >= vocab_size for i in ids):
        msg = (
            f"{source}: {name('eos_token_id')} is {reprlib.repr(eos)}, but the vocabulary has "
            f"{vocab_size} tokens (ids 0 to {vocab_size - 1}). {fix}"
        )
        raise CheckpointError(msg)


def weight_headers(path: Path) -> dict[Path, dict[str, Any]]:
    """Each safetensors file of a checkpoint with its checked header. Pickled weights are refused."""
    index_file = path / "model.safetensors.index.json"
    if index_file.is_file():
        try:
            index = json.loads(index_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            msg = f"{index_file} is not valid JSON ({e}); re-download the checkpoint."
            raise CheckpointError(msg) from e
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            msg = (
                f'{index_file} has no "weight_map" object of tensor names to file names '
                f"(it holds {reprlib.repr(weight_map)}); re-download the checkpoint."
            )
            raise CheckpointError(msg)
        files = sorted({path / name for name in weight_map.values()})
        missing = [f.name for f in files if not (f.exists() or f.is_symlink())]
        if missing:
            msg = f"{path} is missing weight shards {missing}; the download is incomplete, run it again."
            raise CheckpointError(msg)
    else:
        files = sorted(path.glob("model*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt*"))
        if pickled:
            msg = (
                f"{path} has only pickled weights ({', '.join(pickled[:3])}); they are refused because "
                "unpickling can run code. Use a checkpoint with safetensors weights, or convert it "
                "with `mlx_lm.convert`."
            )
            raise CheckpointError(msg)
        msg = f"{path} has no model*.safetensors weights."
        raise CheckpointError(msg)
    return {f: safetensors_header(f) for f in files}


def safetensors_header(file: Path) -> dict[str, Any]:
    """The tensors a safetensors file describes, checked against the file's size (truncation, garbage)."""
    if file.is_dir():
        msg = f"{file} is a folder, not a safetensors file; delete it and download the weights again."
        raise CheckpointError(msg)
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            (header_len,) = struct.unpack("<Q", fh.read(8))
            if header_len > size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(fh.read(header_len))
        header.pop("__metadata__", None)
        end = max((v["data_offsets"][1] for v in header.values()), default=0)
    except OSError as e:  # a dangling link, a symlink loop, no permission
        msg = f"{file} cannot be read ({e.strerror or e}); replace it with the real weights file."
        raise CheckpointError(msg) from e
    except (struct.error, ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
        msg = f"{file} is not a valid safetensors file ({e}); delete it and download it again."
        raise CheckpointError(msg) from e
    if 8 + header_len + end != size:
        msg = (
            f"{file} is truncated or corrupted ({size} bytes, its header describes "
            f"{8 + header_len + end}); delete it and download it again."
        )
        raise CheckpointError(msg)
    return header


#: Where each family's weights name their layer index.
_LAYER = {
    "starcoder2": re.compile(r"model\.layers\.(\d+)\."),
    "gpt_bigcode": re.compile(r"transformer\.h\.(\d+)\."),
}


def check_weights_match_config(
    path: Path, config: dict[str, Any], headers: dict[Path, dict[str, Any]]
) -> None:
    """Compare config.json with the safetensors headers, so a mismatch fails before the model is built.

    Building first would allocate what the config says (1e5 layers: minutes and gigabytes) only to
    find the weights do not fit. Quantized (packed uint32) weights keep their output dimension only.
    """
    tensors = {name: (file, info) for file, header in headers.items() for name, info in header.items()}
    args = model_args(config)
    config_file = path / "config.json"
    layer = _LAYER[config.get("model_type", "starcoder2")]
    layers = {int(m[1]) for name in tensors if (m := layer.match(name))}
    n = args.num_hidden_layers
    if len(layers) != n or max(layers, default=-1) != n - 1:  # i.e. layers 0 to n - 1, without a set of n
        found = f"layers {min(layers)} to {max(layers)}" if layers else "no layers"
        msg = (
            f"{config_file} says {_LAYERS_KEY[type(args)]} is {n}, but the weights in "
            f"{path} hold {found} ({len(layers)} in all): config.json does not belong to these "
            "weights. Use the config.json that came with them, or re-download the checkpoint."
        )
        raise CheckpointError(msg)
    if "quantization_config" in config and "quantization" not in config:
        return  # AWQ/GPTQ layouts, renamed and repacked by mlx-lm while loading: names differ

    expected = _expected_tensors(args)
    sizes = ", ".join(f"{key} {getattr(args, key)}" for key in _SIZE_KEYS)
    for name, shape in expected.items():
        if name not in tensors:
            msg = f"The weights in {path} have no {name}, which {config_file} implies; re-download them."
            raise CheckpointError(msg)
        file, info = tensors[name]
        found = tuple(info["shape"]) if isinstance(info.get("shape"), list) else ()
        if not _fits(found, shape, packed=info.get("dtype") == "U32"):
            msg = (
                f"{file.name} holds {name} of shape {list(found)}, but {config_file} ({sizes}) implies "
                f"{list(shape)}: config.json does not belong to these weights. Use the config.json "
                "that came with them, or re-download the checkpoint."
            )
            raise CheckpointError(msg)


_LAYERS_KEY = {starcoder2.ModelArgs: "num_hidden_layers", gpt_bigcode.ModelArgs: "n_layer"}


def _expected_tensors(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every tensor name the family's Hugging Face layout has, with its (output, input) shape."""
    h, kv = args.hidden_size, args.num_key_value_heads * args.head_dim
    if isinstance(args, gpt_bigcode.ModelArgs):
        prefix, embed, final_norm = "transformer.h.", "transformer.wte.weight", "transformer.ln_f"
        linears = {"attn.c_attn": (h + 2 * kv, h), "attn.c_proj": (h, h)}
        norms, biases = ("ln_1", "ln_2"), True
    else:
        prefix, embed, final_norm = "model.layers.", "model.embed_tokens.weight", "model.norm"
        linears = {
            "self_attn.q_proj": (h, h),
            "self_attn.k_proj": (kv, h),
            "self_attn.v_proj": (kv, h),
            "self_attn.o_proj": (h, h),
        }
        norms, biases = ("input_layernorm", "post_attention_layernorm"), args.use_bias
    linears |= {"mlp.c_fc": (args.intermediate_size, h), "mlp.c_proj": (h, args.intermediate_size)}
    per_layer = {f"{name}.weight": shape for name, shape in linears.items()}
    if biases:
        per_layer |= {f"{name}.bias": shape[:1] for name, shape in linears.items()}
    for norm in norms:
        per_layer |= {f"{norm}.weight": (h,), f"{norm}.bias": (h,)}
    expected = {embed: (args.vocab_size, h), f"{final_norm}.weight": (h,), f"{final_norm}.bias": (h,)}
    if isinstance(args, gpt_bigcode.ModelArgs):
        expected["transformer.wpe.weight"] = (args.n_positions, h)
    if not args.tie_word_embeddings:
        expected["lm_head.weight"] = (args.vocab_size, h)
    for i in range(args.num_hidden_layers):
        expected |= {f"{prefix}{i}.{name}": shape for name, shape in per_layer.items()}
    return expected


_SIZE_KEYS = ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size")


def _fits(found: tuple[int, ...], shape: tuple[int, ...], *, packed: bool) -> bool:
    """Quantized weights pack their input dimension into uint32 words: compare the others only."""
    keep = -1 if packed else None
    return len(found) == len(shape) and found[:keep] == shape[:keep]


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


def model_args(config: dict[str, Any]) -> ModelArgs:
    """The model's settings from a validated config (the one place that picks the family's class)."""
    return _family(config).ModelArgs.from_dict(config)


def _family(config: dict[str, Any]) -> Any:
    """The family's module (``models.starcoder2`` or ``models.gpt_bigcode``) for a read config."""
    return FAMILIES[config.get("model_type", "starcoder2")]


def default_compute_dtype() -> mx.Dtype | None:
    """float32 on the CPU, None (the checkpoint's dtype) on a GPU.

    On the CPU, MLX's half-precision mat-vecs are far slower than float32's: a 3072x12288 mat-vec took
    0.044 s in float32, 0.24 s in bfloat16 and 0.55 s in float16 on the 2-core x86 CI machine.
    """
    return mx.float32 if mx.default_device() == mx.cpu else None


def load_model(
    path: Path, *, quantize: int | None, group_size: int, dtype: str, config: dict[str, Any] | None = None
) -> LoadedModel:
    """Load our module of the checkpoint's family through mlx-lm's loader; then dtype policy and
    quantize-on-load. ``config``: the checkpoint's :func:`read_config`, when the caller has it."""
    from mlx_lm.utils import load_model as mlx_load_model

    config = read_config(path) if config is None else config
    headers = weight_headers(path)
    files = list(headers)
    check_weights_match_config(path, config, headers)
    if quantize is not None and "quantization" in config:
        q = config["quantization"]
        msg = (
            f"{path} is already quantized ({q.get('bits')}-bit, group size {q.get('group_size')}); "
            "load it with quantize=None."
        )
        raise InvalidParameterError(msg)
    try:
        family = _family(config)
        classes = (family.Model, family.ModelArgs)
        model, config = mlx_load_model(path, get_model_classes=lambda config: classes)
    except ValueError as e:
        if "Received parameters not in model" in str(e) or "Missing parameters" in str(e):
            msg = f"The weights in {path} do not match its config.json: {e}"
            raise CheckpointError(msg) from e
        msg = f"Could not load {path}: {e}"
        raise CheckpointError(msg) from e
    except (RuntimeError, OSError) as e:
        msg = f"Could not read the weights {[f.name for f in files]} in {path}: {e}. Re-download them."
        raise CheckpointError(msg) from e

    return finish_loading(model, config, quantize=quantize, group_size=group_size, dtype=dtype)


def finish_loading(
    model: Any, config: dict[str, Any], *, quantize: int | None, group_size: int, dtype: str
) -> LoadedModel:
    """What every weight format gets once its module holds the weights: the dtype policy, then
    quantize-on-load; the weights evaluated."""
    from mlx_lm.utils import quantize_model

    target = default_compute_dtype() if dtype == "auto" else getattr(mx, dtype)
    if target is not None:
        # Packed quantized weights are integers: only floats (incl. scales and biases) change.
        model.set_dtype(target)
    if quantize is not None:
        model, config = quantize_model(model, config, group_size=group_size, bits=quantize)
    mx.eval(model.parameters())
    return LoadedModel(model, model_args(config), config)


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
