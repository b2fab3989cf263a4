"""Notebook context: a Jupyter notebook's cells and outputs as StarCoder2's structured-notebook prompt."""

from .cells import NotebookCell, NotebookContext, render_outputs
from .layout import NOTEBOOK_TOKENS, NotebookParts, notebook_parts

__all__ = [
    "NOTEBOOK_TOKENS",
    "NotebookCell",
    "NotebookContext",
    "NotebookParts",
    "notebook_parts",
    "render_outputs",
]
