"""Checkpoint folders on disk: quantize a copy and describe one; :mod:`.folders` writes folders safely.

Importing this module imports nothing heavy: MLX and mlx-lm load inside the functions that need them,
so the command line starts fast.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import shutil
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import InvalidParameterError
from .folders import (
    MARKER,
    DestinationError,
    check_destination,
    check_in_place,
    folder_bytes,
    staged_folder,
    to_stderr,
    write_in_place,
    written_by_us,
)

__all__ = [
    "MARKER",
    "DestinationError",
    "check_destination",
    "check_in_place",
    "checkpoint_info",
    "folder_bytes",
    "format_info",
    "human_bytes",
    "human_count",
    "quantize_checkpoint",
    "staged_folder",
    "write_in_place",
    "written_by_us",
]

# Files of a checkpoint besides its weights and config that a quantized copy needs (tokenizer,
# generation settings, chat template).
_EXTRA_FILE_PATTERNS = ("*.json", "*.txt", "*.jinja", "tokenizer.model")
_NOT_COPIED = {"config.json", "model.safetensors.index.json", MARKER}
_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "U32": "uint32",
    "I32": "int32",
    "U8": "uint8",
    "I8": "int8",
    "I64": "int64",
    "BOOL": "bool",
}
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "U8": 1, "I8": 1, "I64": 8}


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"


def human_count(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    if n >= 1e6:
        return f"{n / 1e6:.2f} M"
    return f"{n / 1e3:.1f} K" if n >= 1e3 else str(n)


# --- quantize --------------------------------------------------------------------------------------


def quantize_checkpoint(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    bits: int = 4,
    group_size: int = 64,
    revision: str | None = None,
    force: bool = False,
    verify: bool = True,
    progress: bool = True,
) -> Path:
    """Write an MLX-quantized copy of the StarCoder2 checkpoint ``src`` to the folder ``dst``.

    The layout is mlx-community's (``mlx_lm.convert``): packed weights with float16 scales and
    biases, a ``quantization`` entry in config.json, the tokenizer files copied, plus this package's
    marker file. ``dst`` appears only when it is complete (written beside it, then renamed); with
    ``force`` it replaces only a checkpoint this package wrote, never the source or a folder around
    it. With ``verify`` the copy is first loaded and generates one token. ``progress`` shows what
    happens on stderr.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import quantize_model, save_config, save_model
    from tqdm import tqdm

    from ..loading import load_model, read_config, resolve_model_path, validate_load_options

    log = to_stderr if progress else (lambda _: None)
    validate_load_options(bits, group_size, "float16", None)
    dst = Path(dst).expanduser()
    local = Path(src).expanduser()
    check_destination(dst, force, local if local.exists() else None)  # before any hub download
    src_path = resolve_model_path(src, revision)
    check_destination(dst, force, src_path)
    config = read_config(src_path)
    if "quantization" in config:
        q = config["quantization"]
        msg = (
            f"{src_path} is already quantized ({q.get('bits')}-bit, group size {q.get('group_size')}); "
            "quantize the full-precision checkpoint it came from."
        )
        raise InvalidParameterError(msg)

    with staged_folder(dst, force, source=src_path, command="quantize") as tmp:
        log(f"Loading {src} ...")
        # float16 like mlx-community checkpoints: the quantization scales take the weights' dtype.
        loaded = load_model(src_path, quantize=None, group_size=group_size, dtype="float16", config=config)
        # mlx-lm reports the bits per weight on stdout; stdout is only for generated text here.
        with contextlib.redirect_stdout(sys.stderr):
            model, qconfig = quantize_model(loaded.model, loaded.config, group_size=group_size, bits=bits)
        del loaded
        # Quantizing is lazy: evaluating tensor by tensor does the work and drives the bar.
        tensors = tree_flatten(model.parameters())
        for _, array in tqdm(
            tensors, desc=f"Quantizing to {bits}-bit", unit="tensor", file=sys.stderr, disable=not progress
        ):
            mx.eval(array)
        del tensors
        log(f"Saving to {dst} ...")
        save_model(tmp, model, donate_model=True)
        del model
        qconfig["torch_dtype"] = "float16"
        save_config(qconfig, tmp / "config.json")
        for pattern in _EXTRA_FILE_PATTERNS:
            for file in src_path.glob(pattern):
                if file.name not in _NOT_COPIED and file.is_file():
                    shutil.copy2(file, tmp / file.name)
        gc.collect()
        mx.clear_cache()
        if verify:
            _verify_checkpoint(tmp)
            log("Checked: the quantized checkpoint loads and generates.")
        written = folder_bytes(tmp)
    log(f"Wrote {dst}: {bits}-bit, group size {group_size}, {human_bytes(written)}.")
    return dst


def _verify_checkpoint(path: Path) -> None:
    """Load a written checkpoint with the engine and generate one token."""
    from ..engine import StarCoderEngine

    engine = StarCoderEngine.load(path)
    try:
        engine.generate("def main():", max_tokens=1)
    finally:
        engine.close()


# --- info ------------------------------------------------------------------------------------------


def checkpoint_info(
    model: str | os.PathLike[str],
    revision: str | None = None,
    *,
    gguf_file: str | None = None,
    sliding_window: int | None = None,
) -> dict[str, Any]:
    """What a checkpoint is, read from its config and safetensors headers, or from a GGUF file's metadata
    and tensor table (the weights stay on disk). ``gguf_file`` and ``sliding_window`` as in
    ``StarCoderEngine.load``; a GGUF file's notices (defaults it filled in) are warnings (``GGUFNotice``)."""
    from ..gguf_format import is_gguf

    if is_gguf(model, gguf_file):
        return _gguf_info(model, gguf_file, revision, sliding_window)
    if sliding_window is not None:
        msg = "--sliding-window applies to GGUF files only; a checkpoint folder's config.json sets it."
        raise InvalidParameterError(msg)
    return _folder_info(model, revision)


def _folder_info(model: str | os.PathLike[str], revision: str | None) -> dict[str, Any]:
    from ..loading import read_config, resolve_model_path, weight_headers

    path = resolve_model_path(model, revision)
    config = read_config(path)
    quant = config.get("quantization")
    tensors: dict[str, dict[str, Any]] = {}
    headers = weight_headers(path)
    for header in headers.values():
        tensors.update(header)

    parameters = 0
    float_bytes: Counter[str] = Counter()
    for name, tensor in tensors.items():
        stem = name.rsplit(".", 1)[0]
        packed = tensors.get(stem + ".weight", {}).get("dtype") == "U32"
        if packed and name.endswith((".scales", ".biases")):
            continue  # quantization metadata, not parameters
        count = math.prod(tensor["shape"])
        if tensor["dtype"] == "U32" and quant:
            layer_bits = (quant.get(stem) or {}).get("bits", quant.get("bits", 4))
            count = count * 32 // layer_bits
        else:
            float_bytes[tensor["dtype"]] += count * _DTYPE_BYTES.get(tensor["dtype"], 4)
        parameters += count
    stored = _SAFETENSORS_DTYPES.get(float_bytes.most_common(1)[0][0], "?") if float_bytes else "?"
    tokenizer_config: dict[str, Any] = {}
    with contextlib.suppress(OSError, json.JSONDecodeError):
        tokenizer_config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    added = {t.get("content") for t in tokenizer_config.get("added_tokens_decoder", {}).values()}
    with contextlib.suppress(OSError, json.JSONDecodeError):
        tok = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
        added |= {t.get("content") for t in tok.get("added_tokens", [])}
    chat_template = bool(tokenizer_config.get("chat_template")) or (path / "chat_template.jinja").is_file()
    quantization = None
    if quant:
        quantization = {"bits": quant.get("bits"), "group_size": quant.get("group_size")}
        quantization["mode"] = quant.get("mode", "affine")
    return _describe(
        model, path, config, parameters, stored, quantization, list(headers), added, chat_template
    )


def _gguf_info(
    model: str | os.PathLike[str], gguf_file: str | None, revision: str | None, sliding_window: int | None
) -> dict[str, Any]:
    from ..gguf_format import (
        FLOAT_TYPES,
        GROUP_SIZE,
        quantized_layers,
        read_gguf,
        resolve_gguf_file,
        warn_notices,
    )

    checkpoint = read_gguf(resolve_gguf_file(model, gguf_file, revision), sliding_window=sliding_window)
    warn_notices(checkpoint)
    tensors = checkpoint.header.tensors.values()
    float_bytes: Counter[str] = Counter()
    for t in tensors:
        if t.type_name in FLOAT_TYPES:
            float_bytes[t.type_name] += t.nbytes
    stored = _SAFETENSORS_DTYPES.get(float_bytes.most_common(1)[0][0], "?") if float_bytes else "?"
    bits = Counter(q["bits"] for q in quantized_layers(checkpoint.header).values())
    quantization = None  # the bits most tensors kept (a file may mix Q4_0 and Q8_0)
    if bits:
        quantization = {"bits": bits.most_common(1)[0][0], "group_size": GROUP_SIZE, "mode": "affine"}
    meta = checkpoint.header.metadata
    tokens = meta.get("tokenizer.ggml.tokens") or []
    name = os.fspath(model) if gguf_file is None else f"{os.fspath(model)}/{gguf_file}"
    info = _describe(
        name,
        checkpoint.path,
        checkpoint.config,
        sum(math.prod(t.shape) for t in tensors),
        stored,
        quantization,
        [checkpoint.path],
        set(tokens),
        bool(meta.get("tokenizer.chat_template")),
    )
    info["gguf_types"] = dict(Counter(t.type_name for t in tensors).most_common())
    return info


def _describe(
    model: str | os.PathLike[str],
    path: Path,
    config: dict[str, Any],
    parameters: int,
    stored: str,
    quantization: dict[str, Any] | None,
    files: list[Path],
    tokens: set[str | None],
    chat_template: bool,
) -> dict[str, Any]:
    """The info dict of a checkpoint, from what its format says."""
    import mlx.core as mx

    from ..loading import model_args

    args = model_args(config)  # the family's settings (StarCoder2 or GPTBigCode)
    on_cpu = mx.default_device() == mx.cpu
    return {
        "model": str(model),
        "path": str(path),
        "architecture": config.get("model_type"),
        "layers": args.num_hidden_layers,
        "hidden_size": args.hidden_size,
        "attention_heads": args.num_attention_heads,
        "kv_heads": args.num_key_value_heads,
        "head_dim": args.head_dim,
        "intermediate_size": args.intermediate_size,
        "vocab_size": args.vocab_size,
        "tied_embeddings": bool(config.get("tie_word_embeddings", True)),
        "parameters": parameters,
        "dtype": stored,
        "compute_dtype": "float32" if on_cpu else stored,
        "quantization": quantization,
        "context_window": args.max_position_embeddings,
        "sliding_window": args.sliding_window,
        "rope_theta": getattr(args, "rope_base", None),  # None: GPTBigCode's learned positions
        "weight_files": len(files),
        "weight_bytes": sum(f.stat().st_size for f in files),
        "fim": {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"} <= tokens,
        "repo_level_fim": {"<repo_name>", "<file_sep>"} <= tokens,
        "chat_template": chat_template,
    }


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def format_info(info: dict[str, Any]) -> str:
    """:func:`checkpoint_info` as aligned ``key: value`` lines for people."""
    q = info["quantization"]
    window = info["sliding_window"]
    types = info.get("gguf_types")
    gguf = f" (GGUF tensors: {', '.join(f'{n} {t}' for t, n in types.items())})" if types else ""
    rows: Sequence[tuple[str, str]] = [
        ("model", info["model"] if info["model"] == info["path"] else f"{info['model']} ({info['path']})"),
        (
            "architecture",
            f"{info['architecture']}: {info['layers']} layers, hidden {info['hidden_size']}, "
            f"{info['attention_heads']} heads ({info['kv_heads']} KV, head dim {info['head_dim']}), "
            f"MLP {info['intermediate_size']}, vocab {info['vocab_size']}"
            + (", tied embeddings" if info["tied_embeddings"] else ""),
        ),
        ("parameters", f"{human_count(info['parameters'])} ({info['parameters']:,})"),
        ("dtype", f"{info['dtype']} on disk; computes in {info['compute_dtype']} here (dtype='auto')"),
        ("quantization", f"{q['bits']}-bit, group size {q['group_size']} ({q['mode']})" if q else "none"),
        (
            "context",
            f"{info['context_window']} tokens, "
            + (f"sliding window {window}" if window else "full attention (no sliding window)"),
        ),
        (
            "rope theta",
            "none (learned positions)" if info["rope_theta"] is None else f"{info['rope_theta']:g}",
        ),
        ("weights", f"{human_bytes(info['weight_bytes'])} in {info['weight_files']} file(s){gguf}"),
        (
            "tokens",
            f"FIM {_yes(info['fim'])}, repository FIM {_yes(info['repo_level_fim'])}, "
            f"chat template {_yes(info['chat_template'])}",
        ),
    ]
    return "\n".join(f"{k + ':':<14}{v}" for k, v in rows)
