"""A model on another model's weights: the same ``mx.array`` objects, not a copy, with an adapter applied.

``serve --adapter NAME=DIR`` serves several adapters of one base; loading the base once per adapter would
cost its weights each time. Here the module tree is built again (its random initial arrays are lazy and
never evaluated, so they cost nothing), given the base's structure (quantized where the base is) and then
the base's parameters by :meth:`mlx.nn.Module.update`, which stores the very arrays; the adapter's layers
wrap those. An adapter so costs its own tensors only.
"""

from __future__ import annotations

from typing import Any

import mlx.nn as nn
from mlx.utils import tree_flatten

from ..loading import LoadedModel
from ..loading.adapter import Adapter, apply_adapter


def adapted_copy(base: LoadedModel, adapter: Adapter, name: str) -> LoadedModel:
    """A model of ``base``'s class over ``base``'s own weight arrays, with ``adapter`` applied; ``base``
    is left as it was. ``name`` names the base in an adapter's errors."""
    model = type(base.model)(base.args)  # lazy: nothing of it is computed before it is replaced
    _quantize_like(model, base.model)
    model.update(base.model.parameters())
    ours, theirs = dict(tree_flatten(model.parameters())), dict(tree_flatten(base.model.parameters()))
    if ours.keys() != theirs.keys():  # (a module the class makes that the loaded base lacks, or more)
        differ = sorted(ours.keys() ^ theirs.keys())
        msg = f"{name}'s model could not be rebuilt on its own weights (they differ in {differ[:3]})."
        raise RuntimeError(msg)
    apply_adapter(model, base.args, adapter, name)
    return LoadedModel(model, base.args, base.config)


def _quantize_like(model: nn.Module, base: nn.Module) -> None:
    """Quantize the modules of ``model`` that are quantized in ``base``, with the same settings."""
    quantized = {
        path: {"group_size": m.group_size, "bits": m.bits, "mode": m.mode}
        for path, m in base.named_modules()
        if isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding)
    }
    if quantized:

        def settings_of(path: str, _: Any) -> dict[str, Any] | bool:
            return quantized.get(path, False)

        nn.quantize(model, class_predicate=settings_of)
