"""Deprecated name of :mod:`langchain_starcoder._progress`."""

from ._deprecated import moved

moved(__name__, "langchain_starcoder._progress", "import show_progress from langchain_starcoder")
