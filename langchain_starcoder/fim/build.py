"""Building a fill-in-the-middle (FIM) prompt within a token budget, in named steps: the layout and its
control tokens (:mod:`.layout`), the fixed parts, the hole (:func:`.fitting.fit_hole`), a notebook's
cells, the context files, then the parts in order.

User text is data: the prefix, suffix, file contents, paths and the repo name are encoded with
special-token parsing off, so a file that contains the literal text ``<file_sep>`` cannot reshape the
prompt. Control tokens are inserted as ids. Each run of text between two control tokens is encoded as
one piece, which is how the model's own tokenizer splits a hand-written prompt, and the budget is
counted on exactly the ids that are emitted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeAlias, runtime_checkable

from .._tokens import Codec, Encoded, codec_for
from ..errors import ContextLengthError, InvalidParameterError, UnsupportedModelError
from ..notebook import NotebookParts, notebook_parts
from ..types import DEFAULT_MAX_TOKENS
from . import budget
from .fitting import Encode, HoleFit, fit_file, fit_hole
from .layout import (
    FIM_STOP_TOKENS,
    STARCODER_METADATA_TOKENS,
    FIMPrompt,
    Frame,
    Hole,
    KeptFile,
    MissingFIMTokensError,
    assemble,
    control_ids,
    file_frame,
    frame,
    layout_of,
    render,
    stop_ids,
)
from .request import ContextFile, FIMRequest

#: A transformers tokenizer, mlx-lm's ``TokenizerWrapper`` or a ``tokenizers.Tokenizer``.
Tokenizer: TypeAlias = Any

#: Picks more context files for the tokens the hole and the given files leave (a repository index).
MoreFiles = Callable[[int], Sequence[ContextFile]]


@runtime_checkable
class EngineLike(Protocol):
    """What :func:`build_fim_prompt` takes of a :class:`~langchain_starcoder.StarCoderEngine`: its
    tokenizer and context window (``fim`` sits below the engine, so it names only these)."""

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def context_window(self) -> int: ...


def fim_stop_token_ids(tokenizer: EngineLike | Tokenizer) -> tuple[int, ...]:
    """Ids of :data:`FIM_STOP_TOKENS` that the vocabulary has: pass them as ``stop_token_ids``."""
    if isinstance(tokenizer, EngineLike):
        tokenizer = tokenizer.tokenizer
    return stop_ids(codec_for(tokenizer))


def build_fim_prompt(
    tokenizer: EngineLike | Tokenizer,
    prefix: str | FIMRequest,
    suffix: str = "",
    *,
    context_window: int | None = None,
    **options: Any,
) -> FIMPrompt:
    """Build the token ids of a FIM prompt within a token budget.

    Args:
        tokenizer: A :class:`~langchain_starcoder.StarCoderEngine` (its tokenizer, and its context
            window unless ``context_window`` is given), a transformers tokenizer, mlx-lm's
            ``TokenizerWrapper`` or a ``tokenizers.Tokenizer``.
        prefix: The code before the hole, or a whole :class:`~langchain_starcoder.fim.request.FIMRequest`.
        suffix: The code after the hole.
        context_window: The model's context window, from which a budget is derived when
            ``max_prompt_tokens`` is None (:func:`~langchain_starcoder.fim.budget.prompt_budget`, with
            :data:`DEFAULT_MAX_TOKENS` for the middle). None: an engine's own; for a bare tokenizer,
            the prompt is unbounded.
        options: The other fields of :class:`~langchain_starcoder.fim.request.FIMRequest`:
            ``context_files`` (other files of the repository, most relevant first; any of them, a
            ``repo_name`` or a ``file_path`` selects StarCoder2's repository layout), ``repo_name``,
            ``file_path``, ``mode`` ("psm" or "spm") and ``max_prompt_tokens`` (the most tokens the
            prompt may have; default: the context window minus :data:`DEFAULT_MAX_TOKENS`, see
            ``context_window``).

    The budget is never exceeded. Control tokens, the repo name and the hole's file path always go
    in (a budget too small for them raises :class:`~langchain_starcoder.errors.ContextLengthError`).
    Then the hole: if prefix and suffix do not both fit, the prefix keeps its end (the code nearest
    the hole) and is allowed at least three quarters of what is left, the suffix keeps its start.
    Both are cut between characters, as many as fit. Context files then fill what remains, in the
    order given, each whole or cut after its last line that fits (a file of which no line fits is
    dropped, and later, smaller files may still go in).

    Raises:
        MissingFIMTokensError: The tokenizer lacks a control token the layout needs.
        InvalidParameterError: An argument has the wrong type or value.
        ContextLengthError: ``max_prompt_tokens`` cannot hold even the layout's fixed parts.
    """
    request = prefix if isinstance(prefix, FIMRequest) else FIMRequest(prefix, suffix, **options)
    tokenizer, request = _budgeted(tokenizer, context_window, request)
    return build(codec_for(tokenizer), request)


def build_fim_prompt_adding(
    tokenizer: EngineLike | Tokenizer, request: FIMRequest, more_files: MoreFiles
) -> FIMPrompt:
    """:func:`build_fim_prompt` of ``request`` with, after its own context files, those that
    ``more_files(tokens)`` picks for the tokens the hole and those files leave (the hole is measured
    once: a repository index fills the rest of the budget)."""
    tokenizer, request = _budgeted(tokenizer, None, request)
    return build(codec_for(tokenizer), request, more_files)


def _budgeted(
    tokenizer: EngineLike | Tokenizer, context_window: int | None, request: FIMRequest
) -> tuple[Tokenizer, FIMRequest]:
    """The tokenizer (an engine's own) and ``request`` with a budget where a context window (given,
    or an engine's) sets one and the request has none."""
    if isinstance(tokenizer, EngineLike):  # an engine: its tokenizer, and its window unless given
        context_window = tokenizer.context_window if context_window is None else context_window
        tokenizer = tokenizer.tokenizer
    if context_window is None or request.max_prompt_tokens is not None:
        return tokenizer, request
    if isinstance(context_window, bool) or not isinstance(context_window, int):
        msg = f"context_window must be an integer (the model's, in tokens) or None, not {context_window!r}."
        raise InvalidParameterError(msg)
    limit = budget.prompt_budget(context_window, DEFAULT_MAX_TOKENS, None)
    return tokenizer, dataclasses.replace(request, max_prompt_tokens=limit)


def build(codec: Codec, request: FIMRequest, more_files: MoreFiles | None = None) -> FIMPrompt:
    """The prompt of ``request`` in its budget (``max_prompt_tokens``; None: unbounded)."""
    layout = layout_of(codec, request)
    ids = control_ids(codec, request, layout, adding=more_files is not None)
    stops = stop_ids(codec)
    encode = _data_encoder(codec, set(stops) | set(ids.values()))
    fixed = frame(request, layout)
    repo_ids = encode(request.repo_name)[0] if request.repo_name else []
    header_ids = encode(fixed.header)[0]
    room = _room(request.max_prompt_tokens, fixed, repo_ids, header_ids)
    fit, left = _fit_hole(encode, request, fixed.header, header_ids, room)
    cells = None
    if request.notebook is not None:
        cells, left = _fit_cells(encode, request, left, more_files is not None)
    n_repo = len(repo_ids)
    files, left = _fit_files(encode, layout, request.context_files, request.repo_name, n_repo, left)
    if more_files is not None and request.repo_level and left is not None and left > 0:
        more, left = _fit_files(encode, layout, more_files(left), request.repo_name, n_repo, left)
        files += more
    hole = _hole(request, fit, fixed.header, header_ids, cells)
    token_ids, text = render(assemble(request, layout, repo_ids, files, hole), ids)
    limit = request.max_prompt_tokens
    assert limit is None or len(token_ids) <= limit, "FIM budget overrun"  # each part was checked
    return FIMPrompt(
        token_ids=token_ids,
        text=text,
        prefix_chars_kept=fit.prefix_kept,
        suffix_chars_kept=fit.suffix_kept,
        files_kept=tuple(file for file, _ in files),
        mode=request.mode,
        repo_level=request.repo_level,
        max_prompt_tokens=limit,
        stop_token_ids=stops,
        layout=layout,
        notebook_cells=None if cells is None else (cells.cells_before, cells.cells_after),
    )


def _data_encoder(codec: Codec, controls: set[int]) -> Encode:
    """The codec's encoding of user text as data, refusing a tokenizer that parses control strings."""

    def encode(text: str) -> Encoded:
        encoded = codec.encode(text)
        if controls.intersection(encoded[0]):
            msg = "The tokenizer turned user text into control tokens; it cannot encode text as data."
            raise UnsupportedModelError(msg)
        return encoded

    return encode


def _room(limit: int | None, fixed: Frame, repo_ids: list[int], header_ids: list[int]) -> int | None:
    """The tokens left for the hole (its metadata included) and the files: the budget less the
    layout's control tokens and repo name (None: unbounded)."""
    if limit is None:
        return None
    always = fixed.controls + (len(repo_ids) if fixed.repo_name else 0)
    if always + len(header_ids) > limit:
        tokens = always + len(header_ids)
        msg = (
            f"max_prompt_tokens={limit} cannot hold this FIM layout's fixed parts ({tokens} "
            "tokens: control tokens, repo name and file path). Raise the budget or shorten the names."
        )
        raise ContextLengthError(msg)
    return limit - always


def _fit_hole(
    encode: Encode, request: FIMRequest, header: str, header_ids: list[int], room: int | None
) -> tuple[HoleFit, int | None]:
    """The hole in ``room`` tokens, and what it leaves. Its metadata (``header``) is encoded in one
    piece with the prefix; in a notebook it is a part of its own, before the cells."""
    pre, pre_ids = (header, header_ids) if request.notebook is None else ("", [])
    if request.notebook is not None and room is not None:
        room -= len(header_ids)
    fit = fit_hole(encode, request.prefix, request.suffix, room, pre, len(pre_ids))
    return fit, None if room is None else room - len(fit.prefix_ids) - len(fit.suffix_ids)


def _hole(
    request: FIMRequest, fit: HoleFit, header: str, header_ids: list[int], cells: NotebookParts | None
) -> Hole:
    """The hole as the layout writes it: the kept texts (the prefix after its metadata, unless in a
    notebook) and their ids."""
    prefix, suffix = (
        request.prefix[len(request.prefix) - fit.prefix_kept :],
        request.suffix[: fit.suffix_kept],
    )
    if cells is None:
        return Hole(header + prefix, fit.prefix_ids, suffix, fit.suffix_ids)
    return Hole(prefix, fit.prefix_ids, suffix, fit.suffix_ids, header, header_ids, cells)


def _fit_cells(
    encode: Encode, request: FIMRequest, left: int | None, adding: bool
) -> tuple[NotebookParts, int | None]:
    """The notebook's cells around the hole in what the hole left: repository files keep a quarter
    of it when there are any (or an index adds them), the cells have the rest first."""
    assert request.notebook is not None
    share = left if left is None or not (request.context_files or adding) else left * 3 // 4
    cells = notebook_parts(request.notebook, lambda text: encode(text)[0], share)
    return cells, None if left is None else left - cells.tokens


def _fit_files(
    encode: Encode,
    layout: str,
    files: Sequence[ContextFile],
    repo_name: str | None,
    n_repo: int,
    left: int | None,
) -> tuple[list[KeptFile], int | None]:
    """The files that fit in ``left`` tokens, in order, each whole or cut after a line, and what
    they leave."""
    kept: list[KeptFile] = []
    for file in files:
        head, overhead = file_frame(layout, file, repo_name or None, n_repo)
        fitted = fit_file(encode, file, left, head, overhead)
        if fitted is not None:
            kept.append(fitted)
            if left is not None:
                left -= overhead + len(fitted[1])
    return kept, left


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "FIM_STOP_TOKENS",
    "STARCODER_METADATA_TOKENS",
    "ContextFile",
    "EngineLike",
    "FIMPrompt",
    "FIMRequest",
    "MissingFIMTokensError",
    "build_fim_prompt",
    "fim_stop_token_ids",
]
