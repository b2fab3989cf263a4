"""Fill-in-the-middle (FIM) prompts for StarCoder models, with token budgets and suffix-overlap trimming.

Layouts (``P``, ``S`` are the prefix and suffix of the hole, ``<...>`` are single control tokens):

- PSM: ``<fim_prefix>P<fim_suffix>S<fim_middle>``, the model writes the middle next.
- SPM: ``<fim_prefix><fim_suffix>S<fim_middle>P``.
- Repository level (StarCoder2, used as soon as there are context files, a repo name or a file path)::

      <repo_name>{repo}<file_sep>{path}\\n{code}<file_sep>{path}\\n{code}...
      <file_sep><fim_prefix>{file_path}\\n{P}<fim_suffix>{S}<fim_middle>

  Each metadata part is left out when absent: no repo name drops ``<repo_name>{repo}``, a context file
  with an empty path is ``<file_sep>{code}``, no ``file_path`` drops ``{file_path}\\n``. With
  ``mode="spm"`` the hole's file is ``<file_sep><fim_prefix><fim_suffix>{S}<fim_middle>{file_path}\\n{P}``.

User text is data: the prefix, suffix, file contents, paths and the repo name are encoded with
special-token parsing off, so a file that contains the literal text ``<file_sep>`` cannot reshape the
prompt. Control tokens are inserted as ids. Each run of text between two control tokens is encoded as
one piece, which is how the model's own tokenizer splits a hand-written prompt, and the budget is
counted on exactly the ids that are emitted.

Prompt cache: the engine reuses the KV cache of the longest common token prefix with a recent
request. The stable parts come first (repo name, context files, the hole's file path), so repeated
infills in one file with the same context files prefill only from the first changed token: in PSM
an edit near the hole re-prefills the end of the prefix and the suffix, in SPM (suffix first) only
the end of the prefix. A budget that cuts the prefix's start or a context file moves that point up.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ContextLengthError, InvalidParameterError, UnsupportedModelError

if TYPE_CHECKING:
    from .engine import Completion, CompletionChunk, StarCoderEngine

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

# SantaCoder spells the FIM tokens with hyphens; the layout uses whichever the tokenizer has.
_ALIASES = {
    "<fim_prefix>": ("<fim_prefix>", "<fim-prefix>"),
    "<fim_suffix>": ("<fim_suffix>", "<fim-suffix>"),
    "<fim_middle>": ("<fim_middle>", "<fim-middle>"),
    "<fim_pad>": ("<fim_pad>", "<fim-pad>"),
}
_FIM = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
_MODES = ("psm", "spm")

#: The ``max_tokens`` assumed when ``build_fim_prompt`` derives a budget from an engine's context.
DEFAULT_MAX_TOKENS = 256


class MissingFIMTokensError(UnsupportedModelError):
    """The tokenizer lacks control tokens that the requested FIM layout needs."""


@dataclass(frozen=True)
class ContextFile:
    """Another file of the repository, given to the model as context for the hole."""

    path: str
    """Its path in the repository (``""`` to leave it out: ``<file_sep>{code}``)."""
    text: str
    """Its contents."""


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
    """Whether the StarCoder2 repository layout (``<file_sep>``...) is used."""
    max_prompt_tokens: int | None
    """The budget the prompt was built under (None: unbounded)."""
    stop_token_ids: tuple[int, ...]
    """Ids of :data:`FIM_STOP_TOKENS` in this vocabulary: the middle ends at any of them."""


# --- tokenizers ----------------------------------------------------------------------------------

Encoded = tuple[list[int], list[tuple[int, int]] | None]


@dataclass(frozen=True)
class _Codec:
    """What building a prompt needs from a tokenizer."""

    encode: Callable[[str], Encoded]
    """Text as data (control-token strings are plain text): ids and, if known, char offsets."""
    token_id: Callable[[str], int | None]
    context_window: int | None


_codecs: weakref.WeakKeyDictionary[Any, _Codec] = weakref.WeakKeyDictionary()


def _fast_encoder(data_tokenizer: Any) -> Callable[[str], Encoded]:
    def encode(text: str) -> Encoded:
        if not text:
            return [], []
        encoding = data_tokenizer.encode(text, add_special_tokens=False)
        return list(encoding.ids), list(encoding.offsets)

    return encode


def _codec_for(engine_or_tokenizer: Any) -> _Codec:
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import Tokenizer

    from .engine import StarCoderEngine, data_tokenizer

    if isinstance(engine_or_tokenizer, StarCoderEngine):
        engine = engine_or_tokenizer
        return _Codec(_fast_encoder(engine._data_tokenizer), engine.token_id, engine.context_window)
    inner = engine_or_tokenizer
    if isinstance(inner, TokenizerWrapper):
        inner = inner._tokenizer
    with contextlib.suppress(TypeError):  # not weak-referenceable: build it each time
        if inner in _codecs:
            return _codecs[inner]
    backend = inner if isinstance(inner, Tokenizer) else getattr(inner, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        codec = _Codec(_fast_encoder(data_tokenizer(backend)), backend.token_to_id, None)
    elif callable(getattr(inner, "encode", None)) and callable(getattr(inner, "get_vocab", None)):
        vocab = inner.get_vocab()  # a Python (slow) transformers tokenizer

        def encode(text: str) -> Encoded:
            ids = inner.encode(text, add_special_tokens=False, split_special_tokens=True) if text else []
            return list(ids), None

        codec = _Codec(encode, vocab.get, None)
    else:
        msg = (
            "build_fim_prompt takes a StarCoderEngine, a transformers tokenizer, an mlx-lm "
            f"TokenizerWrapper or a tokenizers.Tokenizer, not {type(engine_or_tokenizer).__name__}."
        )
        raise InvalidParameterError(msg)
    with contextlib.suppress(TypeError):
        _codecs[inner] = codec
    return codec


def _control_id(codec: _Codec, token: str) -> int | None:
    for name in _ALIASES.get(token, (token,)):
        token_id = codec.token_id(name)
        if token_id is not None:
            return token_id
    return None


def fim_stop_token_ids(engine_or_tokenizer: Any) -> tuple[int, ...]:
    """Ids of :data:`FIM_STOP_TOKENS` that the vocabulary has: pass them as ``stop_token_ids``."""
    return _stop_ids(_codec_for(engine_or_tokenizer))


def _stop_ids(codec: _Codec) -> tuple[int, ...]:
    ids = (_control_id(codec, t) for t in FIM_STOP_TOKENS)
    return tuple(dict.fromkeys(i for i in ids if i is not None))


# --- arguments -----------------------------------------------------------------------------------


def _check_str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        msg = f"The {what} must be a string, not {type(value).__name__}."
        raise InvalidParameterError(msg)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        msg = f"The {what} is not valid Unicode (a lone surrogate at index {e.start}); fix the text."
        raise InvalidParameterError(msg) from e
    return value


def _check_files(context_files: Any) -> list[ContextFile]:
    if isinstance(context_files, str | bytes | ContextFile) or not isinstance(context_files, Sequence):
        msg = "context_files must be a list of ContextFile(path, text) (or of (path, text) pairs)."
        raise InvalidParameterError(msg)
    files = []
    for i, item in enumerate(context_files):
        if isinstance(item, ContextFile):
            path, text = item.path, item.text
        elif isinstance(item, tuple | list) and len(item) == 2:
            path, text = item
        else:
            msg = f"context_files[{i}] is a {type(item).__name__}; give ContextFile(path, text)."
            raise InvalidParameterError(msg)
        files.append(
            ContextFile(_check_str(path, f"path of context_files[{i}]"), _check_str(text, "context file"))
        )
    return files


def _check_options(
    prefix: Any,
    suffix: Any,
    context_files: Any,
    repo_name: Any,
    file_path: Any,
    mode: Any,
    max_prompt_tokens: Any,
) -> list[ContextFile]:
    _check_str(prefix, "prefix")
    _check_str(suffix, "suffix")
    for value, what in ((repo_name, "repo_name"), (file_path, "file_path")):
        if value is not None:
            _check_str(value, what)
    if mode not in _MODES:
        msg = f"mode must be 'psm' (prefix, suffix, middle) or 'spm' (suffix, prefix, middle), not {mode!r}."
        raise InvalidParameterError(msg)
    if max_prompt_tokens is not None and (
        not isinstance(max_prompt_tokens, int) or isinstance(max_prompt_tokens, bool) or max_prompt_tokens < 1
    ):
        msg = f"max_prompt_tokens must be a positive integer or None, not {max_prompt_tokens!r}."
        raise InvalidParameterError(msg)
    return _check_files(context_files)


# --- building --------------------------------------------------------------------------------------


def build_fim_prompt(
    engine_or_tokenizer: Any,
    prefix: str,
    suffix: str = "",
    *,
    context_files: Sequence[ContextFile] = (),
    repo_name: str | None = None,
    file_path: str | None = None,
    mode: str = "psm",
    max_prompt_tokens: int | None = None,
) -> FIMPrompt:
    """Build the token ids of a FIM prompt within a token budget.

    Args:
        engine_or_tokenizer: A :class:`~langchain_starcoder.StarCoderEngine`, a transformers
            tokenizer, mlx-lm's ``TokenizerWrapper`` or a ``tokenizers.Tokenizer``.
        prefix: The code before the hole.
        suffix: The code after the hole.
        context_files: Other files of the repository, most relevant first. Any of them, a
            ``repo_name`` or a ``file_path`` selects StarCoder2's repository layout.
        repo_name: The repository's name (``<repo_name>``).
        file_path: The path of the file with the hole.
        mode: "psm" (prefix, suffix, middle) or "spm" (suffix, prefix, middle).
        max_prompt_tokens: The most tokens the prompt may have. Default: for an engine, its context
            window minus :data:`DEFAULT_MAX_TOKENS`; for a bare tokenizer, unbounded.

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
    files = _check_options(prefix, suffix, context_files, repo_name, file_path, mode, max_prompt_tokens)
    codec = _codec_for(engine_or_tokenizer)
    if max_prompt_tokens is None and codec.context_window is not None:
        max_prompt_tokens = max(1, codec.context_window - DEFAULT_MAX_TOKENS)
    return _build(codec, prefix, suffix, files, repo_name or None, file_path or None, mode, max_prompt_tokens)


def _build(
    codec: _Codec,
    prefix: str,
    suffix: str,
    files: list[ContextFile],
    repo_name: str | None,
    file_path: str | None,
    mode: str,
    limit: int | None,
) -> FIMPrompt:
    repo_level = bool(files or repo_name or file_path)
    needed = list(_FIM) + (["<file_sep>"] if repo_level else []) + (["<repo_name>"] if repo_name else [])
    ids = {token: _control_id(codec, token) for token in needed}
    missing = [token for token, i in ids.items() if i is None]
    if missing:
        layout = "the repository-level FIM layout" if repo_level else f"FIM ({mode.upper()})"
        msg = (
            f"This tokenizer has no {', '.join(missing)} token(s), which {layout} needs: the checkpoint "
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

    header = f"{file_path}\n" if file_path else ""
    repo_ids = encode(repo_name)[0] if repo_name else []
    header_ids = encode(header)[0]
    n_controls = len(_FIM) + (1 if repo_level else 0) + (1 if repo_name else 0)
    fixed = n_controls + len(repo_ids) + len(header_ids)
    if limit is not None and fixed > limit:
        msg = (
            f"max_prompt_tokens={limit} cannot hold this FIM layout's fixed parts ({fixed} tokens: "
            "control tokens, repo name and file path). Raise the budget or shorten the names."
        )
        raise ContextLengthError(msg)

    room = None if limit is None else limit - n_controls - len(repo_ids)  # for hole and files
    # Only the side of the prefix and suffix nearest the hole is encoded when that alone overflows.
    near_prefix, prefix_ids, prefix_offsets = _encode_window(encode, prefix, room, keep_end=True, pre=header)
    near_suffix, suffix_ids, suffix_offsets = _encode_window(encode, suffix, room, keep_end=False)
    prefix_kept, suffix_kept = len(prefix), len(suffix)
    if room is not None and len(prefix_ids) + len(suffix_ids) > room:
        hole = room - len(header_ids)
        p_tokens = len(prefix_ids) - len(header_ids)
        s_limit = max(hole - p_tokens, hole // 4)
        if len(suffix_ids) > s_limit:
            suffix_kept = _largest(
                len(near_suffix),
                lambda n: len(encode(near_suffix[:n])[0]) <= s_limit,
                _guess_start(suffix_offsets, len(near_suffix), len(suffix_ids), s_limit),
            )
            suffix_ids = encode(suffix[:suffix_kept])[0]
        p_limit = room - len(suffix_ids)  # what the suffix leaves, header included
        if len(prefix_ids) > p_limit:
            n_near = len(near_prefix)
            prefix_kept = _largest(
                n_near,
                lambda n: len(encode(header + near_prefix[n_near - n :])[0]) <= p_limit,
                _guess_end(prefix_offsets, len(header) + n_near, len(prefix_ids), p_limit - len(header_ids)),
            )
            prefix_ids = encode(header + prefix[len(prefix) - prefix_kept :])[0]

    left = None if room is None else room - len(prefix_ids) - len(suffix_ids)
    kept_files: list[tuple[ContextFile, list[int]]] = []
    for file in files:
        kept = _fit_file(encode, file, left)
        if kept is not None:
            kept_files.append(kept)
            if left is not None:
                left -= 1 + len(kept[1])

    parts: list[tuple[str, Any]] = []  # ("control", token) or ("data", (text, ids))
    if repo_name:
        parts += [("control", "<repo_name>"), ("data", (repo_name, repo_ids))]
    for file, file_ids in kept_files:
        head = f"{file.path}\n" if file.path else ""
        parts += [("control", "<file_sep>"), ("data", (head + file.text, file_ids))]
    if repo_level:
        parts.append(("control", "<file_sep>"))
    hole_prefix = ("data", (header + prefix[len(prefix) - prefix_kept :], prefix_ids))
    hole_suffix = ("data", (suffix[:suffix_kept], suffix_ids))
    if mode == "psm":
        parts += [("control", "<fim_prefix>"), hole_prefix, ("control", "<fim_suffix>"), hole_suffix]
        parts.append(("control", "<fim_middle>"))
    else:
        parts += [("control", "<fim_prefix>"), ("control", "<fim_suffix>"), hole_suffix]
        parts += [("control", "<fim_middle>"), hole_prefix]

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
    )


def _fit_file(
    encode: Callable[[str], Encoded], file: ContextFile, left: int | None
) -> tuple[ContextFile, list[int]] | None:
    """The file whole, or cut after its last line that fits in ``left`` tokens (with its
    ``<file_sep>``), with its ids; None if not even one line fits."""
    head = f"{file.path}\n" if file.path else ""
    if left is not None and left < 1:
        return None
    limit = None if left is None else left - 1  # its <file_sep> takes one
    text, ids, offsets = _encode_window(encode, file.text, limit, keep_end=False, pre=head)
    if limit is None or len(ids) <= limit:
        return file, ids
    ends = [i + 1 for i, ch in enumerate(text) if ch == "\n"]  # ends of whole lines
    if not text.endswith("\n"):
        ends.append(len(text))  # the unterminated last line (or the window's end): known not to fit
    if len(ends) < 2:
        return None
    guess_chars = _guess_start(offsets, len(head + text), len(ids), limit) - len(head)
    lines = _largest(
        len(ends),
        lambda k: k == 0 or 1 + len(encode(head + text[: ends[k - 1]])[0]) <= left,
        bisect.bisect_right(ends, guess_chars),
    )
    if lines == 0:
        return None
    cut = ContextFile(file.path, text[: ends[lines - 1]])
    return cut, encode(head + cut.text)[0]


#: Code averages 3 to 4 characters a token; a window of this many per token surely holds enough.
_WINDOW_CHARS_PER_TOKEN = 16


def _encode_window(
    encode: Callable[[str], Encoded], text: str, limit: int | None, *, keep_end: bool, pre: str = ""
) -> tuple[str, list[int], list[tuple[int, int]] | None]:
    """Encode ``pre + text``, or only ``pre`` and the end (``keep_end``) or start of ``text`` when
    that part alone has more than ``limit`` tokens: a long file costs no more than its budget.

    Returns the part of ``text`` encoded, its ids and offsets.
    """
    width = _WINDOW_CHARS_PER_TOKEN * ((limit or 0) + 4)
    if limit is not None and len(text) > width:
        part = text[len(text) - width :] if keep_end else text[:width]
        ids, offsets = encode(pre + part)
        if len(ids) > limit:
            return part, ids, offsets
    ids, offsets = encode(pre + text)
    return text, ids, offsets


def _guess_start(offsets: list[tuple[int, int]] | None, chars: int, tokens: int, budget: int) -> int:
    """About how many leading characters of a text fit ``budget`` tokens (from its encoding)."""
    if budget <= 0 or tokens == 0:
        return 0
    if budget >= tokens:
        return chars
    if offsets:
        return offsets[budget][0]  # where the first token that does not fit starts
    return chars * budget // tokens


def _guess_end(offsets: list[tuple[int, int]] | None, chars: int, tokens: int, budget: int) -> int:
    """About how many trailing characters of a text fit ``budget`` tokens."""
    if budget <= 0 or tokens == 0:
        return 0
    if budget >= tokens:
        return chars
    if offsets:
        return chars - offsets[tokens - budget - 1][1]  # after the last token that does not fit
    return chars * budget // tokens


def _largest(n: int, fits: Callable[[int], bool], guess: int) -> int:
    """The largest ``k`` in ``[0, n)`` with ``fits(k)``, given ``fits(0)`` and not ``fits(n)``.

    Token counts grow with the text, but not strictly (merges), so this searches near ``guess``:
    gallop away from it, then bisect. The answer always fits, and ``k + 1`` does not.
    """
    lo, hi = 0, n
    guess = min(max(guess, 0), n - 1)
    if guess > 0:
        if fits(guess):
            lo, step = guess, 1
            while lo + step < hi:
                if not fits(lo + step):
                    hi = lo + step
                    break
                lo, step = lo + step, step * 2
        else:
            hi, step = guess, 1
            while hi - step > lo:
                if fits(hi - step):
                    lo = hi - step
                    break
                hi, step = hi - step, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


# --- the middle's end ---------------------------------------------------------------------------

#: An overlap with the suffix this long (not counting whitespace) is trimmed wherever it starts.
MIN_OVERLAP_CHARS = 10


class SuffixOverlap:
    """Trims the end of a middle that repeats the start of the suffix, also while streaming.

    Models often write the middle and then carry on with the code that follows the hole, which is
    already in the suffix. The rule: take the longest end of the middle that equals a start of the
    suffix and holds some non-whitespace, and trim it when it is

    - at least :data:`MIN_OVERLAP_CHARS` characters, not counting whitespace, or
    - whole lines: it starts where a line of the middle starts (or at the middle's start) and ends
      where a line of the suffix ends (or at the suffix's end).

    Otherwise a shorter end that qualifies is tried. So ``")"`` after ``foo(bar()`` stays, while a
    repeated ``return total`` line goes. While streaming, the longest end of the text that is a
    start of the suffix is held back (it might grow into an overlap) and released as soon as the
    next text shows it is not one, or at the end, minus what is trimmed.
    """

    def __init__(self, suffix: str, *, min_chars: int = MIN_OVERLAP_CHARS):
        self.suffix = suffix
        self.min_chars = min_chars
        self._border = _borders(suffix)
        self._matched = 0  # the longest end of the middle so far that is a start of the suffix
        self._held = ""
        self._last = ""  # the last character already released

    def feed(self, text: str) -> str:
        """Take more middle; return the part that is safe to show."""
        if not self.suffix:
            return text
        for ch in text:  # Knuth-Morris-Pratt over the suffix
            k = self._matched
            if k == len(self.suffix):
                k = self._border[k]
            while k and self.suffix[k] != ch:
                k = self._border[k]
            self._matched = k + 1 if self.suffix[k] == ch else 0
        pending = self._held + text
        cut = len(pending) - self._matched
        out, self._held = pending[:cut], pending[cut:]
        if out:
            self._last = out[-1]
        return out

    def finish(self) -> str:
        """The held-back text, without the overlap (if it qualifies). Call once, at the end."""
        held, self._held = self._held, ""
        k = self._matched
        while k:
            before = held[-k - 1] if k < len(held) else self._last
            if self._qualifies(k, before):
                return held[: len(held) - k]
            k = self._border[k]
        return held

    def _qualifies(self, k: int, before: str) -> bool:
        overlap = self.suffix[:k]
        solid = sum(not ch.isspace() for ch in overlap)
        if solid == 0:
            return False
        if solid >= self.min_chars:
            return True
        whole_lines_end = overlap.endswith("\n") or k == len(self.suffix)
        return whole_lines_end and before in ("", "\n")


def _borders(pattern: str) -> list[int]:
    """``b[k]``: the length of the longest proper border of ``pattern[:k]`` (KMP failure function)."""
    border = [0] * (len(pattern) + 1)
    k = 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = border[k]
        if pattern[i] == pattern[k]:
            k += 1
        border[i + 1] = k
    return border


def trim_suffix_overlap(middle: str, suffix: str) -> str:
    """``middle`` without an end that repeats the start of ``suffix`` (see :class:`SuffixOverlap`)."""
    overlap = SuffixOverlap(suffix)
    return overlap.feed(middle) + overlap.finish()


# --- infill on an engine -------------------------------------------------------------------------


def _prepare(
    engine: StarCoderEngine,
    prefix: str,
    suffix: str,
    context_files: Sequence[ContextFile],
    repo_name: str | None,
    file_path: str | None,
    mode: str,
    max_prompt_tokens: int | None,
    trim: bool,
    generation: dict[str, Any],
) -> tuple[FIMPrompt, dict[str, Any]]:
    """Validate everything, then build the prompt and the generation settings (with FIM stops)."""
    from .engine import GenerationParams

    files = _check_options(prefix, suffix, context_files, repo_name, file_path, mode, max_prompt_tokens)
    if not isinstance(trim, bool):
        msg = f"trim_suffix_overlap must be True or False, not {trim!r}."
        raise InvalidParameterError(msg)
    params = GenerationParams.create(**generation)
    if max_prompt_tokens is None:
        max_prompt_tokens = engine.context_window - params.max_tokens
    elif max_prompt_tokens + params.max_tokens > engine.context_window:
        msg = (
            f"max_prompt_tokens={max_prompt_tokens} plus max_tokens={params.max_tokens} exceeds the "
            f"model's context window of {engine.context_window}. Lower one of them."
        )
        raise ContextLengthError(msg)
    codec = _codec_for(engine)
    prompt = _build(
        codec, prefix, suffix, files, repo_name or None, file_path or None, mode, max_prompt_tokens
    )
    settings = dict(generation)
    settings["stop_token_ids"] = sorted(set(params.stop_token_ids) | set(prompt.stop_token_ids))
    return prompt, settings


def infill(
    engine: StarCoderEngine,
    prefix: str,
    suffix: str = "",
    *,
    context_files: Sequence[ContextFile] = (),
    repo_name: str | None = None,
    file_path: str | None = None,
    mode: str = "psm",
    max_prompt_tokens: int | None = None,
    trim_suffix_overlap: bool = True,
    **generation: Any,
) -> Completion:
    """Generate the middle between ``prefix`` and ``suffix``: see ``StarCoderEngine.infill``."""
    prompt, settings = _prepare(
        engine, prefix, suffix, context_files, repo_name, file_path, mode, max_prompt_tokens,
        trim_suffix_overlap, generation,
    )  # fmt: skip
    completion = engine.generate(prompt.token_ids, **settings)
    return _trimmed(completion, suffix, trim_suffix_overlap)


async def ainfill(
    engine: StarCoderEngine,
    prefix: str,
    suffix: str = "",
    *,
    context_files: Sequence[ContextFile] = (),
    repo_name: str | None = None,
    file_path: str | None = None,
    mode: str = "psm",
    max_prompt_tokens: int | None = None,
    trim_suffix_overlap: bool = True,
    **generation: Any,
) -> Completion:
    """Async :func:`infill`. The prompt is built in a thread: long files take a while to encode."""
    prompt, settings = await asyncio.to_thread(
        _prepare, engine, prefix, suffix, context_files, repo_name, file_path, mode,
        max_prompt_tokens, trim_suffix_overlap, generation,
    )  # fmt: skip
    completion = await engine.agenerate(prompt.token_ids, **settings)
    return _trimmed(completion, suffix, trim_suffix_overlap)


def stream_infill(
    engine: StarCoderEngine,
    prefix: str,
    suffix: str = "",
    *,
    context_files: Sequence[ContextFile] = (),
    repo_name: str | None = None,
    file_path: str | None = None,
    mode: str = "psm",
    max_prompt_tokens: int | None = None,
    trim_suffix_overlap: bool = True,
    **generation: Any,
) -> Iterator[CompletionChunk]:
    """Stream the middle; text that may repeat the suffix is held back until it is settled."""
    prompt, settings = _prepare(
        engine, prefix, suffix, context_files, repo_name, file_path, mode, max_prompt_tokens,
        trim_suffix_overlap, generation,
    )  # fmt: skip
    chunks = engine.stream(prompt.token_ids, **settings)
    return _trim_stream(chunks, SuffixOverlap(suffix if trim_suffix_overlap else ""))


def astream_infill(
    engine: StarCoderEngine,
    prefix: str,
    suffix: str = "",
    *,
    context_files: Sequence[ContextFile] = (),
    repo_name: str | None = None,
    file_path: str | None = None,
    mode: str = "psm",
    max_prompt_tokens: int | None = None,
    trim_suffix_overlap: bool = True,
    **generation: Any,
) -> AsyncIterator[CompletionChunk]:
    """Async :func:`stream_infill` (call it inside a running event loop)."""
    prompt, settings = _prepare(
        engine, prefix, suffix, context_files, repo_name, file_path, mode, max_prompt_tokens,
        trim_suffix_overlap, generation,
    )  # fmt: skip
    chunks = engine.astream(prompt.token_ids, **settings)
    return _atrim_stream(chunks, SuffixOverlap(suffix if trim_suffix_overlap else ""))


def _trimmed(completion: Completion, suffix: str, trim: bool) -> Completion:
    if not trim:
        return completion
    return dataclasses.replace(completion, text=trim_suffix_overlap(completion.text, suffix))


def _pass_chunk(
    chunk: CompletionChunk, overlap: SuffixOverlap, ids: list[int]
) -> tuple[CompletionChunk | None, list[int]]:
    """The chunk to show for ``chunk`` (None while all its text is held), and the ids not yet shown."""
    from .engine import CompletionChunk

    ids = ids + list(chunk.token_ids)
    text = overlap.feed(chunk.text)
    if chunk.finish_reason is not None:
        return dataclasses.replace(chunk, text=text + overlap.finish(), token_ids=ids), []
    if not text:
        return None, ids
    return CompletionChunk(text, ids), []


def _trim_stream(chunks: Iterator[CompletionChunk], overlap: SuffixOverlap) -> Iterator[CompletionChunk]:
    ids: list[int] = []
    with contextlib.closing(chunks):  # leaving early cancels the generation
        for chunk in chunks:
            out, ids = _pass_chunk(chunk, overlap, ids)
            if out is not None:
                yield out


async def _atrim_stream(
    chunks: AsyncIterator[CompletionChunk], overlap: SuffixOverlap
) -> AsyncIterator[CompletionChunk]:
    ids: list[int] = []
    try:
        async for chunk in chunks:
            out, ids = _pass_chunk(chunk, overlap, ids)
            if out is not None:
                yield out
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "FIM_STOP_TOKENS",
    "MIN_OVERLAP_CHARS",
    "ContextFile",
    "FIMPrompt",
    "MissingFIMTokensError",
    "SuffixOverlap",
    "ainfill",
    "astream_infill",
    "build_fim_prompt",
    "fim_stop_token_ids",
    "infill",
    "stream_infill",
    "trim_suffix_overlap",
]
