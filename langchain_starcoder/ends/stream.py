"""Deprecated name of :mod:`langchain_starcoder.decoding.middle` (the gate is a decoding filter)."""

from .._deprecated import moved

moved(
    __name__,
    "langchain_starcoder.decoding.middle",
    "import MiddleGate from langchain_starcoder.decoding.middle",
)
