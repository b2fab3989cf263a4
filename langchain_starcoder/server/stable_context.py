"""Deprecated name of :mod:`langchain_starcoder.editor.stable_context` (shared with Jupyter)."""

from .._deprecated import moved

moved(__name__, "langchain_starcoder.editor.stable_context", "import it from langchain_starcoder.editor")
