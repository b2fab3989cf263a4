"""Fill-in-the-middle requests: their prompts within a model's budget, with repository context.

With a :class:`~langchain_starcoder.RepoIndex`, the hole's part of the prompt is measured first and
the index picks context files in the budget it leaves. Each helper takes what it needs (the
tokenizer, the context window), never the engine: the front calls these, and nothing here calls back.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._tokens import Codec, codec_for
from ..errors import ContextLengthError, InvalidParameterError
from ..fim import budget
from ..fim import build as fim
from ..fim.request import FIM_KEYS, ContextFile, FIMRequest
from ..repo.rank import GAP_MARKER


def fim_prompt(tokenizer: Any, context_window: int, request: FIMRequest, max_tokens: int) -> fim.FIMPrompt:
    """:meth:`StarCoderEngine.fim_prompt <langchain_starcoder.StarCoderEngine.fim_prompt>` for a model
    of this tokenizer and context window."""
    budget.check_room(max_tokens, context_window)
    if request.repo is None:
        return build_fim(tokenizer, context_window, request, max_tokens)
    index = request.repo
    request = dataclasses.replace(request, file_path=repo_relative_path(index, request.file_path), repo=None)
    if request.context_files:  # the caller's own files win
        return build_fim(tokenizer, context_window, request, max_tokens)
    repo_files = functools.partial(pick_files, tokenizer, index, request)  # in the tokens the hole leaves
    return build_fim(tokenizer, context_window, request, max_tokens, repo_files)


def add_repo_context(tokenizer: Any, context_window: int, request: FIMRequest, max_tokens: int) -> FIMRequest:
    """:meth:`StarCoderEngine.add_repo_context <langchain_starcoder.StarCoderEngine.add_repo_context>`:
    ``request`` with a repository-relative ``file_path`` and, after its own context files, those its
    index picks in the budget the hole and they leave (less what its own files hold already)."""
    budget.check_room(max_tokens, context_window)
    index = request.repo
    if index is None:
        return request
    request = dataclasses.replace(request, file_path=repo_relative_path(index, request.file_path), repo=None)
    hole = build_fim(tokenizer, context_window, request, max_tokens)
    assert hole.max_prompt_tokens is not None  # build_fim always gives the prompt a budget
    left = hole.max_prompt_tokens - len(hole.token_ids)
    if left <= 0:
        return request
    files = pick_files(tokenizer, index, request, left)
    return dataclasses.replace(request, context_files=request.context_files + uncovered(files, request))


def pick_files(tokenizer: Any, index: Any, request: FIMRequest, left: int) -> list[ContextFile]:
    """The index's context for the hole of ``request`` in ``left`` tokens, counted as FIM data."""
    prefix, suffix = request.prefix, request.suffix
    if request.notebook is not None:  # the modules imported in any cell, not only the hole's
        prefix, suffix = request.notebook.code_around(prefix, suffix)
    return index.context_files(  # the index locks itself
        request.file_path,
        prefix,
        suffix,
        max_tokens=left,
        count_tokens=data_tokens(codec_for(tokenizer)),
    )


@functools.lru_cache(maxsize=16)
def data_tokens(codec: Codec) -> Callable[[str], int]:
    """One token counter per tokenizer (as FIM parts: data), so the index keeps its counts between
    lookups."""
    return lambda text: len(codec.encode_data(text))


def uncovered(files: Sequence[ContextFile], request: FIMRequest) -> tuple[ContextFile, ...]:
    """``files`` less those whose every line a context file of ``request`` for the same path holds
    already (a client's chunk of a file need not come again as repository context)."""
    given: dict[str, set[str]] = {}
    for chunk in request.context_files:
        given.setdefault(_normal(chunk.path), set()).update(chunk.text.splitlines())
    kept = []
    for file in files:
        lines = given.get(_normal(file.path))
        if lines is None or not all(line in lines for line in file.text.splitlines() if line != GAP_MARKER):
            kept.append(file)
    return tuple(kept)


def _normal(path: str) -> str:
    return os.path.normpath(path).replace(os.sep, "/").removeprefix("./") if path else ""


def build_fim(
    tokenizer: Any,
    context_window: int,
    request: FIMRequest,
    max_tokens: int,
    more_files: Callable[[int], Sequence[ContextFile]] | None = None,
) -> fim.FIMPrompt:
    """The prompt of ``request`` (its context files as given, then those ``more_files(tokens left)``
    picks) within the budget (:func:`~langchain_starcoder.fim.budget.prompt_budget`) of a model with
    this context window that then writes up to ``max_tokens``."""
    derived = request.max_prompt_tokens is None
    limit = budget.prompt_budget(context_window, max_tokens, request.max_prompt_tokens)
    request = dataclasses.replace(request, max_prompt_tokens=limit)
    try:
        if more_files is None:
            prompt = fim.build_fim_prompt(tokenizer, request)
        else:
            prompt = fim.build_fim_prompt_adding(tokenizer, request, more_files)
    except ContextLengthError:
        if not derived:
            raise
        prompt = None  # said below in the caller's terms (max_tokens, not a derived budget)
    if derived and (prompt is None or (request.prefix and not prompt.prefix_chars_kept)):
        raise budget.too_small(context_window, max_tokens)
    assert prompt is not None
    return prompt


def repo_relative_path(index: Any, file_path: str | None) -> str:
    """The hole's path relative to the index's root (``/``-separated); an absolute path must lie
    inside the root, and a relative one may not climb out of it."""
    root = Path(index.root)
    path = Path(file_path or "")
    if path.is_absolute():
        try:
            path = path.resolve().relative_to(root.resolve())
        except ValueError:
            msg = (
                f"file_path {file_path!r} is outside the repository {str(root)!r}: give the hole's "
                "path relative to the repository root, or an absolute path inside it."
            )
            raise InvalidParameterError(msg) from None
    rel = os.path.normpath(path.as_posix()).replace(os.sep, "/")
    if rel in (".", "") or rel == ".." or rel.startswith("../"):
        msg = (
            f"file_path {file_path!r} does not name a file inside the repository {str(root)!r}: give "
            "the hole's path relative to the repository root (e.g. 'pkg/module.py')."
        )
        raise InvalidParameterError(msg)
    return rel


def with_repo(requests: Sequence[FIMRequest], settings: dict[str, Any]) -> Sequence[FIMRequest]:
    """The batch with ``settings``' ``repo`` (taken out of them) in each request that has none."""
    index = settings.pop("repo", None)
    if index is None:
        return requests
    if isinstance(requests, str | bytes) or not isinstance(requests, Sequence):
        return requests  # generate_batch says what a batch is
    return [
        dataclasses.replace(r, repo=index) if isinstance(r, FIMRequest) and r.repo is None else r
        for r in requests
    ]


def fim_request(prefix: str | FIMRequest, suffix: str, settings: dict[str, Any]) -> tuple[FIMRequest, dict]:
    """The request (given whole, or as keywords) and the remaining (generation) settings."""
    fim_settings = {k: settings[k] for k in FIM_KEYS if k in settings}
    rest = {k: v for k, v in settings.items() if k not in fim_settings}
    if isinstance(prefix, FIMRequest):
        if fim_settings or suffix:
            msg = "Pass either a FIMRequest or its fields as arguments, not both."
            raise InvalidParameterError(msg)
        return prefix, rest
    return FIMRequest(prefix, suffix, **fim_settings), rest
