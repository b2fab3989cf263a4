"""A ready MLX model from a checked checkpoint: load settings, CPU-aware dtypes, quantize-on-load."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..errors import CheckpointError, InvalidParameterError
from .config import read_config
from .families import ModelArgs, _family, model_args
from .weights import check_weights_match_config, weight_headers

DTYPES = ("auto", "float32", "float16", "bfloat16")
QUANTIZE_BITS = (None, 4, 8)
GROUP_SIZES = (32, 64, 128)
KV_BITS = (None, 4, 8)


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
