"""Fine-tune StarCoder2 on a repository (issue 41), following mlx-lm's tuner, one concern a module:

- :mod:`.split`: which files are trained on and which held out, by whole file.
- :mod:`.data`: the training examples, in StarCoder2's repository layout with FIM, masked for
  mlx-lm's trainer.
- :mod:`.train`: ``finetune``, through mlx-lm's trainer; :mod:`.checkpoints` (resume state, written
  atomically) and :mod:`.log` (finetune.json, loss.png) are its parts.
- :mod:`.export`: an adapter merged into its base, in PEFT's layout, or as llama.cpp's GGUF adapter.
"""

from .data import RepoDataset, build_dataset
from .export import fuse_adapter, to_gguf_lora, to_peft
from .split import FileSplit, TooLittleCodeError, split_files
from .train import METHODS, FinetuneResult, finetune

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
