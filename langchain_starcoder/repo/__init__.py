"""Repository context: an index of a folder's code, code-aware chunks and definitions (tree-sitter),
and the ranking that packs a hole's related code into a token budget as ContextFiles."""

from .index import RepoIndex
from .rank import FRAME_TOKENS, GAP_MARKER

__all__ = ["FRAME_TOKENS", "GAP_MARKER", "RepoIndex"]
