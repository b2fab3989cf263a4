"""Where a fill-in-the-middle answer ends: syntax-aware ends of the middle, decided while it is decoded.

``middle_end(prefix, suffix, text)`` says how much of a generated middle to keep once the middle is
complete within it; :class:`MiddleEnd` does the same incrementally (a call at each generated line,
each with the whole middle so far), and :class:`~langchain_starcoder.decoding.middle.MiddleGate`
applies it to a stream (holding back what may be cut). Each reads its input about once: the time
grows with the length of the text, no faster. Pure: no model, no engine (the engine's decoding
filters use these rules while streaming, as they apply stop strings).
"""

import importlib
import warnings
from typing import Any

from .languages import SYNTAXES, Syntax, guess_language, language_of_path
from .rules import MODES, MiddleEnd, middle_end

__all__ = [
    "MODES",
    "SYNTAXES",
    "MiddleEnd",
    "Syntax",
    "guess_language",
    "language_of_path",
    "middle_end",
]


def __getattr__(name: str) -> Any:
    """``MiddleGate``, moved to :mod:`langchain_starcoder.decoding.middle`: kept here one release."""
    if name != "MiddleGate":
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    warnings.warn(
        "langchain_starcoder.ends.MiddleGate is deprecated and will be removed in the next release: "
        "import MiddleGate from langchain_starcoder.decoding.middle.",
        DeprecationWarning,
        stacklevel=2,
    )
    # imported by name: ends sits below decoding in the layers, and this alias is the one way up
    return importlib.import_module("langchain_starcoder.decoding.middle").MiddleGate
