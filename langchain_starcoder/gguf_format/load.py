"""A GGUF file for ``StarCoderEngine.load``: its config, tokenizer maker and weights loader."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, InvalidParameterError
from ..loading import LoadedModel, default_compute_dtype
from .checkpoint import GGUFCheckpoint, read_gguf, warn_notices
from .ggml_types import GROUP_SIZE
from .hub import is_gguf, resolve_gguf_file
from .tokenizer import gguf_tokenizer
from .weights import dequantized_notice, quantization_entries, quantized_layers, read_weights


def load_gguf_model(
    checkpoint: GGUFCheckpoint, *, quantize: int | None, group_size: int, dtype: str
) -> LoadedModel:
    """Build our module from a checked GGUF file; then the same dtype policy and quantize-on-load
    as safetensors checkpoints (``loading.finish_loading``)."""
    import mlx.nn as nn

    from ..loading import FAMILIES, finish_loading

    config = dict(checkpoint.config)
    layers = quantized_layers(checkpoint.header)
    family = FAMILIES[config["model_type"]]
    model = family.Model(family.ModelArgs.from_dict(config))
    if layers:
        nn.quantize(model, class_predicate=lambda path, _: layers.get(path, False))
    weights = read_weights(checkpoint)
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        msg = f"The weights of {checkpoint.path} do not fit a {config['model_type']} model: {e}"
        raise CheckpointError(msg) from e
    if layers:
        config["quantization"] = {"group_size": GROUP_SIZE, **quantization_entries(layers)}
    return finish_loading(model, config, quantize=quantize, group_size=group_size, dtype=dtype)


def check_quantize(checkpoint: GGUFCheckpoint, quantize: int | None) -> None:
    if quantize is not None and quantized_layers(checkpoint.header):
        msg = f"{checkpoint.path} is already quantized (Q4_0/Q4_1/Q8_0 tensors); load it with quantize=None."
        raise InvalidParameterError(msg)


def open_gguf(
    model: str | os.PathLike[str],
    gguf_file: str | None,
    revision: str | None,
    sliding_window: int | None,
    settings: dict[str, Any],
) -> tuple[str, Path, dict[str, Any], Callable[[], Any], Callable[[], LoadedModel]] | None:
    """For ``StarCoderEngine.load``: None if ``model`` is not a GGUF file, else its name, path,
    config, a tokenizer maker and the weights loader (``settings``: quantize, group_size, dtype)."""
    if not is_gguf(model, gguf_file):
        if sliding_window is not None:
            msg = "sliding_window= applies to GGUF files only; a checkpoint folder's config.json sets it."
            raise InvalidParameterError(msg)
        return None
    checkpoint = read_gguf(resolve_gguf_file(model, gguf_file, revision), sliding_window=sliding_window)
    check_quantize(checkpoint, settings["quantize"])
    dtype = settings["dtype"]
    if dtype == "auto":
        dtype = str(default_compute_dtype() or "float16").removeprefix("mlx.core.")
    if notice := dequantized_notice(checkpoint, 4 if dtype == "float32" else 2):
        checkpoint.notices.append(notice)

    def make_tokenizer() -> Any:
        tokenizer = gguf_tokenizer(checkpoint)
        warn_notices(checkpoint)  # once the file has passed every check
        return tokenizer

    name = os.fspath(model) if gguf_file is None else f"{os.fspath(model)}/{gguf_file}"
    loader = lambda: load_gguf_model(checkpoint, **settings)  # noqa: E731
    return name, checkpoint.path, checkpoint.config, make_tokenizer, loader
