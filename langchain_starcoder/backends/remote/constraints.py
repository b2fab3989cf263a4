"""A generation's constraint (``json_schema``, ``regex`` or ``grammar``) in the fields each server takes,
so the server enforces it while it decodes (the front still checks the finished text).

- llama.cpp's ``/completion``: ``json_schema`` as it is; ``grammar`` in GBNF, so a GBNF grammar goes as it
  is, a regex is converted to GBNF here, and a Lark grammar is refused with what to do (llama-server is
  built without llguidance, the only way it reads Lark).
- vLLM's ``/v1/completions`` (0.12 and later): ``structured_outputs`` with ``regex`` or ``grammar`` (vLLM
  reads GBNF and Lark; with ``auto`` its backend falls back to llguidance for what xgrammar cannot do).
  A ``json_schema`` goes as a Lark grammar in llguidance's dialect (``%llguidance {}`` and ``%json``),
  the schema inside with the JSON options our engine uses (:func:`..grammar.json_options`): vLLM 0.32
  ignores a request's ``disable_any_whitespace`` and ``whitespace_pattern`` (only its server-wide setting
  counts), and its xgrammar lets JSON pad whitespace without end (a weak model then never closes the
  object). xgrammar refuses that dialect, so vLLM's ``auto`` decodes it with llguidance: compact JSON
  (``,`` and ``:``) as our engine writes it, unless the schema's own ``x-guidance`` options ask for
  whitespace. A vLLM started with another ``--structured-outputs-config.backend`` than ``auto`` (its
  default) or ``guidance`` refuses it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ...errors import GrammarError
from ...types import GenerationParams
from ..grammar import json_options

try:  # Python 3.11+: the parser behind ``re`` (sre_parse before, deprecated since)
    from re import _constants as sre  # type: ignore[attr-defined]
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as sre  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]


def llama_cpp_fields(params: GenerationParams) -> dict[str, Any]:
    """llama.cpp's ``json_schema`` or ``grammar`` (GBNF) for ``params``' constraint (empty without one)."""
    if params.json_schema is not None:
        return {"json_schema": params.json_schema}
    if params.regex is not None:
        return {"grammar": regex_to_gbnf(params.regex)}
    if params.grammar is not None:
        from llguidance.gbnf_to_lark import is_lark_syntax

        if is_lark_syntax(params.grammar):
            msg = (
                "A llama.cpp server takes grammars in GBNF (root ::= ...), not Lark: give the grammar in "
                "GBNF (the local engine reads both), or constrain with json_schema or regex."
            )
            raise GrammarError(msg)
        return {"grammar": params.grammar}
    return {}


def vllm_fields(params: GenerationParams) -> dict[str, Any]:
    """vLLM's ``structured_outputs`` for ``params``' constraint (empty without one)."""
    if params.json_schema is not None:
        return {"structured_outputs": {"grammar": json_schema_lark(params.json_schema)}}
    if params.regex is not None:
        return {"structured_outputs": {"regex": params.regex}}
    if params.grammar is not None:
        return {"structured_outputs": {"grammar": params.grammar}}
    return {}


def json_schema_lark(schema: dict[str, Any]) -> str:
    """``schema`` as a Lark grammar in llguidance's dialect, with the JSON options our engine uses:
    compact JSON unless the schema's own ``x-guidance`` options ask for whitespace."""
    schema = {**schema, "x-guidance": json_options(schema)}
    return f"%llguidance {{}}\nstart: %json {json.dumps(schema, separators=(',', ':'))}\n"


# --- regex -> GBNF -------------------------------------------------------------------------------------

_EMPTY = '""'  # GBNF's empty string
_LITERAL_SPECIALS = '"\\'
_CLASS_SPECIALS = "\\[]-^"


def _char(char: str, specials: str) -> str:
    """``char`` in a GBNF literal or class: control characters and ``specials`` as ``\\xHH`` (llama.cpp's
    escapes are few: ``\\x``, ``\\u``, ``\\t``, ``\\r``, ``\\n``, ``\\\\``, ``\\"``, ``\\[``, ``\\]``)."""
    return f"\\x{ord(char):02X}" if char in specials or ord(char) < 0x20 or char == "\x7f" else char


#: The classes of ``\d``, ``\w`` and ``\s`` (ASCII: GBNF has no Unicode categories).
_CATEGORIES = {
    sre.CATEGORY_DIGIT: (False, "0-9"),
    sre.CATEGORY_NOT_DIGIT: (True, "0-9"),
    sre.CATEGORY_WORD: (False, "a-zA-Z0-9_"),
    sre.CATEGORY_NOT_WORD: (True, "a-zA-Z0-9_"),
    sre.CATEGORY_SPACE: (False, " \\x09\\x0A\\x0B\\x0C\\x0D"),
    sre.CATEGORY_NOT_SPACE: (True, " \\x09\\x0A\\x0B\\x0C\\x0D"),
}
#: The most items one regex may have (each is a few characters of GBNF): a bound on the work here.
MAX_REGEX_ITEMS = 20_000


def regex_to_gbnf(regex: str) -> str:
    """``regex`` (matched in full) as a GBNF grammar, for llama.cpp. Literals, classes (``\\d``, ``\\w``
    and ``\\s`` as ASCII), ``.``, groups, alternation and repetition convert; what GBNF cannot express
    (lookaround, backreferences, flags) is refused with a clear error."""
    try:
        parsed = sre_parse.parse(regex)
    except (re.error, RecursionError, OverflowError) as e:
        raise GrammarError(f"The regex is invalid: {e}") from None
    if parsed.state.flags & (re.IGNORECASE | re.MULTILINE | re.DOTALL | re.VERBOSE):
        msg = "The regex sets flags ((?i), (?s)...), which llama.cpp's grammars cannot express; drop them."
        raise GrammarError(msg)
    return f"root ::= {_sequence(list(parsed), [0]) or _EMPTY}\n"


def _sequence(items: list[tuple[Any, Any]], count: list[int]) -> str:
    return " ".join(filter(None, (_item(op, arg, count) for op, arg in items)))


def _item(op: Any, arg: Any, count: list[int]) -> str:
    count[0] += 1
    if count[0] > MAX_REGEX_ITEMS:
        raise GrammarError(f"The regex has more than {MAX_REGEX_ITEMS} parts; simplify it for llama.cpp.")
    if op is sre.LITERAL:
        return f'"{_char(chr(arg), _LITERAL_SPECIALS)}"'
    if op is sre.NOT_LITERAL:
        return f"[^{_char(chr(arg), _CLASS_SPECIALS)}]"
    if op is sre.ANY:
        return "[^\\x0A]"
    if op is sre.IN:
        return _class(arg)
    if op is sre.CATEGORY:
        negated, members = _CATEGORIES[arg]
        return f"[{'^' if negated else ''}{members}]"
    if op is sre.AT:
        if arg in (sre.AT_BEGINNING, sre.AT_BEGINNING_STRING, sre.AT_END, sre.AT_END_STRING):
            return ""  # the whole output matches anyway
    elif op is sre.BRANCH:
        return "(" + " | ".join(_sequence(list(alt), count) or _EMPTY for alt in arg[1]) + ")"
    elif op is sre.SUBPATTERN:
        _group, add_flags, del_flags, pattern = arg
        if not add_flags and not del_flags:
            return "(" + (_sequence(list(pattern), count) or _EMPTY) + ")"
    elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
        low, high, pattern = arg
        inner = _sequence(list(pattern), count) or _EMPTY
        body = (
            inner if len(pattern) == 1 and pattern[0][0] in (sre.LITERAL, sre.IN, sre.ANY) else f"({inner})"
        )
        if (low, high) == (0, sre.MAXREPEAT):
            return f"{body}*"
        if (low, high) == (1, sre.MAXREPEAT):
            return f"{body}+"
        if (low, high) == (0, 1):
            return f"{body}?"
        return f"{body}{{{low},{'' if high == sre.MAXREPEAT else high}}}"
    msg = (
        f"The regex uses {str(op).lower()} (lookaround, a backreference or a flag), which llama.cpp's "
        "grammars cannot express; rewrite it without, or constrain with json_schema."
    )
    raise GrammarError(msg)


def _class(items: list[tuple[Any, Any]]) -> str:
    negated = bool(items) and items[0][0] is sre.NEGATE
    parts = []
    for op, arg in items[1:] if negated else items:
        if op is sre.LITERAL:
            parts.append(_char(chr(arg), _CLASS_SPECIALS))
        elif op is sre.RANGE:
            low, high = (_char(chr(c), _CLASS_SPECIALS) for c in arg)
            parts.append(f"{low}-{high}")
        elif op is sre.CATEGORY and not _CATEGORIES[arg][0]:
            parts.append(_CATEGORIES[arg][1])
        else:  # a negated category inside a class: [\D\s]
            msg = "The regex has \\D, \\W or \\S inside [...], which llama.cpp's grammars cannot express."
            raise GrammarError(msg)
    return f"[{'^' if negated else ''}{''.join(parts)}]"
