"""The end-of-middle measure of issue 31, model-free, on code no one here wrote.

Defined exactly, so that anyone can recompute it (tree-sitter finds the statements and functions):

- Block holes: a statement that starts a line inside a function body (any block of it). The middle runs
  from its first character to the end of the line of the last statement of its enclosing block, without
  the newline; 1 to 15 lines; brace languages keep the block's closing brace in the suffix (a block whose
  brace shares the last statement's line gives no hole). The prefix is all text before, the suffix all
  text after, and the suffix holds a non-blank line.
- Line holes: a statement alone on its line (the line's text, stripped, is the statement), a position
  after its first character with at least 3 non-blank characters after it; the middle is the rest of the
  line.
- Overruns, what a model writes after the true middle: (a) the suffix up to the end of its third non-blank
  line; (b) a newline and the first 3 non-blank lines of another function's body in the same file (from
  the line of its first statement, which must be the least indented of the three), re-indented so that
  the first is at the indentation of the suffix's first non-blank line; (c) for line holes, a newline and
  the file's next line. Block holes get (a) and (b), line holes (a), (b) and (c).
- Exact: the end returned is ``len(middle)`` or ``len(middle) + 1``; premature: less than ``len(middle)``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

#: Per language: function nodes, the nodes whose children are a block's statements, comment nodes.
FUNCTIONS = {
    "python": {"function_definition"},
    "javascript": {
        "function_declaration",
        "function_expression",
        "function",
        "arrow_function",
        "method_definition",
        "generator_function_declaration",
        "generator_function",
    },
    "go": {"function_declaration", "method_declaration", "func_literal"},
    "rust": {"function_item", "closure_expression"},
    "java": {
        "method_declaration",
        "constructor_declaration",
        "lambda_expression",
        "compact_constructor_declaration",
    },
}
FUNCTIONS["typescript"] = FUNCTIONS["tsx"] = FUNCTIONS["javascript"]
CONTAINERS = {
    "python": {"block"},
    "javascript": {"statement_block", "switch_case", "switch_default"},
    "go": {"statement_list"},
    "rust": {"block"},
    "java": {"block", "switch_block_statement_group"},
}
CONTAINERS["typescript"] = CONTAINERS["tsx"] = CONTAINERS["javascript"]
#: Children of a container that are not statements (besides comments).
NOT_STATEMENTS = {"switch_label", "attribute_item", "inner_attribute_item"}
BRACES = {"javascript", "typescript", "tsx", "go", "rust", "java"}
MAX_LINES = 15
_TEST_FOLDERS = frozenset({"test", "tests", "testing", "__tests__", "testdata", "benches", "fixtures"})


@dataclass
class Hole:
    path: str
    kind: str  # "block" or "line"
    prefix: str
    suffix: str
    middle: str
    overruns: dict[str, str] = field(default_factory=dict)


def is_test_path(path: str) -> bool:
    """Tests are excluded from the measure: test folders and test files, in every language's naming."""
    parts = path.lower().split("/")
    if any(p in _TEST_FOLDERS for p in parts[:-1]):
        return True
    name = parts[-1]
    return bool(re.search(r"^test_|_test\.\w+$|\.(test|spec)\.\w+$|^conftest\.py$|^tests?\.\w+$", name))


def _parser(language: str) -> Any:
    import tree_sitter_language_pack as pack

    return pack.get_parser(language)  # type: ignore[arg-type]


def _statements(container: Any) -> list[Any]:
    if container.type == "switch_case":
        return [c for c in container.children_by_field_name("body") if not _is_comment(c)]
    return [c for c in container.named_children if not _is_comment(c) and c.type not in NOT_STATEMENTS]


def _is_comment(node: Any) -> bool:
    return "comment" in node.type


def _walk(node: Any) -> Iterator[Any]:
    cursor = node.walk()
    reached_root = False
    while not reached_root:
        yield cursor.node
        if cursor.goto_first_child():
            continue
        while not cursor.goto_next_sibling():
            if not cursor.goto_parent():
                reached_root = True
                break


def _in_test_module(node: Any) -> bool:
    """Inside Rust's ``mod tests`` or an item marked ``#[test]`` or ``#[cfg(test)]``: tests."""
    while node is not None:
        if node.type == "mod_item":
            name = node.child_by_field_name("name")
            if name is not None and name.text in (b"tests", b"test"):
                return True
        before = node.prev_named_sibling
        while before is not None and before.type == "attribute_item":
            if b"test" in before.text:
                return True
            before = before.prev_named_sibling
        node = node.parent
    return False


class FileText:
    """A file's text with character offsets of its lines and of tree-sitter's byte offsets."""

    def __init__(self, text: str):
        self.text = text
        self.lines = text.split("\n")
        self.starts = [0]
        for line in self.lines[:-1]:
            self.starts.append(self.starts[-1] + len(line) + 1)

    def offset(self, point: tuple[int, int]) -> int:
        """The character offset of a tree-sitter point (row, byte column)."""
        row, column = point
        line = self.lines[row]
        return self.starts[row] + len(line.encode("utf-8")[:column].decode("utf-8", "replace"))

    def line_end(self, row: int) -> int:
        end = self.starts[row] + len(self.lines[row])
        return end - 1 if self.lines[row].endswith("\r") else end


def holes_in_file(path: str, text: str, language: str, rng: random.Random) -> tuple[list[Hole], list[Hole]]:
    """The block and line holes of one file, each with its overruns."""
    source = FileText(text)
    tree = _parser(language).parse(text.encode("utf-8"))
    functions, containers = FUNCTIONS[language], CONTAINERS[language]
    bodies: list[tuple[int, int, list[str]]] = []  # (start, end, first 3 lines) of every function body
    blocks, lines = [], []
    for node in _walk(tree.root_node):
        if node.type in functions:
            lines3 = _body_lines(node, source, language)
            if lines3:
                bodies.append((source.offset(node.start_point), source.offset(node.end_point), lines3))
        if node.type not in containers or _in_test_module(node):
            continue
        if not _inside(node, functions):
            continue
        statements = _statements(node)
        if not statements:
            continue
        last_row = statements[-1].end_point[0]
        closes_on_last_line = (
            language in BRACES and node.end_point[0] == last_row and node.type in ("statement_block", "block")
        )
        if node.type == "statement_list" and node.parent is not None and node.parent.type == "block":
            closes_on_last_line = node.parent.end_point[0] == last_row
        for statement in statements:
            row = statement.start_point[0]
            start = source.offset(statement.start_point)
            if source.text[source.starts[row] : start].strip():
                continue  # the statement does not start its line
            if not closes_on_last_line and 1 <= last_row - row + 1 <= MAX_LINES:
                end = source.line_end(last_row)
                if source.text[end:].strip():
                    blocks.append(Hole(path, "block", text[:start], text[end:], text[start:end]))
            if (
                statement.end_point[0] == row
                and source.lines[row].strip() == statement.text.decode("utf-8", "replace").strip()
            ):
                hole = _line_hole(path, source, row, start, rng)
                if hole is not None:
                    lines.append(hole)
    for hole in blocks + lines:
        _add_overruns(hole, source, bodies, rng)
    return blocks, lines


def _inside(node: Any, functions: set[str]) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.type in functions:
            return True
        parent = parent.parent
    return False


def _body_lines(function: Any, source: FileText, language: str) -> list[str] | None:
    """The first 3 non-blank lines of a function's body, from its first statement's line, when that line
    starts with the statement and is the least indented of the three."""
    body = function.child_by_field_name("body")
    if body is None:
        return None
    container = body
    if language == "go":
        container = next((c for c in body.named_children if c.type == "statement_list"), None)
    if container is None or container.type not in CONTAINERS[language]:
        return None
    statements = _statements(container)
    if not statements:
        return None
    first = statements[0]
    row = first.start_point[0]
    start = source.offset(first.start_point)
    if source.text[source.starts[row] : start].strip():
        return None
    last_row = body.end_point[0] if language in BRACES else body.end_point[0] + 1
    picked = []
    for r in range(row, min(last_row, len(source.lines))):
        line = source.lines[r].rstrip("\r")
        if line.strip():
            picked.append(line)
            if len(picked) == 3:
                break
    if len(picked) < 3:
        return None
    indents = [len(line) - len(line.lstrip()) for line in picked]
    lead = picked[0][: indents[0]]
    if min(indents) < indents[0] or not all(line.startswith(lead) for line in picked):
        return None
    return [line[len(lead) :] for line in picked]


def _line_hole(path: str, source: FileText, row: int, start: int, rng: random.Random) -> Hole | None:
    end = source.line_end(row)
    text = source.text
    positions = [p for p in range(start + 1, end) if sum(not c.isspace() for c in text[p:end]) >= 3]
    if not positions:
        return None
    at = rng.choice(positions)
    if row + 1 >= len(source.lines):
        return None
    hole = Hole(path, "line", text[:at], text[end:], text[at:end])
    hole.overruns["c"] = "\n" + source.lines[row + 1]
    return hole if hole.suffix.strip() else None


def _add_overruns(
    hole: Hole, source: FileText, bodies: list[tuple[int, int, list[str]]], rng: random.Random
) -> None:
    suffix = hole.suffix
    ends, at = [], 0
    for line in suffix.split("\n"):
        at += len(line) + 1
        if line.strip():
            ends.append(at - 1)
            if len(ends) == 3:
                break
    hole.overruns["a"] = suffix[: ends[-1]]
    first = next(line for line in suffix.split("\n")[1:] if line.strip()) if "\n" in suffix else suffix
    indent = first[: len(first) - len(first.lstrip())]
    cursor = len(hole.prefix)
    others = [lines for start, end, lines in bodies if not start <= cursor <= end]
    if others:
        lines = rng.choice(others)
        hole.overruns["b"] = "\n" + "\n".join(indent + line for line in lines)


def make_holes(
    files: list[tuple[str, str]], language: str, *, seed: int = 0, per_kind: int = 400
) -> list[Hole]:
    """Every hole of the repository's source files (tests excluded), then ``per_kind`` of each kind
    drawn with ``seed``."""
    rng = random.Random(seed)
    blocks: list[Hole] = []
    lines: list[Hole] = []
    for path, text in sorted(files):
        if is_test_path(path):
            continue
        b, l_ = holes_in_file(path, text, language, rng)
        blocks += b
        lines += l_
    rng = random.Random(seed)
    rng.shuffle(blocks)
    rng.shuffle(lines)
    return blocks[:per_kind] + lines[:per_kind]


def verdict(kept: int | None, middle: str) -> str:
    """The verdict on an end: "exact", "premature" or "late" (it kept more, or never ended)."""
    if kept is not None and kept in (len(middle), len(middle) + 1):
        return "exact"
    if kept is not None and kept < len(middle):
        return "premature"
    return "late"
