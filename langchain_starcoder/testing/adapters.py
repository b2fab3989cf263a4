"""Adapters with random weights for a built checkpoint, in mlx-lm's layout, for tests and benchmarks.

mlx-lm's ``linear_to_lora_layers`` makes the layers (as ``mlx_lm.lora`` does before training); their
``lora_b`` start at zero, so they are drawn at random here (a trained adapter's are not zero either),
and the adapter is saved as ``mlx_lm.lora`` saves one: ``adapters.safetensors`` (the trained tensors)
and ``adapter_config.json`` (its settings, and the base's shape under ``base_model``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ..loading import check_choice, load_model
from ..loading.adapter import BASE_KEY, CONFIG_FILE, FINE_TUNE_TYPES, WEIGHTS_FILE, base_signature


def build_adapter(
    model: str | Path,
    out: str | Path,
    *,
    method: str = "lora",
    rank: int = 4,
    scale: float = 20.0,
    num_layers: int | None = None,
    keys: Sequence[str] | None = None,
    strength: float = 0.02,
    seed: int = 0,
) -> Path:
    """Write an adapter for the checkpoint folder ``model`` to folder ``out`` and return ``out``.

    Args:
        model: A checkpoint folder (e.g. from :func:`langchain_starcoder.testing.build_starcoder2`).
        out: The adapter folder to write (made if missing; its two files are replaced).
        method: "lora", "dora" or "full" (every weight, perturbed by ``strength`` times its own scale).
        rank, scale: mlx-lm's ``lora_parameters`` (``scale`` multiplies the low-rank update).
        num_layers: How many of the last layers are adapted (None: all).
        keys: The modules adapted in each layer (``["self_attn.q_proj", "self_attn.v_proj"]``);
            None: every linear layer, as mlx-lm does by default.
        strength: The standard deviation of the random ``lora_b`` (LoRA, DoRA) weights.
        seed: The same seed gives the same adapter.
    """
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import linear_to_lora_layers

    check_choice("method", method, FINE_TUNE_TYPES)
    loaded = load_model(Path(model), quantize=None, group_size=64, dtype="float32")
    layers = len(loaded.model.layers) if num_layers is None else num_layers
    lora = {"rank": rank, "dropout": 0.0, "scale": scale}
    if keys is not None:
        lora["keys"] = list(keys)
    mx.random.seed(seed)  # (mlx-lm draws lora_a from MLX's global generator)
    rng = np.random.default_rng(seed)
    if method == "full":
        params = dict(tree_flatten(loaded.model.parameters()))
        tensors = {
            n: p + mx.array(rng.standard_normal(p.shape, dtype=np.float32)) * strength * _rms(p)
            for n, p in params.items()
        }
    else:
        linear_to_lora_layers(loaded.model, layers, lora, use_dora=method == "dora")
        params = dict(tree_flatten(loaded.model.parameters()))
        tensors = {n: p for n, p in params.items() if n.rsplit(".", 1)[-1] in ("lora_a", "lora_b", "m")}
        for n, p in tensors.items():
            if n.endswith(".lora_b"):
                tensors[n] = mx.array(rng.standard_normal(p.shape, dtype=np.float32) * strength)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / WEIGHTS_FILE), tensors)
    config = {
        "model": str(model),
        "fine_tune_type": method,
        "num_layers": layers,
        "lora_parameters": lora,
        BASE_KEY: base_signature(loaded.args),
    }
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=4))
    return folder


def _rms(a: object) -> float:
    import mlx.core as mx

    return float(mx.sqrt(mx.mean(mx.square(a)))) or 1.0  # type: ignore[arg-type]
