"""Deprecated name of :mod:`langchain_starcoder._blas`."""

from ._deprecated import moved

moved(__name__, "langchain_starcoder._blas", "set LANGCHAIN_STARCODER_BLAS=openblas")
