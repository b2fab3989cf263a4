"""Fine-tune StarCoder2 on a repository (issue 41), following mlx-lm's tuner, one concern a module:

- :mod:`.split`: which files are trained on and which held out, by whole file.
- :mod:`.data`: the training examples, in StarCoder2's repository layout with FIM, masked for
  mlx-lm's trainer.
- :mod:`.train`: ``finetune``, through mlx-lm's trainer; :mod:`.checkpoints` (resume state, written
  atomically) and :mod:`.log` (finetune.json, loss.png) are its parts.
- :mod:`.export`: an adapter merged into its base, in PEFT's layout, or as llama.cpp's GGUF adapter.
- :mod:`.settings`: the settings' defaults, which the command line reads without loading MLX.

Imported on first use (PEP 562), so importing :mod:`.settings` does not load MLX through this file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .data import RepoDataset, build_dataset
    from .export import fuse_adapter, to_gguf_lora, to_peft
    from .settings import METHODS
    from .split import FileSplit, TooLittleCodeError, split_files
    from .train import FinetuneResult, finetune

# Public name -> the module that defines it.
_EXPORTS = {
    "METHODS": "settings",
    "FileSplit": "split",
    "FinetuneResult": "train",
    "RepoDataset": "data",
    "TooLittleCodeError": "split",
    "build_dataset": "data",
    "finetune": "train",
    "fuse_adapter": "export",
    "split_files": "split",
    "to_gguf_lora": "export",
    "to_peft": "export",
}

__all__ = [
    "METHODS",
    "FileSplit",
    "FinetuneResult",
    "RepoDataset",
    "TooLittleCodeError",
    "build_dataset",
    "finetune",
    "fuse_adapter",
    "split_files",
    "to_gguf_lora",
    "to_peft",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
