"""Deprecated name of :mod:`langchain_starcoder.fim.request`."""

from ._deprecated import moved

moved(
    __name__, "langchain_starcoder.fim.request", "import FIMRequest, ContextFile from langchain_starcoder.fim"
)
