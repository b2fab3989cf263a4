"""What the end-of-middle rules need to know of a language: how it writes strings and comments, how
its blocks end, which words continue a statement; and a guess of the language from a file's text."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Words that continue a compound statement on a line of its own (``else:`` after an ``if`` body).
_PY_CONTINUE = ("else", "elif", "except", "finally")
_C_CONTINUE = ("else", "catch", "finally")
#: Closing words of keyword-block languages: the line holds the end of the statement it closes.
_RUBY_CONTINUE = ("else", "elsif", "rescue", "ensure", "when", "in", "end")
_LUA_CONTINUE = ("else", "elseif", "end", "until")
_SH_CONTINUE = ("else", "elif", "fi", "done", "esac", "then", "do")


@dataclass(frozen=True, slots=True)
class Syntax:
    """A language's lexical and block rules (see ``scan.py`` for how each field is used)."""

    name: str
    indent_blocks: bool = False
    """Blocks are made by indentation alone (Python): no closing line ends them."""
    line_comments: tuple[str, ...] = ("//",)
    block_comment: tuple[str, str] | None = ("/*", "*/")
    nested_comments: bool = False
    quotes: str = "\"'"
    """Quote characters that open an escaped string on one line."""
    multiline_quotes: bool = False
    """``"..."`` may span lines (Rust, Ruby, PHP, shell)."""
    triple_quotes: tuple[str, ...] = ()
    backtick: str = ""
    """"template" (JavaScript: escapes and ``${}``), "raw" (Go: no escapes) or "" (not a string)."""
    char_or_lifetime: bool = False
    """A ``'`` that does not start a one-character literal is not a string (Rust lifetimes, Scala)."""
    regex_literals: bool = False
    raw_strings: str = ""
    """"rust" (``r#"..."#``), "cpp" (``R"d(...)d"``), "csharp" (``@"..."``), "lua" (``[[...]]``)."""
    needs_semicolon: bool = False
    """A statement is complete only at ``;`` or ``}`` (Java, C, C#): a line without either continues."""
    preprocessor: bool = False
    """Lines starting with ``#`` are directives, at any indentation (C, C++, C#)."""
    continue_words: tuple[str, ...] = _C_CONTINUE


PYTHON = Syntax(
    "python",
    indent_blocks=True,
    line_comments=("#",),
    block_comment=None,
    triple_quotes=('"""', "'''"),
    continue_words=_PY_CONTINUE,
)
JAVASCRIPT = Syntax("javascript", backtick="template", regex_literals=True)
TYPESCRIPT = Syntax("typescript", backtick="template", regex_literals=True)
GO = Syntax("go", backtick="raw", continue_words=("else",))
RUST = Syntax(
    "rust",
    nested_comments=True,
    quotes='"',
    multiline_quotes=True,
    char_or_lifetime=True,
    raw_strings="rust",
    needs_semicolon=True,
    continue_words=("else",),
)
JAVA = Syntax("java", triple_quotes=('"""',), needs_semicolon=True)
C = Syntax("c", needs_semicolon=True, preprocessor=True)
CPP = Syntax("cpp", raw_strings="cpp", needs_semicolon=True, preprocessor=True)
CSHARP = Syntax(
    "csharp", triple_quotes=('"""',), raw_strings="csharp", needs_semicolon=True, preprocessor=True
)
KOTLIN = Syntax("kotlin", nested_comments=True, triple_quotes=('"""',))
SWIFT = Syntax("swift", nested_comments=True, quotes='"', triple_quotes=('"""',))
SCALA = Syntax("scala", nested_comments=True, triple_quotes=('"""',), char_or_lifetime=True)
PHP = Syntax("php", line_comments=("//", "#"), multiline_quotes=True, needs_semicolon=True)
RUBY = Syntax(
    "ruby", line_comments=("#",), block_comment=None, multiline_quotes=True, continue_words=_RUBY_CONTINUE
)
LUA = Syntax(
    "lua",
    line_comments=("--",),
    block_comment=("--[[", "]]"),
    raw_strings="lua",
    continue_words=_LUA_CONTINUE,
)
BASH = Syntax(
    "bash", line_comments=("#",), block_comment=None, multiline_quotes=True, continue_words=_SH_CONTINUE
)

SYNTAXES = {
    s.name: s
    for s in (
        PYTHON,
        JAVASCRIPT,
        TYPESCRIPT,
        GO,
        RUST,
        JAVA,
        C,
        CPP,
        CSHARP,
        KOTLIN,
        SWIFT,
        SCALA,
        PHP,
        RUBY,
        LUA,
        BASH,
    )
}
SYNTAXES["tsx"] = TYPESCRIPT

#: File endings -> language names, the one table (``repo.symbols.LANGUAGES`` is built from it; a
#: notebook's cells are read as Python).
EXTENSIONS = {
    ".py": "python",
    ".pyi": "python",
    ".ipynb": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".kt": "kotlin",
    ".kts": "kotlin",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".hpp": "cpp",
    ".hh": "cpp",
    ".cs": "csharp",
    ".rb": "ruby",
    ".php": "php",
    ".swift": "swift",
    ".scala": "scala",
    ".lua": "lua",
    ".sh": "bash",
    ".bash": "bash",
}

# Each language's telltale lines; the guess is the language with the most matches in a sample. A line's
# leading blanks are ``[^\S\n]*``: ``\s*`` would run on over the blank lines after each line start and
# back again (quadratic in a run of blank lines: 4.7 s for 8,000 newlines), for the same count.
_TELLTALES = {
    "python": r"^[^\S\n]*(?:def|class)\s+\w+.*:\s*$|^[^\S\n]*(?:import \w|from [\w.]+ import )"
    r"|^[^\S\n]*(?:elif|except)\b|\bself\.|^[^\S\n]*@\w+",
    "javascript": r"\b(?:const|let|var)\s+\w+\s*=|=>|\bfunction\s*\w*\s*\(|\brequire\(|===|\bconsole\.",
    "typescript": r"\binterface\s+\w+\s*\{|:\s*(?:string|number|boolean)\b|\bexport type\b|\bimplements\b",
    "go": r"^func\s|:=|^package\s+\w+\s*$|\bfmt\.|\berr != nil\b",
    "rust": r"\bfn\s+\w+|\blet\s+mut\b|\bimpl\b|->\s*\w|\bpub\s+(?:fn|struct|enum)\b|::\w+|\bmatch\b.*\{",
    "java": r"\bpublic\s+(?:static\s+)?(?:final\s+)?(?:class|void|int|String)\b|\bprivate\s+\w+"
    r"|\bnew\s+\w+\(",
    "c": r"^#include\s*<|\bprintf\(|\bmalloc\(|->\w+|\bstruct\s+\w+\s*\*",
    "ruby": r"^[^\S\n]*def\s+\w+[^:]*$|^[^\S\n]*end\s*$|\bdo\s*\|",
    "bash": r"^#!/bin/(?:ba)?sh|^[^\S\n]*fi\s*$|\$\{\w+\}|^[^\S\n]*esac\b",
}
_TELLTALE_RES = {name: re.compile(pattern, re.M) for name, pattern in _TELLTALES.items()}


def language_of_path(path: str | None) -> str | None:
    """The language of a file name's ending, if the rules know it."""
    if not path:
        return None
    dot = path.rfind(".")
    return EXTENSIONS.get(path[dot:].lower()) if dot >= 0 and "/" not in path[dot:] else None


def guess_language(text: str) -> str:
    """The likeliest language of a piece of code (``python`` when nothing tells)."""
    sample = text if len(text) <= 8000 else text[:4000] + "\n" + text[-4000:]
    scores = {name: len(pattern.findall(sample)) for name, pattern in _TELLTALE_RES.items()}
    best = max(scores, key=lambda name: scores[name])
    if scores[best] == 0:
        return "python"
    if best == "javascript" and scores["typescript"] >= 2:
        return "typescript"
    return best


def syntax_for(file_path: str | None, text: str, language: str | None = None) -> Syntax:
    """The rules of ``file_path``'s language, else of ``language`` (a name of :data:`SYNTAXES`, such as a
    notebook kernel's), else of the language ``text`` looks like."""
    known = language.lower() if language and language.lower() in SYNTAXES else None
    name = language_of_path(file_path) or known or guess_language(text)
    return SYNTAXES[name]
