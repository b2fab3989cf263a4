"""How deep llguidance's compiler may recurse on a constraint, bounded before it runs.

llguidance compiles a JSON Schema's ``$ref``s and a Lark grammar's rules depth first, one native stack
frame per reference followed and per nested part (llguidance 1.9.1): a chain of about 1,050
``{"anyOf": [{"$ref": next}, ...]}`` or of 2,700 rules ``r_i: r_{i+1} | "a"`` overflows a thread's
8 MiB stack and kills the process (SIGSEGV). Nesting inside one schema or one rule is bounded by
llguidance itself (128 JSON levels; Lark groups, regexes), chains of references are not.

:func:`depth` is an upper bound of that recursion, in units of one nesting level or one reference
followed, read from the text alone (no graph walk that an adversary could make expensive): a path
through the references visits each rule or ``$ref`` target at most once (llguidance compiles each
once), and inside each at most its own nesting. :data:`MAX_DEPTH` refuses what could come near the
end of the compile thread's stack (:mod:`.native`), with the margin measured there.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import GrammarError

#: The most units of recursion (:func:`depth`) a constraint may need. Measured (llguidance 1.9.1,
#: x86-64, in subprocesses): the costliest unit took about 3.3 kB of native stack (a chain of
#: ``{"allOf": [{"$ref": next}], "type": "object"}``); at this bound that is about 33 MB, an eighth of
#: the compile thread's 256 MiB. A real schema or grammar needs a few hundred (a 200-rule C grammar,
#: a schema of 100 definitions 10 levels deep: about 1,000).
MAX_DEPTH = 10_000

#: The most rules a GBNF grammar may have: llguidance converts GBNF to Lark in Python, in time that
#: grows with the square of a chain of rules (1,000 chained rules: about 3 s; 4,000: 73 s).
MAX_GBNF_RULES = 1_000

# Lark's lexemes that cannot nest (llguidance's own patterns, lark/lexer.rs): strings, /regexes/,
# comments, whitespace; and the openers that can: a rule's colon, groups, options, a nested grammar.
_LARK = re.compile(
    r"""(?P<flat>"(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2})|[^"\\\x00-\x1f\x7f])*"i?"""
    r"""|/(?:\\.|[^/\\])+/[imslux]*|(?:\#|//)[^\n]*|[^:(\[{%"/#]+)"""
    r"""|(?P<json>%(?:json|llguidance|regex)\b)|(?P<open>[:(\[{])|(?P<other>.)""",
    re.DOTALL,
)


def check_schema(schema: Any) -> None:
    """:class:`GrammarError` if the JSON Schema ``schema`` could recurse deeper than :data:`MAX_DEPTH`."""
    _check(schema_depth(schema), "json_schema", "definitions chained by $ref, and their nesting,")


def check_lark(text: str) -> None:
    """:class:`GrammarError` if the Lark grammar ``text`` (GBNF converted to Lark) could recurse deeper
    than :data:`MAX_DEPTH`."""
    _check(lark_depth(text), "grammar", "rules, groups and %json schemas")


def check_gbnf(text: str) -> None:
    """:class:`GrammarError` if the GBNF grammar ``text`` has more than :data:`MAX_GBNF_RULES` rules
    (each ``::=`` counts, so that the bound costs one pass)."""
    rules = text.count("::=")
    if rules > MAX_GBNF_RULES:
        msg = (
            f"The grammar has {rules:,} GBNF rules (::=), over the limit of {MAX_GBNF_RULES:,}: merge "
            "rules, or give the grammar in Lark (start: ...), which is not converted."
        )
        raise GrammarError(msg)


def _check(need: int, what: str, parts: str) -> None:
    if need > MAX_DEPTH:
        msg = (
            f"The {what} is too deep to compile safely: its {parts} add up to {need:,} levels "
            f"(the limit is {MAX_DEPTH:,}). Chain fewer definitions: a repetition (item*, an array) "
            "instead of a chain of rules or $refs."
        )
        raise GrammarError(msg)


def schema_depth(schema: Any) -> int:
    """The root's nesting plus, for each distinct ``$ref`` (or ``$dynamicRef``, ``$recursiveRef``), one
    level and the nesting of its target (the whole document's for a target not found locally)."""
    heights, refs = _heights(schema)
    root = heights.get(id(schema), 0)
    return root + sum(1 + heights.get(id(_target(schema, ref)), root) for ref in refs)


def lark_depth(text: str) -> int:
    """Each rule or token definition (its colon), group ``(``, option ``[`` and brace ``{`` counts one;
    each ``%json`` schema its :func:`schema_depth` (``%regex`` and ``%llguidance`` options: their
    nesting)."""
    total, pos = 0, 0
    while pos < len(text):
        match = _LARK.match(text, pos)
        assert match is not None  # (the last alternative takes any character)
        pos = match.end()
        if match.group("open"):
            total += 1
        elif match.group("json"):
            value, pos = _json_prefix(text, pos)
            total += schema_depth(value) if match.group("json") == "%json" else _nesting(value)
    return total


def _json_prefix(text: str, pos: int) -> tuple[Any, int]:
    """The JSON value at ``text[pos:]`` (after blanks) and where it ends; a value that does not parse
    counts nothing here (llguidance refuses it with its own error)."""
    start = len(text) - len(text[pos:].lstrip())
    try:
        return json.JSONDecoder().raw_decode(text, start)
    except RecursionError:
        raise GrammarError("A %json schema in the grammar is nested too deeply to read.") from None
    except ValueError:
        return None, start


def _heights(schema: Any) -> tuple[dict[int, int], set[str]]:
    """The nesting of every dict and list in ``schema`` (1 for one without either inside, by ``id``),
    each measured once, and the distinct references in it."""
    refs: set[str] = set()
    order = []  # parents before their children
    stack = [schema] if isinstance(schema, dict | list) else []
    while stack:
        node = stack.pop()
        order.append(node)
        if isinstance(node, dict):
            refs.update(node[k] for k in _REF_KEYS if isinstance(node.get(k), str))
        stack.extend(c for c in _children(node) if isinstance(c, dict | list))
    heights: dict[int, int] = {}
    for node in reversed(order):
        inner = [heights[id(c)] for c in _children(node) if isinstance(c, dict | list)]
        heights[id(node)] = 1 + max(inner, default=0)
    return heights, refs


_REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")


def _children(node: dict[str, Any] | list[Any]) -> Any:
    return node.values() if isinstance(node, dict) else node


def _nesting(value: Any) -> int:
    return _heights(value)[0].get(id(value), 0)


def _target(schema: Any, ref: str) -> Any:
    """The local target of ``ref`` (``#/a/b`` JSON pointers), or the whole schema (a bound for any)."""
    if not ref.startswith("#/"):
        return schema
    node = schema
    for part in ref[2:].split("/"):
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return schema
    return node
