"""Where a fill-in-the-middle answer ends: syntax-aware ends of the middle, decided while it is decoded.

``middle_end(prefix, suffix, text)`` says how much of a generated middle to keep once the middle is
complete within it; :class:`MiddleEnd` does the same incrementally (a call at each generated line,
each with the whole middle so far), and :class:`MiddleGate` applies it to a stream (holding back what
may be cut). Each reads its input about once: the time grows with the length of the text, no faster.
Pure: no model, no engine (the engine's sinks use the gate while streaming, as they apply stop strings).
"""

from .languages import SYNTAXES, Syntax, guess_language, language_of_path
from .rules import MODES, MiddleEnd, middle_end
from .stream import MiddleGate

__all__ = [
    "MODES",
    "SYNTAXES",
    "MiddleEnd",
    "MiddleGate",
    "Syntax",
    "guess_language",
    "language_of_path",
    "middle_end",
]
