"""Deprecated name of :mod:`langchain_starcoder.editor.supersede` (shared with Jupyter)."""

from .._deprecated import moved

moved(__name__, "langchain_starcoder.editor.supersede", "import it from langchain_starcoder.editor")
