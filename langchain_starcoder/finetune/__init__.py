"""Fine-tune StarCoder2 on a repository (issue 41), following mlx-lm's tuner, one concern a module:

- :mod:`.split`: which files are trained on and which held out, by whole file.
- :mod:`.data`: the training examples, in StarCoder2's repository layout with FIM, masked for
  mlx-lm's trainer.
"""

from .data import RepoDataset, build_dataset
from .split import FileSplit, TooLittleCodeError, split_files

__all__ = [
    "FileSplit",
    "RepoDataset",
    "TooLittleCodeError",
    "build_dataset",
    "split_files",
]
