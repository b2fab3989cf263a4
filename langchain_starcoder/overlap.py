"""Deprecated name of :mod:`langchain_starcoder.fim.overlap`."""

from ._deprecated import moved

moved(__name__, "langchain_starcoder.fim.overlap", "import from langchain_starcoder.fim.overlap")
