"""Where each part of a FIM prompt goes: the control tokens, the PSM, SPM and repository layouts, the
prompt they make (:class:`FIMPrompt`) and the tokens an infill stops at.

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

Stops: an infill ends at :data:`FIM_STOP_TOKENS` and, in a StarCoder (v1) vocabulary, at its
metadata tokens :data:`STARCODER_METADATA_TOKENS`.

Prompt cache: the engine reuses the KV cache of the longest common token prefix with a recent
request. The stable parts come first (repo name, context files, the hole's file path), so repeated
infills in one file with the same context files prefill only from the first changed token: in PSM
an edit near the hole re-prefills the end of the prefix and the suffix, in SPM (suffix first) only
the end of the prefix. A budget that cuts the prefix's start or a context file moves that point up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._tokens import Codec
from ..errors import UnsupportedModelError
from ..notebook import NOTEBOOK_TOKENS, NotebookParts
from ..notebook.layout import Part
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

#: A context file in the prompt: the file (whole or cut after a line) and the ids of its text.
KeptFile = tuple[ContextFile, list[int]]


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


# --- control tokens -------------------------------------------------------------------------------


def control_id(codec: Codec, token: str) -> int | None:
    """The id of ``token`` (or of its SantaCoder spelling) in this vocabulary, if it has one."""
    for name in _ALIASES.get(token, (token,)):
        token_id = codec.token_id(name)
        if token_id is not None:
            return token_id
    return None


def stop_ids(codec: Codec) -> tuple[int, ...]:
    """Ids of :data:`FIM_STOP_TOKENS` and :data:`STARCODER_METADATA_TOKENS` that the vocabulary has."""
    ids = (control_id(codec, t) for t in FIM_STOP_TOKENS + STARCODER_METADATA_TOKENS)
    return tuple(dict.fromkeys(i for i in ids if i is not None))


def layout_of(codec: Codec, request: FIMRequest) -> str:
    """ "fim" without repository parts; else the repository layout the vocabulary was trained with:
    StarCoder2's ``<file_sep>``, else StarCoder's metadata tokens (``<filename>``). A vocabulary with
    neither gets StarCoder2's layout, which then reports the tokens it lacks."""
    if not request.repo_level:
        return "fim"
    if codec.token_id("<file_sep>") is None and codec.token_id("<filename>") is not None:
        return "starcoder"
    return "starcoder2"


def control_ids(codec: Codec, request: FIMRequest, layout: str, *, adding: bool = False) -> dict[str, int]:
    """The id of each control token the layout of ``request`` writes (``adding``: with more context
    files than its own, which a repository index picks).

    Raises:
        MissingFIMTokensError: The vocabulary lacks some of them.
    """
    ids = {token: control_id(codec, token) for token in _needed(request, layout, adding)}
    missing = [token for token, i in ids.items() if i is None]
    if missing:
        layout_name = (
            "the repository-level FIM layout" if request.repo_level else f"FIM ({request.mode.upper()})"
        )
        layout_name += " with notebook context" if request.notebook is not None else ""
        msg = (
            f"This tokenizer has no {', '.join(missing)} token(s), which {layout_name} needs: the checkpoint "
            "was not trained for it. Use a StarCoder2 checkpoint"
            + (", or leave out context_files, repo_name and file_path." if request.repo_level else ".")
        )
        raise MissingFIMTokensError(msg)
    return {token: i for token, i in ids.items() if i is not None}


def _needed(request: FIMRequest, layout: str, adding: bool) -> list[str]:
    repo_name, files = request.repo_name, request.context_files
    if layout == "starcoder":
        needed = list(_FIM) + (["<reponame>"] if repo_name else [])
        needed += ["<filename>"] if request.file_path or adding or any(f.path for f in files) else []
        needed += ["<|endoftext|>"] if files or adding else []
    else:
        needed = list(_FIM) + (["<file_sep>"] if request.repo_level else [])
        needed += ["<repo_name>"] if repo_name else []
    return needed + (list(NOTEBOOK_TOKENS) if request.notebook is not None else [])


# --- what a layout always writes ------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """What the layout of a request writes whatever the budget: its control tokens, the repo name
    (once, at most) and the hole's metadata."""

    controls: int
    """How many control tokens."""
    repo_name: bool
    """Whether the repo name's text is written even without context files."""
    header: str
    """The hole's metadata as text (``{file_path}\\n``...), encoded in one piece with its prefix."""


def frame(request: FIMRequest, layout: str) -> Frame:
    """The fixed parts of the layout of ``request``."""
    repo_name, file_path = request.repo_name or None, request.file_path or None
    notebook = 2 if request.notebook is not None else 0  # <jupyter_start>, the hole cell's <jupyter_code>
    if layout == "starcoder":
        # The hole's metadata: <reponame>{repo}<filename>{path}\n, or <reponame>{repo}\n without a
        # path (the newline then follows the repo name, in one piece with the prefix).
        header = f"{file_path}\n" if file_path else (f"{repo_name}\n" if repo_name else "")
        controls = len(_FIM) + bool(repo_name) + bool(file_path) + notebook
        return Frame(controls, repo_name=bool(file_path), header=header)
    controls = len(_FIM) + bool(request.repo_level) + bool(repo_name) + notebook
    return Frame(controls, repo_name=True, header=f"{file_path}\n" if file_path else "")


def file_frame(layout: str, file: ContextFile, repo_name: str | None, n_repo: int) -> tuple[str, int]:
    """A context file's head (text encoded with its code) and how many tokens its frame takes
    besides: StarCoder2's ``<file_sep>``, or StarCoder's metadata and ``<|endoftext|>``."""
    if layout != "starcoder":
        return (f"{file.path}\n" if file.path else ""), 1
    if file.path:
        return f"{file.path}\n", (1 + n_repo if repo_name else 0) + 2
    if repo_name:
        return f"{repo_name}\n", 2
    return "", 1


# --- the parts in order ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Hole:
    """The hole's text as it goes in: what the budget kept of its prefix and suffix, with their ids."""

    prefix: str
    """The end of the prefix that is kept (with the hole's metadata before it, unless in a notebook)."""
    prefix_ids: list[int]
    suffix: str
    """The start of the suffix that is kept."""
    suffix_ids: list[int]
    header: str = ""
    """In a notebook: the hole's metadata, a part of its own before the cells."""
    header_ids: list[int] | None = None
    cells: NotebookParts | None = None
    """The notebook's cells around the hole's, if any."""


def assemble(
    request: FIMRequest, layout: str, repo_ids: list[int], files: Sequence[KeptFile], hole: Hole
) -> list[Part]:
    """The prompt's parts in the layout's order: the stable ones (repo name, context files) first."""
    meta: list[Part] = []  # StarCoder: the hole's metadata, which goes with its prefix
    if layout == "starcoder":
        parts = _starcoder_files(request.repo_name or None, repo_ids, files)
        meta = _starcoder_meta(request.repo_name or None, repo_ids, request.file_path or None)
    else:
        parts = _starcoder2_files(request, repo_ids, files)
    hole_prefix, hole_suffix = _hole_parts(hole)
    if request.mode == "psm":
        parts += [("control", "<fim_prefix>"), *meta, *hole_prefix, ("control", "<fim_suffix>"), *hole_suffix]
        parts.append(("control", "<fim_middle>"))
    else:
        parts += [("control", "<fim_prefix>"), ("control", "<fim_suffix>"), *hole_suffix]
        parts += [("control", "<fim_middle>"), *meta, *hole_prefix]
    return parts


def _starcoder2_files(request: FIMRequest, repo_ids: list[int], files: Sequence[KeptFile]) -> list[Part]:
    parts: list[Part] = []
    if request.repo_name:
        parts += [("control", "<repo_name>"), ("data", (request.repo_name, repo_ids))]
    for file, file_ids in files:
        head = f"{file.path}\n" if file.path else ""
        parts += [("control", "<file_sep>"), ("data", (head + file.text, file_ids))]
    if request.repo_level:
        parts.append(("control", "<file_sep>"))
    return parts


def _starcoder_files(repo_name: str | None, repo_ids: list[int], files: Sequence[KeptFile]) -> list[Part]:
    parts: list[Part] = []
    for file, file_ids in files:  # each file its own document, as in training
        head, _ = file_frame("starcoder", file, repo_name, len(repo_ids))
        if repo_name:
            parts.append(("control", "<reponame>"))
            parts += [("data", (repo_name, repo_ids))] if file.path else []
        parts += [("control", "<filename>")] if file.path else []
        parts += [("data", (head + file.text, file_ids)), ("control", "<|endoftext|>")]
    return parts


def _starcoder_meta(repo_name: str | None, repo_ids: list[int], file_path: str | None) -> list[Part]:
    meta: list[Part] = []
    if repo_name:
        meta.append(("control", "<reponame>"))
        meta += [("data", (repo_name, repo_ids))] if file_path else []
    return meta + ([("control", "<filename>")] if file_path else [])


def _hole_parts(hole: Hole) -> tuple[list[Part], list[Part]]:
    """The parts before ``<fim_suffix>`` (the prefix) and after it (the suffix)."""
    prefix: list[Part] = [("data", (hole.prefix, hole.prefix_ids))]
    suffix: list[Part] = [("data", (hole.suffix, hole.suffix_ids))]
    if hole.cells is None:
        return prefix, suffix
    head: list[Part] = [("data", (hole.header, hole.header_ids))] if hole.header else []
    cells = [("control", "<jupyter_start>"), *hole.cells.before, ("control", "<jupyter_code>")]
    return [*head, *cells, *prefix], [*suffix, *hole.cells.after]


def render(parts: Sequence[Part], ids: dict[str, int]) -> tuple[list[int], str]:
    """The prompt's token ids (control tokens as ids, data as encoded) and its readable text."""
    token_ids: list[int] = []
    texts: list[str] = []
    for kind, value in parts:
        if kind == "control":
            token_ids.append(ids[value])
            texts.append(value)
        else:
            texts.append(value[0])
            token_ids.extend(value[1])
    return token_ids, "".join(texts)
