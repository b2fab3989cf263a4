"""The model families this package runs, and the one place that picks a config's family."""

from __future__ import annotations

from typing import Any

from ..models import gpt_bigcode, starcoder2

#: The model families this package runs: config.json's ``model_type`` -> its MLX module.
FAMILIES = {"starcoder2": starcoder2, "gpt_bigcode": gpt_bigcode}

ModelArgs = starcoder2.ModelArgs | gpt_bigcode.ModelArgs


def model_args(config: dict[str, Any]) -> ModelArgs:
    """The model's settings from a validated config (the one place that picks the family's class)."""
    return _family(config).ModelArgs.from_dict(config)


def _family(config: dict[str, Any]) -> Any:
    """The family's module (``models.starcoder2`` or ``models.gpt_bigcode``) for a read config."""
    return FAMILIES[config.get("model_type", "starcoder2")]
