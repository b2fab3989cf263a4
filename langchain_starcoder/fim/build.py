"""Fill-in-the-middle (FIM) prompts for StarCoder models, within a token budget (both families' layouts share
one; fitting a text into it is :mod:`langchain_starcoder.fim.fitting`).

Layouts (``P``, ``S`` are the prefix and suffix of the hole, ``<...>`` are single control tokens):

- PSM: ``<fim_prefix>P<fim_suffix>S<fim_middle>``, the model writes the middle next.
- SPM: ``<fim_prefix><fim_suffix>S<fim_middle>P``.
- Repository level (StarCoder2, used as soon as there are context files, a repo name or a file path)::

      <repo_name>{repo}<file_sep>{path}\\n{code}<file_sep>{path}\\n{code}...
      <file_sep><fim_prefix>{file_path}\\n{P}<fim_suffix>{S}<fim_middle>

  Each metadata part is left out when absent: no repo name drops ``<repo_name>{repo}``, a context file
  with an empty path is ``<file_sep>{code}``, no ``file_path`` drops ``{file_path}\\n``. With
  ``mode="spm"`` the hole's file is ``<file_sep><fim_prefix><fim_suffix>{S}<fim_middle>{file_path}\\n{P}``.

- StarCoder (v1: StarCoder, StarCoderBase, StarCoderPlus, WizardCoder, StarChat; chosen when the
  vocabulary has ``<filename>`` and no ``<file_sep>``, never from a model name). It was not trained
  on repositories: each file was one document, metadata first, documents joined by ``<|endoftext|>``,
  and FIM was applied to a whole document, metadata included. So context files are documents of
  their own and the hole's metadata starts its prefix::

      <reponame>{repo}<filename>{path}\\n{code}<|endoftext|>...
      <fim_prefix><reponame>{repo}<filename>{file_path}\\n{P}<fim_suffix>{S}<fim_middle>

  Each metadata part is left out when absent (the newline follows the last one present, and none is
  written without metadata); SPM is ``<fim_prefix><fim_suffix>{S}<fim_middle><reponame>...{P}``.
  ``<gh_stars>`` is never written (a request has no star count). Sources: the StarCoder paper
  (Li et al. 2023, arXiv:2305.06161, "Data formatting" under Model training, as quoted by secondary
  pages: ``<reponame>REPONAME<filename>FILENAME<gh_stars>STARS\\nCode<eos>``); BigCode's
  preprocessing, bigcode-project/bigcode-dataset ``preprocessing/add_content_with_meta.py`` (each
  part kept at random, prepended to the file's text, then ``\\n`` only if any part was kept); and
  bigcode-project/Megatron-LM ``megatron/data/gpt_dataset.py`` (``permute`` cuts each
  ``<|endoftext|>``-separated document at two random characters, metadata included, and writes
  ``<fim_prefix>P<fim_suffix>S<fim_middle>M``, or SPM ``<fim_prefix><fim_suffix>S<fim_middle>PM``).
  Not confirmed: whether real checkpoints infill better with or without metadata (no weights here);
  a cut inside the metadata was possible in training, so the layout above is the usual case only.

User text is data: the prefix, suffix, file contents, paths and the repo name are encoded with
special-token parsing off, so a file that contains the literal text ``<file_sep>`` cannot reshape the
prompt. Control tokens are inserted as ids. Each run of text between two control tokens is encoded as
one piece, which is how the model's own tokenizer splits a hand-written prompt, and the budget is
counted on exactly the ids that are emitted.

Stops: an infill ends at :data:`FIM_STOP_TOKENS` and, in a StarCoder (v1) vocabulary, at its
metadata tokens :data:`STARCODER_METADATA_TOKENS`.

Prompt cache: the engine reuses the KV cache of the longest common token prefix with a recent
request. The stable parts come first (repo name, context files, the hole's file path), so repeated
infills in one file with the same context files prefill only from the first changed token: in PSM
an edit near the hole re-prefills the end of the prefix and the suffix, in SPM (suffix first) only
the end of the prefix. A budget that cuts the prefix's start or a context file moves that point up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._tokens import Codec, Encoded, codec_for
from ..errors import ContextLengthError, UnsupportedModelError
from ..notebook import NOTEBOOK_TOKENS, notebook_parts
from ..types import DEFAULT_MAX_TOKENS
from .fitting import encode_window, fit_file, guess_chars, largest
from .request import ContextFile, FIMRequest

#: Control tokens an infill stops at: the end of the file, or the model starting a new FIM/repo part.
FIM_STOP_TOKENS = (
    "<|endoftext|>",
    "<file_sep>",
    "<fim_prefix>",
    "<fim_suffix>",
    "<fim_middle>",
    "<fim_pad>",
    "<repo_name>",
)

#: StarCoder's (v1) metadata tokens: a middle also ends where the model starts a new file's header.
STARCODER_METADATA_TOKENS = ("<reponame>", "<filename>", "<gh_stars>")

# SantaCoder spells the FIM tokens with hyphens; the layout uses whichever the tokenizer has.
_ALIASES = {
    "<fim_prefix>": ("<fim_prefix>", "<fim-prefix>"),
    "<fim_suffix>": ("<fim_suffix>", "<fim-suffix>"),
    "<fim_middle>": ("<fim_middle>", "<fim-middle>"),
    "<fim_pad>": ("<fim_pad>", "<fim-pad>"),
}
_FIM = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")


class MissingFIMTokensError(UnsupportedModelError):
    """The tokenizer lacks control tokens that the requested FIM layout needs."""


@dataclass(frozen=True)
class FIMPrompt:
    """A FIM prompt as token ids, with what the token budget kept."""

    token_ids: list[int]
    """The prompt: control tokens as ids, user text encoded with special-token parsing off."""
    text: str
    """A readable rendering (control tokens written out). Do not re-encode it: use ``token_ids``."""
    prefix_chars_kept: int
    """How many characters of the prefix, counted from its end, are in the prompt."""
    suffix_chars_kept: int
    """How many characters of the suffix, counted from its start, are in the prompt."""
    files_kept: tuple[ContextFile, ...]
    """The context files in the prompt, in order, each whole or cut after a line."""
    mode: str
    """"psm" or "spm"."""
    repo_level: bool
    """Whether a repository layout is used: StarCoder2's (``<file_sep>``...) or StarCoder's metadata."""
    max_prompt_tokens: int | None
    """The budget the prompt was built under (None: unbounded)."""
    stop_token_ids: tuple[int, ...]
    """Ids of :data:`FIM_STOP_TOKENS` and :data:`STARCODER_METADATA_TOKENS` in this vocabulary: the
    middle ends at any of them."""
    layout: str = "fim"
    """"fim" (no repository parts), "starcoder2" (``<file_sep>``) or "starcoder" (metadata tokens)."""
    notebook_cells: tuple[int, int] | None = None
    """With notebook context: how many cells before and after the hole's cell are in the prompt."""


def _control_id(codec: Codec, token: str) -> int | None:
    for name in _ALIASES.get(token, (token,)):
        token_id = codec.token_id(name)
        if token_id is not None:
            return token_id
    return None


def fim_stop_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """Ids of :data:`FIM_STOP_TOKENS` that the vocabulary has: pass them as ``stop_token_ids``."""
    return _stop_ids(codec_for(_tokenizer_of(tokenizer)))


def _stop_ids(codec: Codec) -> tuple[int, ...]:
    ids = (_control_id(codec, t) for t in FIM_STOP_TOKENS + STARCODER_METADATA_TOKENS)
    return tuple(dict.fromkeys(i for i in ids if i is not None))


def build_fim_prompt(tokenizer: Any, prefix: str | FIMRequest, suffix: str = "", **options: Any) -> FIMPrompt:
    """Build the token ids of a FIM prompt within a token budget.

    Args:
        tokenizer: A :class:`~langchain_starcoder.StarCoderEngine` (its tokenizer and context
            window), a transformers tokenizer, mlx-lm's ``TokenizerWrapper`` or a
            ``tokenizers.Tokenizer``.
        prefix: The code before the hole, or a whole :class:`~langchain_starcoder.fim.request.FIMRequest`.
        suffix: The code after the hole.
        options: The other fields of :class:`~langchain_starcoder.fim.request.FIMRequest`:
            ``context_files`` (other files of the repository, most relevant first; any of them, a
            ``repo_name`` or a ``file_path`` selects StarCoder2's repository layout), ``repo_name``,
            ``file_path``, ``mode`` ("psm" or "spm") and ``max_prompt_tokens`` (the most tokens the
            prompt may have; default: for an engine, its context window minus
            :data:`DEFAULT_MAX_TOKENS`; for a bare tokenizer, unbounded).

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
    window = getattr(tokenizer, "context_window", None)
    if request.max_prompt_tokens is None and window is not None:
        request = dataclasses.replace(request, max_prompt_tokens=max(1, window - DEFAULT_MAX_TOKENS))
    return _build(codec_for(_tokenizer_of(tokenizer)), request)


def _tokenizer_of(tokenizer_or_engine: Any) -> Any:
    """An engine's tokenizer (an engine is what has a ``context_window``), or the tokenizer itself."""
    return (
        tokenizer_or_engine.tokenizer
        if hasattr(tokenizer_or_engine, "context_window")
        else tokenizer_or_engine
    )


def _layout(codec: Codec) -> str:
    """The repository layout the vocabulary was trained with: StarCoder2's ``<file_sep>``, else
    StarCoder's metadata tokens (``<filename>``); a vocabulary with neither gets StarCoder2's
    layout, which then reports the tokens it lacks."""
    if codec.token_id("<file_sep>") is None and codec.token_id("<filename>") is not None:
        return "starcoder"
    return "starcoder2"


def build_fim_prompt_adding(
    tokenizer: Any, request: FIMRequest, more_files: Callable[[int], Sequence[ContextFile]]
) -> FIMPrompt:
    """:func:`build_fim_prompt` of ``request`` with, after its own context files, those that
    ``more_files(tokens)`` picks for the tokens the hole and those files leave (the hole is measured
    once: a repository index fills the rest of the budget)."""
    window = getattr(tokenizer, "context_window", None)
    if request.max_prompt_tokens is None and window is not None:
        request = dataclasses.replace(request, max_prompt_tokens=max(1, window - DEFAULT_MAX_TOKENS))
    return _build(codec_for(_tokenizer_of(tokenizer)), request, more_files)


def _build(
    codec: Codec, request: FIMRequest, more_files: Callable[[int], Sequence[ContextFile]] | None = None
) -> FIMPrompt:
    prefix, suffix, files, mode = request.prefix, request.suffix, request.context_files, request.mode
    repo_name, file_path, limit = (
        request.repo_name or None,
        request.file_path or None,
        request.max_prompt_tokens,
    )
    repo_level, notebook = request.repo_level, request.notebook
    layout = _layout(codec) if repo_level else "fim"
    if layout == "starcoder":
        needed = list(_FIM) + (["<reponame>"] if repo_name else [])
        needed += ["<filename>"] if file_path or any(f.path for f in files) else []
        needed += ["<|endoftext|>"] if files else []
    else:
        needed = list(_FIM) + (["<file_sep>"] if repo_level else []) + (["<repo_name>"] if repo_name else [])
    needed += list(NOTEBOOK_TOKENS) if notebook is not None else []
    ids = {token: _control_id(codec, token) for token in needed}
    missing = [token for token, i in ids.items() if i is None]
    if missing:
        layout_name = "the repository-level FIM layout" if repo_level else f"FIM ({mode.upper()})"
        layout_name += " with notebook context" if notebook is not None else ""
        msg = (
            f"This tokenizer has no {', '.join(missing)} token(s), which {layout_name} needs: the checkpoint "
            "was not trained for it. Use a StarCoder2 checkpoint"
            + (", or leave out context_files, repo_name and file_path." if repo_level else ".")
        )
        raise MissingFIMTokensError(msg)
    stop_ids = _stop_ids(codec)
    controls = set(stop_ids) | {i for i in ids.values() if i is not None}

    def encode(text: str) -> Encoded:
        encoded = codec.encode(text)
        if controls.intersection(encoded[0]):  # a tokenizer that still parses control strings
            msg = "The tokenizer turned user text into control tokens; it cannot encode text as data."
            raise UnsupportedModelError(msg)
        return encoded

    repo_ids = encode(repo_name)[0] if repo_name else []
    if layout == "starcoder":
        # The hole's metadata: <reponame>{repo}<filename>{path}\n, or <reponame>{repo}\n without a
        # path (the newline then follows the repo name, in one piece with the prefix).
        header = f"{file_path}\n" if file_path else (f"{repo_name}\n" if repo_name else "")
        hole_repo_ids = repo_ids if file_path else []
        n_controls = len(_FIM) + bool(repo_name) + bool(file_path)
    else:
        header = f"{file_path}\n" if file_path else ""
        hole_repo_ids = repo_ids
        n_controls = len(_FIM) + (1 if repo_level else 0) + (1 if repo_name else 0)
    n_controls += 2 if notebook is not None else 0  # <jupyter_start> and the hole cell's <jupyter_code>
    header_ids = encode(header)[0]
    fixed = n_controls + len(hole_repo_ids) + len(header_ids)
    if limit is not None and fixed > limit:
        msg = (
            f"max_prompt_tokens={limit} cannot hold this FIM layout's fixed parts ({fixed} tokens: "
            "control tokens, repo name and file path). Raise the budget or shorten the names."
        )
        raise ContextLengthError(msg)

    room = None if limit is None else limit - n_controls - len(hole_repo_ids)  # for hole and files
    # A notebook's structure goes between the hole's file path and its prefix: the header is a part
    # of its own, no longer encoded with the prefix.
    pre, pre_ids = (header, header_ids) if notebook is None else ("", [])
    if notebook is not None and room is not None:
        room -= len(header_ids)
    # Only the side of the prefix and suffix nearest the hole is encoded when that alone overflows.
    near_prefix, prefix_ids, prefix_offsets = encode_window(encode, prefix, room, keep_end=True, pre=pre)
    near_suffix, suffix_ids, suffix_offsets = encode_window(encode, suffix, room, keep_end=False)
    prefix_kept, suffix_kept = len(prefix), len(suffix)
    if room is not None and len(prefix_ids) + len(suffix_ids) > room:
        hole = room - len(pre_ids)
        p_tokens = len(prefix_ids) - len(pre_ids)
        s_limit = max(hole - p_tokens, hole // 4)
        if len(suffix_ids) > s_limit:
            suffix_kept = largest(
                len(near_suffix),
                lambda n: len(encode(near_suffix[:n])[0]) <= s_limit,
                guess_chars(suffix_offsets, len(near_suffix), len(suffix_ids), s_limit),
            )
            suffix_ids = encode(suffix[:suffix_kept])[0]
        p_limit = room - len(suffix_ids)  # what the suffix leaves, header included
        if len(prefix_ids) > p_limit:
            n_near = len(near_prefix)
            prefix_kept = largest(
                n_near,
                lambda n: len(encode(pre + near_prefix[n_near - n :])[0]) <= p_limit,
                guess_chars(
                    prefix_offsets,
                    len(pre) + n_near,
                    len(prefix_ids),
                    p_limit - len(pre_ids),
                    from_end=True,
                ),
            )
            prefix_ids = encode(pre + prefix[len(prefix) - prefix_kept :])[0]

    left = None if room is None else room - len(prefix_ids) - len(suffix_ids)
    cells = None
    if notebook is not None:
        # Repository files keep a quarter of what the hole leaves; the cells have the rest first.
        share = left if left is None or not (files or more_files) else left * 3 // 4
        cells = notebook_parts(notebook, lambda text: encode(text)[0], share)
        left = None if left is None else left - cells.tokens
    kept_files: list[tuple[ContextFile, list[int]]] = []

    def fit(files: Sequence[ContextFile]) -> None:
        nonlocal left
        for file in files:
            head, overhead = _file_frame(layout, file, repo_name, len(repo_ids))
            kept = fit_file(encode, file, left, head, overhead)
            if kept is not None:
                kept_files.append(kept)
                if left is not None:
                    left -= overhead + len(kept[1])

    fit(files)
    if more_files is not None and repo_level and left is not None and left > 0:
        fit(more_files(left))

    parts: list[tuple[str, Any]] = []  # ("control", token) or ("data", (text, ids))
    hole_prefix: list[tuple[str, Any]] = [("data", (pre + prefix[len(prefix) - prefix_kept :], prefix_ids))]
    hole_suffix: list[tuple[str, Any]] = [("data", (suffix[:suffix_kept], suffix_ids))]
    if cells is not None:
        head = [("data", (header, header_ids))] if header else []
        hole_prefix = [*head, ("control", "<jupyter_start>"), *cells.before, ("control", "<jupyter_code>")]
        hole_prefix += [("data", (prefix[len(prefix) - prefix_kept :], prefix_ids))]
        hole_suffix += cells.after
    meta: list[tuple[str, Any]] = []  # StarCoder: the hole's metadata, which goes with its prefix
    if layout == "starcoder":
        for file, file_ids in kept_files:  # each file its own document, as in training
            head, _ = _file_frame(layout, file, repo_name, len(repo_ids))
            if repo_name:
                parts.append(("control", "<reponame>"))
                parts += [("data", (repo_name, repo_ids))] if file.path else []
            parts += [("control", "<filename>")] if file.path else []
            parts += [("data", (head + file.text, file_ids)), ("control", "<|endoftext|>")]
        if repo_name:
            meta.append(("control", "<reponame>"))
            meta += [("data", (repo_name, repo_ids))] if file_path else []
        meta += [("control", "<filename>")] if file_path else []
    else:
        if repo_name:
            parts += [("control", "<repo_name>"), ("data", (repo_name, repo_ids))]
        for file, file_ids in kept_files:
            head = f"{file.path}\n" if file.path else ""
            parts += [("control", "<file_sep>"), ("data", (head + file.text, file_ids))]
        if repo_level:
            parts.append(("control", "<file_sep>"))
    if mode == "psm":
        parts += [("control", "<fim_prefix>"), *meta, *hole_prefix, ("control", "<fim_suffix>"), *hole_suffix]
        parts.append(("control", "<fim_middle>"))
    else:
        parts += [("control", "<fim_prefix>"), ("control", "<fim_suffix>"), *hole_suffix]
        parts += [("control", "<fim_middle>"), *meta, *hole_prefix]

    token_ids: list[int] = []
    texts: list[str] = []
    for kind, value in parts:
        if kind == "control":
            token_ids.append(ids[value])
            texts.append(value)
        else:
            texts.append(value[0])
            token_ids.extend(value[1])
    assert limit is None or len(token_ids) <= limit, "FIM budget overrun"  # each part was checked
    return FIMPrompt(
        token_ids=token_ids,
        text="".join(texts),
        prefix_chars_kept=prefix_kept,
        suffix_chars_kept=suffix_kept,
        files_kept=tuple(file for file, _ in kept_files),
        mode=mode,
        repo_level=repo_level,
        max_prompt_tokens=limit,
        stop_token_ids=stop_ids,
        layout=layout,
        notebook_cells=None if cells is None else (cells.cells_before, cells.cells_after),
    )


def _file_frame(layout: str, file: ContextFile, repo_name: str | None, n_repo: int) -> tuple[str, int]:
    """A context file's head (text encoded with its code) and how many tokens its frame takes
    besides: StarCoder2's ``<file_sep>``, or StarCoder's metadata and ``<|endoftext|>``."""
    if layout != "starcoder":
        return (f"{file.path}\n" if file.path else ""), 1
    if file.path:
        return f"{file.path}\n", (1 + n_repo if repo_name else 0) + 2
    if repo_name:
        return f"{repo_name}\n", 2
    return "", 1


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "FIM_STOP_TOKENS",
    "STARCODER_METADATA_TOKENS",
    "ContextFile",
    "FIMPrompt",
    "FIMRequest",
    "MissingFIMTokensError",
    "build_fim_prompt",
    "fim_stop_token_ids",
]
