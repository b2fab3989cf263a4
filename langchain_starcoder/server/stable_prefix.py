"""Deprecated name of :mod:`langchain_starcoder.editor.stable_prefix` (shared with Jupyter)."""

from .._deprecated import moved

moved(__name__, "langchain_starcoder.editor.stable_prefix", "import it from langchain_starcoder.editor")
