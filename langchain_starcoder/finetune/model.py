"""The model a fine-tuning run trains: loaded as the engine loads it, made trainable with mlx-lm's LoRA or
DoRA layers (over a quantized base: QLoRA) or on its weights, optionally with mlx-lm's gradient
checkpointing; and the ``adapter_config.json`` that says how to apply what it learns."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import InvalidParameterError
from .checkpoints import ADAPTER_CONFIG

#: mlx-lm's LoRA defaults (mlx_lm.lora's CONFIG_DEFAULTS): the update is scaled by 20, no dropout.
LORA_SCALE = 20.0
LORA_DROPOUT = 0.0


def load_trainable(settings: dict[str, Any]) -> Any:
    """The model as the engine loads it, made trainable as ``method`` says: mlx-lm's LoRA or DoRA layers
    on the linear maps of the last ``num_layers`` layers (over a quantized base: QLoRA), or those
    layers' weights (full)."""
    from mlx_lm.tuner.utils import linear_to_lora_layers

    from ..loading import load_model, read_config, resolve_model_path

    path = resolve_model_path(settings["model"])
    config = read_config(path)
    method = settings["method"]
    if method == "full" and "quantization" in config:
        msg = (
            f"{settings['model']} is quantized: its weights cannot be trained. Fine-tune it with "
            "method='lora' or 'dora' (QLoRA), or train all weights of its unquantized checkpoint."
        )
        raise InvalidParameterError(msg)
    model = load_model(path, quantize=None, group_size=64, dtype="auto", config=config).model
    layers = _layers(settings, model)
    model.freeze()
    if method == "full":
        for layer in model.layers[-layers:]:
            layer.unfreeze()
    else:
        linear_to_lora_layers(model, layers, _lora_parameters(settings), use_dora=method == "dora")
    return model


def _layers(settings: dict[str, Any], model: Any) -> int:
    """How many of the last layers are adapted or trained (``num_layers``; None: all of them)."""
    total, wanted = len(model.layers), settings["num_layers"]
    if wanted is not None and wanted > total:
        msg = f"num_layers={wanted}, but {settings['model']} has {total} layers: give at most {total}."
        raise InvalidParameterError(msg)
    return total if wanted is None else wanted


def _lora_parameters(settings: dict[str, Any]) -> dict[str, Any] | None:
    if settings["method"] == "full":
        return None
    return {"rank": settings["rank"], "scale": LORA_SCALE, "dropout": LORA_DROPOUT}


def write_adapter_config(out: Path, settings: dict[str, Any], model: Any) -> None:
    """mlx-lm's ``adapter_config.json`` (what ``load_adapters`` reads: the method, the layers, the LoRA
    parameters), with the base's shape (what the engine checks an adapter against a model by)."""
    from ..loading.adapter import BASE_KEY, base_signature
    from .checkpoints import write_atomically

    config = {
        "model": settings["model"],
        "fine_tune_type": settings["method"],
        "num_layers": _layers(settings, model),
        "lora_parameters": _lora_parameters(settings),
        BASE_KEY: base_signature(model.args),
        **{k: v for k, v in settings.items() if k not in ("model", "method", "num_layers", "data_digest")},
    }
    text = json.dumps(config, indent=2, sort_keys=True)
    write_atomically(out / ADAPTER_CONFIG, lambda p: Path(p).write_text(text, encoding="utf-8"))


@contextlib.contextmanager
def checkpointed(model: Any) -> Iterator[None]:
    """mlx-lm's gradient checkpointing for ``model``'s layers while the block runs (None: off). It patches
    the layer class, which the engine's models share: the class is restored after."""
    if model is None:
        yield
        return
    from mlx_lm.tuner.trainer import grad_checkpoint

    kind = type(model.layers[0])
    call = kind.__call__
    grad_checkpoint(model.layers[0])
    try:
        yield
    finally:
        kind.__call__ = call
