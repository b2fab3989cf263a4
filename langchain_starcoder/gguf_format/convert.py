"""GGUF -> an MLX checkpoint folder (safetensors, config.json, tokenizer files)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .checkpoint import read_gguf, warn_notices
from .ggml_types import GROUP_SIZE
from .tokenizer import gguf_tokenizer
from .weights import dequantized_notice, quantization_entries, quantized_layers, read_weights


def convert_gguf(src: str | os.PathLike[str], dst: Path, *, sliding_window: int | None = None) -> None:
    """Write an MLX checkpoint folder (safetensors, config.json, tokenizer files) from a GGUF file
    into the existing folder ``dst``: Q4_0/Q4_1/Q8_0 stay quantized (mlx-lm's layout and
    ``quantization`` config, per-layer bits where a file mixes them), floats keep their dtype."""
    import mlx.core as mx

    checkpoint = read_gguf(src, sliding_window=sliding_window)
    if notice := dequantized_notice(checkpoint, 2):
        checkpoint.notices.append(notice)
    tokenizer = gguf_tokenizer(checkpoint)
    warn_notices(checkpoint)
    weights = read_weights(checkpoint)
    config = dict(checkpoint.config)
    layers = quantized_layers(checkpoint.header)
    if layers:
        config["quantization"] = {"group_size": GROUP_SIZE, **quantization_entries(layers)}
        config["quantization_config"] = config["quantization"]
    floats = {w.dtype for w in weights.values() if mx.issubdtype(w.dtype, mx.floating)}
    config["torch_dtype"] = next(
        (name for name in ("float32", "bfloat16") if getattr(mx, name) in floats), "float16"
    )
    mx.save_safetensors(str(dst / "model.safetensors"), weights, metadata={"format": "mlx"})
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    tokenizer._tokenizer.save_pretrained(dst)
    # transformers 5 names the class TokenizersBackend, which transformers 4 does not know
    settings = json.loads((dst / "tokenizer_config.json").read_text(encoding="utf-8"))
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    settings.setdefault("additional_special_tokens", settings.get("extra_special_tokens", []))
    (dst / "tokenizer_config.json").write_text(json.dumps(settings, indent=2, ensure_ascii=False))
