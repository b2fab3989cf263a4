"""Deprecated name of :mod:`langchain_starcoder.testing.gguf`."""

from ._deprecated import moved

moved(__name__, "langchain_starcoder.testing.gguf", "import from langchain_starcoder.testing.gguf")
