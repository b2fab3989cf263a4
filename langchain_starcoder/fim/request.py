"""The one fill-in-the-middle request every infill entry point builds: the hole, its context, the end.

It imports only the package's lower layers (errors, types, the end rules, the notebook context), so
every other module can use it. A repository index sits above ``fim``: the request names what it needs
of one (:class:`RepoContext`), which :class:`~langchain_starcoder.RepoIndex` is.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

from ..ends.rules import MODES as END_MODES  # how a middle ends while decoded (middle_end)
from ..errors import InvalidParameterError
from ..notebook.cells import NotebookContext
from ..types import check_text, is_int


@dataclass(frozen=True)
class ContextFile:
    """Another file of the repository, given to the model as context for the hole."""

    path: str
    """Its path in the repository (``""`` to leave it out: ``<file_sep>{code}``)."""
    text: str
    """Its contents."""


FIM_MODES = ("psm", "spm")


@runtime_checkable
class RepoContext(Protocol):
    """What a request needs of a :class:`~langchain_starcoder.RepoIndex`: its root, and the context
    files it picks for a hole within a token budget."""

    @property
    def root(self) -> str | os.PathLike[str]: ...

    def context_files(
        self,
        file_path: str,
        prefix: str,
        suffix: str = "",
        *,
        max_tokens: int,
        count_tokens: Callable[[str], int],
    ) -> list[ContextFile]: ...


@dataclass(frozen=True)
class FIMRequest:
    """One fill-in-the-middle request: the hole, its repository context, the budget and where it ends.

    Every infill entry point (engine, LangChain, LlamaIndex, prompt template) builds one of these;
    the keyword forms are thin constructors of it. Construction validates every part.
    """

    prefix: str
    """The code before the hole."""
    suffix: str = ""
    """The code after the hole."""
    context_files: tuple[ContextFile, ...] = ()
    """Other files of the repository, most relevant first (``ContextFile`` or ``(path, text)``)."""
    repo_name: str | None = None
    """The repository's name (``<repo_name>``)."""
    file_path: str | None = None
    """The path of the file with the hole."""
    mode: str = "psm"
    """"psm" (prefix, suffix, middle) or "spm" (suffix, prefix, middle)."""
    max_prompt_tokens: int | None = None
    """The most tokens the prompt may have (None: the context window minus ``max_tokens``)."""
    trim_suffix_overlap: bool = True
    """Drop an end of the middle that repeats the start of the suffix."""
    end: str = "auto"
    """Where decoding stops once the hole is filled: "auto" (where the code says the middle is complete:
    see :func:`~langchain_starcoder.middle_end`), "line" (the cursor's line), "block" (the cursor's
    block) or "none" (only at the model's end, a stop string or ``max_tokens``). Off under a constraint."""
    min_indent: int = 0
    """A line after the middle's first, indented by fewer spaces or tabs than this, ends the middle
    before it (llama.cpp's ``n_indent``); 0: off."""
    repo: RepoContext | None = field(default=None, compare=False, repr=False)
    """A :class:`~langchain_starcoder.RepoIndex` that picks the context files, within the budget the
    hole's file leaves, when ``context_files`` is empty (given files win). Needs ``file_path``."""
    notebook: NotebookContext | None = field(default=None, repr=False)
    """A :class:`~langchain_starcoder.NotebookContext`: the hole is in one of its code cells (prefix and
    suffix are that cell's live text), laid out in StarCoder2's structured-notebook format."""

    def __post_init__(self) -> None:
        check_text(self.prefix, "prefix")
        check_text(self.suffix, "suffix")
        for name in ("repo_name", "file_path"):
            if getattr(self, name) is not None:
                check_text(getattr(self, name), name)
        if self.mode not in FIM_MODES:
            msg = (
                "mode must be 'psm' (prefix, suffix, middle) or 'spm' (suffix, prefix, middle), "
                f"not {self.mode!r}."
            )
            raise InvalidParameterError(msg)
        budget = self.max_prompt_tokens
        if budget is not None and (not is_int(budget) or budget < 1):
            msg = f"max_prompt_tokens must be a positive integer or None, not {budget!r}."
            raise InvalidParameterError(msg)
        if not isinstance(self.trim_suffix_overlap, bool):
            msg = f"trim_suffix_overlap must be True or False, not {self.trim_suffix_overlap!r}."
            raise InvalidParameterError(msg)
        if self.end not in END_MODES:
            msg = f"end must be one of {', '.join(map(repr, END_MODES))}, not {self.end!r}."
            raise InvalidParameterError(msg)
        if not is_int(self.min_indent) or self.min_indent < 0:
            msg = f"min_indent must be an integer >= 0 (0: off), not {self.min_indent!r}."
            raise InvalidParameterError(msg)
        object.__setattr__(self, "context_files", _context_files(self.context_files))
        if self.repo is not None:
            _check_repo(self.repo, self.file_path)
        if self.notebook is not None and not isinstance(self.notebook, NotebookContext):
            msg = (
                "notebook must be a NotebookContext (langchain_starcoder.NotebookContext.from_notebook(path, "
                f"cell)), not {type(self.notebook).__name__}."
            )
            raise InvalidParameterError(msg)

    @property
    def repo_level(self) -> bool:
        """Whether StarCoder2's repository layout is used (any file, repo name or file path)."""
        return bool(self.context_files or self.repo_name or self.file_path)


#: The names of :class:`FIMRequest`'s fields: what separates FIM keywords from generation ones.
FIM_KEYS = tuple(f.name for f in fields(FIMRequest))


def _check_repo(repo: Any, file_path: str | None) -> None:
    if not isinstance(repo, RepoContext):
        msg = f"repo must be a RepoIndex (langchain_starcoder.RepoIndex(folder)), not {type(repo).__name__}."
        raise InvalidParameterError(msg)
    if not file_path:
        msg = (
            "repo= needs file_path=: the path of the hole's file relative to the repository root "
            f"({repo.root}), so the index can leave that file out and see what it imports."
        )
        raise InvalidParameterError(msg)


def _context_files(files: Any) -> tuple[ContextFile, ...]:
    if isinstance(files, str | bytes | ContextFile) or not isinstance(files, Sequence):
        msg = "context_files must be a list of ContextFile(path, text) (or of (path, text) pairs)."
        raise InvalidParameterError(msg)
    out = []
    for i, item in enumerate(files):
        if isinstance(item, ContextFile):
            path, text = item.path, item.text
        elif isinstance(item, tuple | list) and len(item) == 2:
            path, text = item
        else:
            msg = f"context_files[{i}] is a {type(item).__name__}; give ContextFile(path, text)."
            raise InvalidParameterError(msg)
        out.append(
            ContextFile(check_text(path, f"path of context_files[{i}]"), check_text(text, "context file"))
        )
    return tuple(out)
