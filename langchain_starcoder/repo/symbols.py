"""What a source file defines and imports, from tree-sitter (``tree-sitter-language-pack``'s compiled
grammars): definitions with their signature lines, module-level assignments, imports, identifiers.

One generic table of definition node types covers the languages: a pattern a grammar lacks is left out,
so each language gets the patterns its grammar has.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..ends.languages import EXTENSIONS

#: File endings -> tree-sitter-language-pack names: where-the-middle-ends' table, less the endings the
#: index does not parse (a notebook's cells come to it through ``notebook``, not as a file).
LANGUAGES = {
    ending: name
    for ending, name in EXTENSIONS.items()
    if ending not in (".ipynb", ".kts", ".cxx", ".hh", ".bash")
}

#: Definition nodes that name themselves with a ``name`` field, across grammars.
_NAMED = (
    "function_definition",
    "function_declaration",
    "generator_function_declaration",
    "method_definition",
    "method_declaration",
    "class_definition",
    "class_declaration",
    "abstract_class_declaration",
    "interface_declaration",
    "type_alias_declaration",
    "enum_declaration",
    "struct_item",
    "enum_item",
    "trait_item",
    "function_item",
    "mod_item",
    "const_item",
    "static_item",
    "type_item",
    "type_spec",
    "constructor_declaration",
    "struct_specifier",
    "class_specifier",
    "method",
    "class",
    "module",
    "object_declaration",
    "protocol_declaration",
    "record_declaration",
)
_CLASSES = frozenset(
    {
        "class_definition",
        "class_declaration",
        "abstract_class_declaration",
        "interface_declaration",
        "struct_item",
        "enum_item",
        "trait_item",
        "class_specifier",
        "struct_specifier",
        "class",
        "enum_declaration",
        "object_declaration",
        "protocol_declaration",
        "record_declaration",
        "type_spec",
    }
)
#: Module-level (and class-level, for fields) assignments, per grammar where the shape differs.
_ASSIGNMENTS = (
    # Python grammars with and without the expression_statement wrapper.
    "(module (expression_statement (assignment left: (identifier) @name) @def))",
    "(module (assignment left: (identifier) @name) @def)",
    "(module (expression_statement (assignment left: (pattern_list (identifier) @name)) @def))",
    "(module (assignment left: (pattern_list (identifier) @name)) @def)",
    "(class_definition body: (block (expression_statement (assignment left: (identifier) @name) @field)))",
    "(class_definition body: (block (assignment left: (identifier) @name) @field))",
    "(program (lexical_declaration (variable_declarator name: (identifier) @name)) @def)",
    "(program (variable_declaration (variable_declarator name: (identifier) @name)) @def)",
    "(program (export_statement declaration: (lexical_declaration (variable_declarator"
    " name: (identifier) @name)) @def))",
    "(source_file (const_declaration (const_spec name: (identifier) @name)) @def)",
    "(source_file (var_declaration (var_spec name: (identifier) @name)) @def)",
    "(translation_unit (declaration declarator: (init_declarator declarator: (identifier) @name)) @def)",
    "(function_definition declarator: (function_declarator declarator: (identifier) @name) @def)",
    "(public_field_definition name: (property_identifier) @name @field)",
    "(field_definition property: (property_identifier) @name @field)",
)
_IMPORTS = (
    "(import_statement name: (_)) @import",  # Python's; JavaScript's has a source instead
    "(import_from_statement) @import",
    "(import_statement source: (string) @import)",
    "(export_statement source: (string) @import)",
    "(call_expression function: (identifier) @_f arguments: (arguments (string) @import)"
    ' (#eq? @_f "require"))',
)
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STRING = re.compile(r"""^['"`]|['"`]$""")


_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")


@functools.lru_cache(maxsize=65536)
def name_parts(name: str) -> tuple[str, ...]:
    """The lower-case words of a snake_case or CamelCase name, plural ``s`` dropped, short ones left out."""
    return tuple(dict.fromkeys(p.lower().removesuffix("s") for p in _PART.findall(name) if len(p) > 2))


def tail_lines(text: str, n: int) -> str:
    """The last ``n`` lines of ``text`` (without splitting all of it)."""
    at = len(text)
    for _ in range(n):
        at = text.rfind("\n", 0, at)
        if at < 0:
            return text
    return text[at + 1 :]


def head_lines(text: str, n: int) -> str:
    """The first ``n`` lines of ``text``."""
    at = -1
    for _ in range(n):
        at = text.find("\n", at + 1)
        if at < 0:
            return text
    return text[:at]


@dataclass(frozen=True, slots=True)
class Definition:
    name: str
    kind: str
    """"class", "function", "assignment" (module level) or "field" (class level)."""
    start: int
    """Its first line (0-based)."""
    header_end: int
    """The last line of its signature (inclusive)."""
    end: int
    """Its last line (inclusive)."""
    parent: str | None
    """The class it is defined in, if any."""


@dataclass(frozen=True)
class Symbols:
    definitions: tuple[Definition, ...]
    imports: tuple[tuple[str, int, int], ...]
    """Imported module specs as written (``pkg.mod``, ``.mod`` in Python, ``./mod`` in JavaScript), each
    with the first and last line of its statement."""


def language_of(path: str) -> str | None:
    dot = path.rfind(".")
    return LANGUAGES.get(path[dot:].lower()) if dot >= 0 else None


def parser_and_query(language: str, patterns: Sequence[str]) -> tuple[Any, Any] | None:
    """The tree-sitter parser of ``language`` and one query of those ``patterns`` its grammar has (None
    if it has none of them); None if the installed language pack has no such grammar."""
    try:
        import tree_sitter
        import tree_sitter_language_pack as pack

        grammar = pack.get_language(language)  # type: ignore[arg-type]
        parser = pack.get_parser(language)  # type: ignore[arg-type]
    except Exception:  # a grammar the installed pack lacks
        return None
    kept = []
    for pattern in patterns:
        try:
            tree_sitter.Query(grammar, pattern)
        except Exception:  # this grammar has no such node or field
            continue
        kept.append(pattern)
    return parser, tree_sitter.Query(grammar, "\n".join(kept)) if kept else None


@functools.cache
def _parser_and_query(language: str, imports_only: bool = False) -> tuple[Any, Any] | None:
    """``language``'s parser and query of definitions and imports, or of imports only."""
    patterns = [] if imports_only else [f"({node} name: (_) @name) @def" for node in _NAMED]
    patterns += [*([] if imports_only else _ASSIGNMENTS), *_IMPORTS]
    return parser_and_query(language, patterns)


def parse(path: str, text: str, *, imports_only: bool = False) -> Symbols:
    """The definitions and imports of a file (none for a language without a grammar)."""
    language = language_of(path)
    found = _parser_and_query(language, imports_only) if language else None
    if not found or found[1] is None:  # no grammar, or none of the patterns: indexed as plain lines
        return Symbols((), ())
    import tree_sitter

    parser, query = found
    source = text.encode("utf-8")
    tree = parser.parse(source)
    definitions: list[Definition] = []
    imports: list[tuple[str, int, int]] = []
    python = language == "python"
    for _, captures in tree_sitter.QueryCursor(query).matches(tree.root_node):
        if "import" in captures:
            node = captures["import"][0]
            for spec in _import_specs(node.text.decode("utf-8", "replace"), python):
                imports.append((spec, node.start_point[0], node.end_point[0]))
            continue
        names = captures.get("name")
        nodes = captures.get("def") or captures.get("field")
        if not names or not nodes:
            continue
        node = nodes[0]
        kind = "field" if "field" in captures else _kind(node.type)
        name = names[0].text.decode("utf-8", "replace")
        start, end = node.start_point[0], node.end_point[0]
        definitions.append(Definition(name, kind, start, _header_end(node, python), end, _parent(node)))
    definitions.sort(key=lambda d: (d.start, d.name))
    return Symbols(tuple(definitions), tuple(imports))


def _kind(node_type: str) -> str:
    if node_type in _CLASSES:
        return "class"
    if node_type in (
        "expression_statement",
        "assignment",
        "lexical_declaration",
        "variable_declaration",
        "const_declaration",
        "var_declaration",
        "declaration",
        "const_item",
        "static_item",
    ):
        return "assignment"
    return "function"


def _header_end(node: Any, python: bool) -> int:
    """The signature's last line: the line before a Python body, the line a braced body opens on."""
    start = node.start_point[0]
    body = node.child_by_field_name("body")
    if body is None:
        return start
    row = body.start_point[0] - (1 if python else 0)
    return min(max(start, row), start + 4)


def _parent(node: Any) -> str | None:
    parent = node.parent
    while parent is not None:
        if parent.type in _CLASSES:
            name = parent.child_by_field_name("name")
            return name.text.decode("utf-8", "replace") if name is not None else None
        parent = parent.parent
    return None


def _import_specs(text: str, python: bool) -> list[str]:
    if not python:
        return [_STRING.sub("", text)]
    text = " ".join(text.replace("\\\n", " ").replace("(", " ").replace(")", " ").split())
    if text.startswith("from "):
        module, _, names = text[5:].partition(" import ")
        module = module.strip()
        specs = [module]
        for name in names.split(","):  # `from pkg import mod` may import a module
            word = name.strip().split(" as ")[0].strip()
            if word and word != "*":
                specs.append(module + word if module.endswith(".") else f"{module}.{word}")
        return specs
    return [part.strip().split(" as ")[0].strip() for part in text[7:].split(",") if part.strip()]
