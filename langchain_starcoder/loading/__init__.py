"""From a folder or hub id to a ready MLX model and tokenizer: clear errors, CPU-aware dtypes.

One module per step: where the checkpoint is (``hub``), its config.json and the rules it must pass
(``config``), its safetensors weights and their fit with the config (``weights``), its tokenizer
(``tokenizer``), and the model built with the load settings (``build``); ``families`` is the family
dispatch every check reads.

Imported on first use (PEP 562): ``hub`` and ``digests`` need no MLX, so the command line's checks
(``serve`` before it binds its port) and the GGUF cache use them without paying for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .build import (
        DTYPES,
        GROUP_SIZES,
        KV_BITS,
        QUANTIZE_BITS,
        LoadedModel,
        check_choice,
        default_compute_dtype,
        finish_loading,
        load_model,
        validate_load_options,
    )
    from .config import CONFIG_RULES, GPT_BIGCODE_RULES, MAX_SIZE, read_config, validate_config
    from .families import FAMILIES, ModelArgs, model_args
    from .hub import ALLOW_PATTERNS, is_hub_id, resolve_model_path
    from .tokenizer import CodeDetokenizer, check_tokenizer_files, load_tokenizer
    from .weights import check_weights_match_config, expected_tensors, safetensors_header, weight_headers

# Public name -> the module that defines it.
_EXPORTS = {
    "ALLOW_PATTERNS": "hub",
    "CONFIG_RULES": "config",
    "CodeDetokenizer": "tokenizer",
    "DTYPES": "build",
    "FAMILIES": "families",
    "GPT_BIGCODE_RULES": "config",
    "GROUP_SIZES": "build",
    "KV_BITS": "build",
    "LoadedModel": "build",
    "MAX_SIZE": "config",
    "ModelArgs": "families",
    "QUANTIZE_BITS": "build",
    "check_choice": "build",
    "check_tokenizer_files": "tokenizer",
    "check_weights_match_config": "weights",
    "default_compute_dtype": "build",
    "expected_tensors": "weights",
    "finish_loading": "build",
    "is_hub_id": "hub",
    "load_model": "build",
    "load_tokenizer": "tokenizer",
    "model_args": "families",
    "read_config": "config",
    "resolve_model_path": "hub",
    "safetensors_header": "weights",
    "validate_config": "config",
    "validate_load_options": "build",
    "weight_headers": "weights",
}

__all__ = [
    "ALLOW_PATTERNS",
    "CONFIG_RULES",
    "DTYPES",
    "FAMILIES",
    "GPT_BIGCODE_RULES",
    "GROUP_SIZES",
    "KV_BITS",
    "MAX_SIZE",
    "QUANTIZE_BITS",
    "CodeDetokenizer",
    "LoadedModel",
    "ModelArgs",
    "check_choice",
    "check_tokenizer_files",
    "check_weights_match_config",
    "default_compute_dtype",
    "expected_tensors",
    "finish_loading",
    "is_hub_id",
    "load_model",
    "load_tokenizer",
    "model_args",
    "read_config",
    "resolve_model_path",
    "safetensors_header",
    "validate_config",
    "validate_load_options",
    "weight_headers",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
