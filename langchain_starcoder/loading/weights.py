"""Safetensors weights: each file's checked header, and the check that they fit config.json."""

from __future__ import annotations

import json
import re
import reprlib
import struct
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from ..models import gpt_bigcode, starcoder2
from .families import ModelArgs, model_args


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

    expected = expected_tensors(args)
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


def expected_tensors(args: ModelArgs) -> dict[str, tuple[int, ...]]:
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
