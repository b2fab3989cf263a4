"""Old module names that moved, kept importable for one release with a DeprecationWarning."""

from __future__ import annotations

import importlib
import sys
import warnings


def moved(old: str, new: str, instead: str) -> None:
    """Make module ``old`` the module ``new`` (same objects, so patches and isinstance agree),
    warning the importer to use ``instead``."""
    message = f"{old} is deprecated and will be removed in the next release: {instead}."
    warnings.warn(message, DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
