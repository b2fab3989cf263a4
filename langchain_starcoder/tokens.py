"""Deprecated name of :mod:`langchain_starcoder._tokens`."""

from ._deprecated import moved

moved(__name__, "langchain_starcoder._tokens", "count tokens with StarCoderEngine.count_tokens")
