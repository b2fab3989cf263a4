"""Where a file's holes can go, from its tree-sitter tree: each line's code (comments and strings over
several lines left out), statement blocks' bodies, call arguments and the names the file uses, as
character offsets into its text. Tree-sitter queries find the nodes (no walk of every node in Python).
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field
from typing import Any

from ..repo.symbols import parser_and_query

#: Nodes whose named children are a statement block's body (SAFIM's block holes).
BLOCKS = ("block", "statement_block", "compound_statement", "body_statement", "do_group")
#: Nodes whose ``arguments`` field is a call's parenthesized arguments (SAFIM's API-call holes).
CALLS = (
    "call",
    "call_expression",
    "method_invocation",
    "invocation_expression",
    "object_creation_expression",
    "new_expression",
)
#: Leaves that name something (a cross-file hole's identifier is one).
NAMES = (
    "identifier",
    "type_identifier",
    "property_identifier",
    "field_identifier",
    "shorthand_property_identifier",
    "simple_identifier",
    "constant",
    "namespace_identifier",
    "package_identifier",
)
#: Comments and string literals: a line's code is what lies outside them (strings on one line stay).
COMMENTS = ("comment", "line_comment", "block_comment")
STRINGS = (
    "string",
    "template_string",
    "string_literal",
    "raw_string_literal",
    "interpreted_string_literal",
    "text_block",
    "verbatim_string_literal",
    "raw_string",
    "heredoc_body",
)
#: Names a file binds (assigns, takes as parameters, loops over): defined in it, for the cross-file test.
BOUND = (
    "(assignment left: (identifier) @bound)",
    "(pattern_list (identifier) @bound)",
    "(parameters (identifier) @bound)",
    "(default_parameter name: (identifier) @bound)",
    "(typed_parameter (identifier) @bound)",
    "(typed_default_parameter name: (identifier) @bound)",
    "(for_statement left: (identifier) @bound)",
    "(for_in_clause left: (identifier) @bound)",
    "(as_pattern_target (identifier) @bound)",
    "(variable_declarator name: (identifier) @bound)",
    "(formal_parameters (identifier) @bound)",
    "(required_parameter pattern: (identifier) @bound)",
    "(optional_parameter pattern: (identifier) @bound)",
    "(short_var_declaration left: (expression_list (identifier) @bound))",
    "(parameter_declaration name: (identifier) @bound)",
    "(var_spec name: (identifier) @bound)",
    "(range_clause left: (expression_list (identifier) @bound))",
    "(formal_parameter name: (identifier) @bound)",
    "(catch_formal_parameter name: (identifier) @bound)",
    "(let_declaration pattern: (identifier) @bound)",
    "(parameter pattern: (identifier) @bound)",
    "(closure_parameters (identifier) @bound)",
)
#: Names that stand for another's parameter, not for a definition (``f(name=...)``).
LABELS = ("(keyword_argument name: (identifier) @label)",)
#: The most lines a block node may span to be looked at (its body is checked exactly later).
MAX_BLOCK_NODE_LINES = 40


@dataclass
class Spots:
    """A file's places for holes: per line the span of its code, block bodies and call arguments as
    ``(start, end)`` offsets, the names it uses as ``(start, end)`` per line, and the text."""

    text: str
    lines: list[str]
    line_starts: list[int]
    code: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Per line with code: where its first code character starts and its last ends."""
    blocks: list[tuple[int, int]] = field(default_factory=list)
    arguments: list[tuple[int, int]] = field(default_factory=list)
    names: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    bound: frozenset[str] = frozenset()
    """The names the file binds (assigns, takes as parameters, loops over)."""

    def row_of(self, offset: int) -> int:
        return bisect.bisect_right(self.line_starts, offset) - 1

    def line_end(self, row: int) -> int:
        """Where line ``row``'s text ends (before its ``\\r\\n`` or ``\\n``)."""
        return self.line_starts[row] + len(self.lines[row].removesuffix("\r"))


@functools.cache
def _grammar(language: str) -> tuple[Any, Any] | None:
    """The parser and the one query of every pattern this grammar has (None: no grammar)."""
    patterns = [f"({k}) @comment" for k in COMMENTS] + [f"({k}) @string" for k in STRINGS]
    patterns += [f"({k}) @block" for k in BLOCKS] + [f"({k}) @name" for k in NAMES]
    patterns += [f"({k} arguments: (_) @arguments)" for k in CALLS] + list(BOUND) + list(LABELS)
    return parser_and_query(language, patterns)  # None: a language the installed pack lacks


def spots(language: str, text: str) -> Spots | None:
    """``text``'s places for holes, or None without a grammar for ``language``."""
    found = _grammar(language)
    if found is None or found[1] is None:
        return None
    import tree_sitter

    parser, query = found
    lines = text.split("\n")
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    out = Spots(text, lines, starts)
    at = _Offsets(lines, starts)
    tree = parser.parse(text.encode("utf-8", "surrogatepass"))
    captures = tree_sitter.QueryCursor(query).captures(tree.root_node)
    hidden = [(at(n.start_point), at(n.end_point)) for n in captures.get("comment", [])]
    hidden += [
        (at(n.start_point), at(n.end_point))
        for n in captures.get("string", [])
        if n.start_point[0] != n.end_point[0]
    ]
    out.code = _code(text, lines, starts, hidden)
    for node in captures.get("block", []):
        if node.parent is not None and node.end_point[0] - node.start_point[0] <= MAX_BLOCK_NODE_LINES:
            body = [c for c in node.named_children if c.type not in COMMENTS]
            if body:  # to its last character that is not blank (Go's statement list holds a newline)
                start, end = at(body[0].start_point), at(body[-1].end_point)
                while end > start and text[end - 1].isspace():
                    end -= 1
                out.blocks.append((start, end))
    for node in captures.get("arguments", []):
        if node.child_count >= 2 and node.children[0].type == "(" and node.children[-1].type == ")":
            out.arguments.append((at(node.children[0].end_point), at(node.children[-1].start_point)))
    out.bound = frozenset(n.text.decode("utf-8", "replace") for n in captures.get("bound", []))
    labels = {n.start_byte for n in captures.get("label", [])}
    for node in captures.get("name", []):
        if node.start_point[0] == node.end_point[0] and node.start_byte not in labels:
            out.names.setdefault(node.start_point[0], []).append((at(node.start_point), at(node.end_point)))
    out.blocks.sort()
    out.arguments.sort()
    for names in out.names.values():
        names.sort()
    return out


def _code(
    text: str, lines: list[str], starts: list[int], hidden: list[tuple[int, int]]
) -> dict[int, tuple[int, int]]:
    """Per line, the span from its first character of code to its last (outside ``hidden`` spans)."""
    by_row: dict[int, list[tuple[int, int]]] = {}
    for a, b in hidden:
        first = bisect.bisect_right(starts, a) - 1
        last = bisect.bisect_right(starts, max(a, b - 1)) - 1
        for row in range(first, last + 1):
            by_row.setdefault(row, []).append((a, b))
    code = {}
    for row, line in enumerate(lines):
        start = starts[row]
        lo = start + len(line) - len(line.lstrip())
        hi = start + len(line.rstrip())
        for a, b in sorted(by_row.get(row, ())):
            if a <= lo < b:  # a comment or string the line starts in
                lo = b
                while lo < hi and text[lo].isspace():
                    lo += 1
        for a, b in sorted(by_row.get(row, ()), reverse=True):
            if a < hi <= b:  # one the line ends in
                hi = a
                while hi > lo and text[hi - 1].isspace():
                    hi -= 1
        if lo < hi:
            code[row] = (lo, hi)
    return code


class _Offsets:
    """Tree-sitter's (row, byte column) points as character offsets into the text."""

    def __init__(self, lines: list[str], starts: list[int]) -> None:
        self.lines, self.starts = lines, starts

    def __call__(self, point: Any) -> int:
        row, column = point
        if row >= len(self.lines):  # the end of a text without a last newline's line
            return self.starts[-1] + len(self.lines[-1])
        line = self.lines[row]
        if not line.isascii():
            column = len(line.encode("utf-8", "surrogatepass")[:column].decode("utf-8", "replace"))
        return self.starts[row] + column
