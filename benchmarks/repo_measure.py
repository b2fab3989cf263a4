"""The repository-context measure (issue 21), as the issue defines it, so that anyone can recompute it.

- Holes: in a repository's Python files (tests excluded), a line that is not blank and does not start a
  comment or a string (nor lies inside a multi-line string); the middle is the line without its
  indentation, the prefix everything before it plus the indentation, the suffix everything after it.
  Candidates are shuffled with a fixed seed and the first ``HOLES`` with cross-file identifiers are kept.
- Cross-file identifiers: identifiers of the middle longer than 2 characters, not a keyword or builtin,
  not self/cls, that occur as a whole word nowhere in the prefix or suffix and are defined (def, class or
  module-level assignment, read with ``ast``) in another file of the repository.
- Recall: the fraction of them that occur as whole words in the returned context texts; mean over holes.
- For a JavaScript repository the same rules with ``//``/``/*`` comments, JavaScript keywords and
  globals, and definitions (functions, classes, methods, top-level bindings) from tree-sitter.
- Prefix stability: how much of a lookup's context a lookup after a small cursor move keeps as its
  prompt's start (what a prompt cache reuses).

Token counts come from a given tokenizer (a ``tokenizer.json`` or a checkpoint folder; the real
StarCoder2 one gives real counts) or else from a byte-level BPE of StarCoder2's vocabulary size (49,152)
and special tokens trained on the Python standard library's sources, cached in the working folder.
"""

from __future__ import annotations

import ast
import builtins
import io
import keyword
import random
import re
import statistics
import sysconfig
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOLES = 200
BUDGETS = (1024, 2048)
SEED = 0
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PY_SKIP = (
    frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | frozenset(dir(builtins)) | {"self", "cls"}
)
_JS_SKIP = frozenset(
    [
        "break",
        "case",
        "catch",
        "class",
        "const",
        "continue",
        "debugger",
        "default",
        "delete",
        "do",
        "else",
        "export",
        "extends",
        "finally",
        "for",
        "function",
        "if",
        "import",
        "in",
        "instanceof",
        "new",
        "return",
        "super",
        "switch",
        "this",
        "throw",
        "try",
        "typeof",
        "var",
        "void",
        "while",
        "with",
        "yield",
        "let",
        "static",
        "enum",
        "await",
        "async",
        "implements",
        "package",
        "protected",
        "interface",
        "private",
        "public",
        "null",
        "true",
        "false",
        "undefined",
        "NaN",
        "Infinity",
        "Object",
        "Array",
        "String",
        "Number",
        "Boolean",
        "Symbol",
        "Map",
        "Set",
        "WeakMap",
        "WeakSet",
        "Promise",
        "Error",
        "TypeError",
        "RangeError",
        "JSON",
        "Math",
        "Date",
        "RegExp",
        "console",
        "window",
        "document",
        "globalThis",
        "process",
        "require",
        "module",
        "exports",
        "arguments",
        "Buffer",
        "setTimeout",
        "clearTimeout",
        "setInterval",
        "clearInterval",
        "parseInt",
        "parseFloat",
        "isNaN",
        "encodeURIComponent",
        "decodeURIComponent",
        "Reflect",
        "Proxy",
        "BigInt",
    ]
)


@dataclass(frozen=True)
class Hole:
    path: str
    prefix: str
    suffix: str
    targets: frozenset[str]


# --- tokenizer -------------------------------------------------------------------------------------


def token_counter(workdir: Path, tokenizer: Path | None, log: Callable[[str], None]) -> tuple[Callable, str]:
    """``count_tokens`` from the given tokenizer, else from a StarCoder2-sized BPE trained (once) here."""
    from tokenizers import Tokenizer

    if tokenizer is not None:
        path = tokenizer / "tokenizer.json" if tokenizer.is_dir() else tokenizer
        described = f"the tokenizer at {path}"
    else:
        path = workdir / "repo-context" / "stdlib-bpe-49152" / "tokenizer.json"
        described = "a byte-level BPE (49,152 tokens, StarCoder2's special tokens) trained on Python's stdlib"
        if not path.is_file():
            log("training a 49,152-token BPE on the standard library's sources (once, a few minutes) ...")
            _train_tokenizer(path)
    tok = Tokenizer.from_file(str(path))

    def count_tokens(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    return count_tokens, described


def _train_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from langchain_starcoder.testing import SPECIAL_TOKENS

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts
    )

    def texts() -> Any:
        size = 0
        for p in files:
            try:
                text = p.read_text("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            size += len(text)
            yield text
            if size > 40_000_000:
                return

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=49152,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts(), trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))


def _is_test(rel: str) -> bool:
    parts = rel.split("/")
    name = parts[-1]
    return (
        any(p in ("tests", "test", "testing") for p in parts[:-1])
        or name.startswith("test_")
        or name.endswith(("_test.py", ".test.js", ".spec.js"))
        or name == "conftest.py"
    )


def python_definitions(text: str) -> set[str]:
    """def and class names (any depth) and module-level assignment targets."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return set()
    names = {
        n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        for target in targets:
            for n in ast.walk(target):
                if isinstance(n, ast.Name):
                    names.add(n.id)
    return names


def js_definitions(rel: str, text: str) -> set[str]:
    from langchain_starcoder.repo.symbols import parse

    return {d.name for d in parse(rel, text).definitions if d.kind != "field"}


def python_hole_lines(text: str) -> list[int]:
    """0-based lines that are not blank and start no comment or string, nor lie inside a string."""
    first: dict[int, int] = {}
    inside: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (
                tokenize.NL,
                tokenize.NEWLINE,
                tokenize.INDENT,
                tokenize.DEDENT,
                tokenize.ENDMARKER,
            ):
                continue
            first.setdefault(tok.start[0], tok.type)
            if tok.type == tokenize.STRING:
                inside.update(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        return []
    return [
        row - 1
        for row, kind in sorted(first.items())
        if kind not in (tokenize.COMMENT, tokenize.STRING) and row not in inside
    ]


def js_hole_lines(text: str) -> list[int]:
    out, in_comment = [], False
    for i, line in enumerate(text.splitlines()):
        s = line.strip()
        if in_comment:
            in_comment = "*/" not in s
            continue
        if s.startswith("/*"):
            in_comment = "*/" not in s
            continue
        if s and not s.startswith(("//", "*", "'", '"', "`")):
            out.append(i)
    return out


def make_holes(root: Path, files: list[str], language: str) -> list[Hole]:
    texts = {rel: (root / rel).read_text("utf-8") for rel in files}
    defs = {
        rel: (python_definitions(t) if language == "python" else js_definitions(rel, t))
        for rel, t in texts.items()
    }
    defined_in: dict[str, set[str]] = {}
    for rel, names in defs.items():
        for name in names:
            defined_in.setdefault(name, set()).add(rel)
    skip = _PY_SKIP if language == "python" else _JS_SKIP
    lines_of = python_hole_lines if language == "python" else js_hole_lines
    candidates = [(rel, i) for rel in sorted(texts) if not _is_test(rel) for i in lines_of(texts[rel])]
    random.Random(SEED).shuffle(candidates)
    holes: list[Hole] = []
    for rel, i in candidates:
        lines = texts[rel].splitlines(keepends=True)
        line = lines[i].rstrip("\r\n")
        middle = line.lstrip()
        prefix = "".join(lines[:i]) + line[: len(line) - len(middle)]
        suffix = lines[i][len(line) :] + "".join(lines[i + 1 :])
        around = set(WORD.findall(prefix)) | set(WORD.findall(suffix))
        targets = frozenset(
            w
            for w in WORD.findall(middle)
            if len(w) > 2 and w not in skip and w not in around and defined_in.get(w, set()) - {rel}
        )
        if targets:
            holes.append(Hole(rel, prefix, suffix, targets))
            if len(holes) == HOLES:
                break
    return holes


def recall(hole: Hole, files: list[Any]) -> float:
    words = set()
    for f in files:
        words.update(WORD.findall(f.text))
    return len(hole.targets & words) / len(hole.targets)


# --- prefix stability ------------------------------------------------------------------------------


def prefix_stability(index: Any, holes: list[Hole], count_tokens: Callable[[str], int]) -> dict[str, float]:
    """How much of the context (at 1,024 tokens) a small cursor move keeps as the prompt's start: "typing"
    when the middle is typed in (the prefix grows by its first half), "next line" when the hole moves one
    line down inside the same block. Per move, the mean share of the first context's layout kept, and
    (``... whole``) the share of lookups that keep all of it (what a prompt cache reuses in full)."""
    shares: dict[str, list[float]] = {"typing": [], "next line": []}
    for hole in holes[:60]:
        lines = (index.root / hole.path).read_text("utf-8").splitlines(keepends=True)
        i = hole.prefix.count("\n")
        middle = lines[i][len(hole.prefix) - sum(map(len, lines[:i])) :].rstrip("\r\n")
        moves = {"typing": (hole.prefix + middle[: len(middle) // 2], hole.suffix)}
        if i + 1 < len(lines) and lines[i + 1].strip() and lines[i + 1].startswith((" ", "\t")):
            nxt = lines[i + 1]
            indent = nxt[: len(nxt) - len(nxt.lstrip())]
            moves["next line"] = (
                "".join(lines[: i + 1]) + indent,
                nxt[len(indent) :] + "".join(lines[i + 2 :]),
            )
        a = layout(
            index.context_files(
                hole.path, hole.prefix, hole.suffix, max_tokens=1024, count_tokens=count_tokens
            )
        )
        for kind, (prefix, suffix) in moves.items():
            b = layout(
                index.context_files(hole.path, prefix, suffix, max_tokens=1024, count_tokens=count_tokens)
            )
            if a:
                same = 0
                while same < min(len(a), len(b)) and a[same] == b[same]:
                    same += 1
                shares[kind].append(same / len(a))
    out = {k: statistics.fmean(v) if v else float("nan") for k, v in shares.items()}
    out.update(
        {
            f"{k} whole": statistics.fmean(x == 1.0 for x in v) if v else float("nan")
            for k, v in shares.items()
        }
    )
    return out


def layout(files: list[Any]) -> str:
    """The context as StarCoder2's repository layout writes it."""
    return "".join(f"<file_sep>{f.path}\n{f.text}" for f in files)
