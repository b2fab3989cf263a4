"""The baselines the repository-context measure compares ``RepoIndex`` with, in the same budget and
counted the same way (``count_tokens(path) + count_tokens(text) + 2`` per file): RepoCoder's BM25 windows,
and the hole file's imports, whole ("no context" scores 0 by definition)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_starcoder.fim.request import ContextFile
from langchain_starcoder.repo import FRAME_TOKENS

from .repo_measure import Hole

_JS_ENDINGS = ("", ".ts", ".tsx", ".js", ".jsx", ".mjs", ".cjs", "/index.ts", "/index.js")


def file_cost(file: ContextFile, count_tokens: Callable[[str], int]) -> int:
    return count_tokens(file.path) + count_tokens(file.text) + FRAME_TOKENS


class BM25Windows:
    """RepoCoder's sparse retriever: 20-line windows (stride 10) of every file, BM25 over their words."""

    def __init__(self, root: Path, files: list[str]) -> None:
        import bm25s

        self.windows: list[tuple[str, str]] = []
        for rel in files:
            lines = (root / rel).read_text("utf-8").splitlines()
            for start in range(0, max(len(lines) - 10, 1), 10):
                self.windows.append((rel, "\n".join(lines[start : start + 20])))
        self.retriever = bm25s.BM25()
        corpus = bm25s.tokenize([t for _, t in self.windows], stopwords=None, show_progress=False)
        self.retriever.index(corpus, show_progress=False)

    def context(self, hole: Hole, max_tokens: int, count_tokens: Callable[[str], int]) -> list[Any]:
        import bm25s

        query = "\n".join(hole.prefix.splitlines()[-20:])
        tokens = bm25s.tokenize([query], stopwords=None, show_progress=False)
        if not tokens.vocab:
            return []
        k = min(200, len(self.windows))
        docs, _ = self.retriever.retrieve(tokens, k=k, show_progress=False)
        out, spent = [], 0
        for i in docs[0]:
            path, text = self.windows[int(i)]
            if path == hole.path:
                continue
            file = ContextFile(path, text)
            cost = file_cost(file, count_tokens)
            if spent + cost <= max_tokens:
                out.append(file)
                spent += cost
        return out


class ImportsWhole:
    """The files the hole's file imports (read from its prefix and suffix with tree-sitter, resolved to
    the repository's files here), whole, in path order while they fit."""

    def __init__(self, root: Path, files: list[str]) -> None:
        self.root = root
        self.files = set(files)
        self.modules: dict[str, str] = {}
        for rel in sorted(files, key=len, reverse=True):  # the shortest path wins a tie
            if rel.endswith((".py", ".pyi")):
                self.modules[rel.rsplit(".", 1)[0].replace("/", ".").removesuffix(".__init__")] = rel

    def imported(self, hole: Hole) -> list[str]:
        from langchain_starcoder.repo.symbols import parse

        found = set()
        for spec, _, _ in parse(hole.path, hole.prefix + hole.suffix, imports_only=True).imports:
            path = (
                self._python(hole.path, spec)
                if hole.path.endswith(".py")
                else self._relative(hole.path, spec)
            )
            if path is not None and path != hole.path:
                found.add(path)
        return sorted(found)

    def context(self, hole: Hole, max_tokens: int, count_tokens: Callable[[str], int]) -> list[Any]:
        out, spent = [], 0
        for path in self.imported(hole):
            file = ContextFile(path, (self.root / path).read_text("utf-8"))
            n = file_cost(file, count_tokens)
            if spent + n <= max_tokens:
                out.append(file)
                spent += n
        return out

    def _python(self, rel: str, spec: str) -> str | None:
        if spec.startswith("."):
            dots = len(spec) - len(spec.lstrip("."))
            package = rel.split("/")[:-1]
            package = package[: len(package) - (dots - 1)] if dots > 1 else package
            rest = spec[dots:]
            return self.modules.get(".".join([*package, rest] if rest else package))
        parts = spec.split(".")
        for k in range(len(parts)):  # the repository is the package's folder or one above it
            found = self.modules.get(".".join(parts[k:]))
            if found is not None:
                return found
        return None

    def _relative(self, rel: str, spec: str) -> str | None:
        if not spec.startswith("."):
            return None
        base = os.path.normpath(os.path.join(os.path.dirname(rel), spec)).replace(os.sep, "/")
        return next((base + e for e in _JS_ENDINGS if base + e in self.files), None)
