"""How deep llguidance's compiler may recurse on a constraint, bounded before it runs.

llguidance (1.9.1) compiles a JSON Schema's ``$ref``s and a Lark grammar's rules depth first, native
stack frames for each reference followed and each nested part, with no bound of its own on a chain of
references. Where a chain overflowed an 8 MiB stack (SIGSEGV: the process dies), measured in
subprocesses on x86-64 (links of the chain; units of :func:`schema_depth` / :func:`lark_depth`):

====================================================  =======  ======  ========
chain                                                   links   units  B/unit
====================================================  =======  ======  ========
``d_i: {"anyOf": [{"$ref": d_i+1}, {"const": "a"}]}``    1,046   4,191   2,002
``d_i: {"$ref": d_i+1}``                                 2,500   5,005   1,676
``d_i: {"type": "object", "properties": {"a": ref}}``     937   3,755   2,234
``d_i: {"allOf": [ref], "type": "object"}``              1,359   5,443   1,541
``d_i: {"type": "array", "items": ref}``                 1,093   3,285   2,554
``d_i``: 20 nested objects, then the ref                   73   3,111   2,696
Lark ``r_i: r_i+1 | "a"`` (the costliest unit)           2,687   2,689   3,120
Lark terminals ``T_i: "a" T_i+1 | "b"``                  3,562   3,564   2,354
GBNF ``r_i ::= r_i+1 | "a"``                             3,562   3,565   2,353
Lark ``r_i: ((((((((r_i+1)))))))) | "a"``                  476   4,286   1,957
the first chain inside a Lark ``%json``                  1,046   4,192   2,001
====================================================  =======  ======  ========

On a 64 MiB stack the same chains broke at 8 times the length (Lark rules 21,500: 3,121 B/unit;
the anyOf chain 8,375: 2,003), so the cost is linear. Nesting without references is refused by
llguidance itself before it costs much: JSON past 128 levels, Lark groups past about 30, regex groups
past its parser's limit (tried up to 128,000 of each: a clean error every time).

:func:`schema_depth` and :func:`lark_depth` bound that recursion from the text alone (no graph walk
that an adversary could make expensive): a path through the references visits each rule or ``$ref``
target at most once (llguidance compiles each once), and inside each at most its own nesting.
:data:`MAX_DEPTH` refuses what could come near the end of the compile thread's stack (:mod:`.native`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import GrammarError

#: The most units (:func:`schema_depth`, :func:`lark_depth`) a constraint may need: at the costliest
#: unit measured (3.1 kB) about 31 MB, an eighth of the compile thread's 256 MiB stack. Real constraints
#: need far less: a recursive tree schema 11, a 10-field object 3, a Python expression grammar 18; a
#: schema of 700 definitions each 6 levels deep about 5,000 (the bound sums every definition, as if
#: all were chained).
MAX_DEPTH = 10_000

#: The most rules a GBNF grammar may have: llguidance converts GBNF to Lark in Python, in time that
#: grows with the square of a chain of rules (1,000 chained rules: 1.1 s; 2,000: 4.4 s; 4,000: 14 s).
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
