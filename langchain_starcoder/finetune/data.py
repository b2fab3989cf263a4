"""Training examples from a repository, in the layout StarCoder2 was trained on, with FIM, as
``(tokens, offset)`` pairs that mlx-lm's trainer takes (its loss covers the tokens from ``offset`` on).

What we follow:

- StarCoder2 (Lozhkov et al. 2024, "StarCoder 2 and The Stack v2: The Next Generation",
  arXiv:2402.19173, section 5, repository context): a repository is one document,
  ``<repo_name>NAME<file_sep>PATH\\nCODE<file_sep>PATH\\nCODE...<|endoftext|>``, its files in random
  order; FIM at a rate of 0.5, a FIM'd file of a repository document reading
  ``<file_sep><fim_prefix>PATH\\nPREFIX<fim_suffix>SUFFIX<fim_middle>MIDDLE``.
- FIM as Bavarian et al. 2022 ("Efficient Training of Language Models to Fill in the Middle",
  arXiv:2207.14255) define it and StarCoder and StarCoder2 used it: the text is cut at two character
  positions drawn uniformly (a character-level split, so a middle may start or end inside a token),
  and prefix, middle and suffix are tokenized apart. PSM, and SPM in the form bigcode's Megatron-LM
  writes (``<fim_prefix><fim_suffix>SUFFIX<fim_middle>PREFIX MIDDLE``: the prefix runs on into the
  middle), which is what our ``fim/`` layouts send for ``mode="spm"``. ``fim_rate`` of the examples
  get FIM (StarCoder2: 0.5), ``spm_rate`` of those SPM (Bavarian et al. recommend training PSM and
  SPM jointly; 0.5 mixes them evenly).
- StarCoder (v1) vocabularies (``<filename>``, no ``<file_sep>``) get StarCoder's layout, each file a
  document of its own with its metadata first, as ``fim/layout.py`` describes.

Where we differ, and why:

- One example per file (a long file: per piece, see below): that file comes last, after other files
  of the same set as repository context (whole files, in random order, as many as ``max_tokens``
  holds). A FIM example is then the prompt an editor sends, built by the same function
  (:func:`~langchain_starcoder.fim.build.build`), followed by the middle and ``<|endoftext|>``; the
  loss covers only those (``offset``). StarCoder2 puts the FIM'd file anywhere and trains on every
  token; here the model learns to infill the way it is asked to.
- The end token after a middle is ``<|endoftext|>``, the document's end (the FIM'd file is its last);
  in StarCoder2 a middle inside a repository is followed by the next ``<file_sep>``. Both stop an infill.
- Metadata (repository name, paths) is always written; StarCoder2 drops it from half its documents.
  Our prompts always carry it.
- A file longer than ``max_tokens`` allows is cut at line ends into pieces, each an example of its own
  with the path at its head (as a prompt whose prefix was cut has), and FIM cuts a piece, not the
  whole file (close to what Bavarian et al. call context-level FIM: FIM after chunking). Pretraining
  packs documents into fixed-length sequences across their ends instead.
"""

from __future__ import annotations

import bisect
import os
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, overload

from .._tokens import Codec, codec_for
from ..errors import InvalidParameterError
from ..fim.build import EngineLike, build
from ..fim.layout import MissingFIMTokensError, control_id, file_frame
from ..fim.request import ContextFile, FIMRequest
from ..repo.files import read_beneath
from ..types import check_text, is_int, is_real
from .split import MAX_FILE_BYTES

#: The fewest tokens an example may be cut to.
MIN_TOKENS = 32
#: Control tokens an example has besides its text, at most (FIM, repository name, end), plus room for
#: the tokens a cut between prefix, middle and suffix may add.
_RESERVED = 9
#: Context files in a row that do not fit before an example stops looking for more.
_MISSES = 32
_FIM = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
_END = "<|endoftext|>"


@dataclass(frozen=True)
class _File:
    path: str
    text: str
    ids: list[int]
    """The ids of ``{path}\\n{text}``, as a context file's frame holds them."""


class RepoDataset(Sequence[tuple[list[int], int]]):
    """Training examples of a repository: ``dataset[i]`` is ``(tokens, offset)`` as mlx-lm's trainer
    takes them (``iterate_batches``: the loss is on the tokens from ``offset`` on), ``len()`` counts
    them. Pass it to mlx-lm's ``train``/``evaluate`` as it is (not wrapped in ``CacheDataset``, which
    measures an item's length as that of the pair). Note: mlx-lm's ``default_loss`` also counts the
    first padding position after an example (its mask is ``steps <= length``)."""

    def __init__(self, examples: list[tuple[array[int], int]], kinds: list[str], paths: list[str]) -> None:
        self._examples = examples
        self.kinds: tuple[str, ...] = tuple(kinds)
        """Per example: "plain" (loss on all of it), "psm" or "spm" (loss on the middle and end)."""
        self.paths: tuple[str, ...] = tuple(paths)
        """Per example: the file it is made from (its last, the one with the hole if any)."""

    def __len__(self) -> int:
        return len(self._examples)

    @overload
    def __getitem__(self, i: int) -> tuple[list[int], int]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[list[int], int]]: ...
    def __getitem__(self, i: int | slice) -> tuple[list[int], int] | list[tuple[list[int], int]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        tokens, offset = self._examples[i]
        return tokens.tolist(), offset

    @property
    def n_tokens(self) -> int:
        """The tokens of all examples."""
        return sum(len(tokens) for tokens, _ in self._examples)

    @property
    def n_loss_tokens(self) -> int:
        """The tokens the loss covers (those predicted: an example's first token never is)."""
        return sum(len(tokens) - max(offset, 1) for tokens, offset in self._examples)


def build_dataset(
    repo: str | os.PathLike[str],
    files: Sequence[str],
    tokenizer: Any,
    *,
    fim_rate: float = 0.5,
    spm_rate: float = 0.5,
    max_tokens: int = 2048,
    seed: int = 0,
    context: Sequence[str] | None = None,
    repo_name: str | None = None,
) -> RepoDataset:
    """The training examples of ``files`` (paths relative to ``repo``, e.g. a :class:`FileSplit`'s
    ``train`` or ``held_out``), at most ``max_tokens`` each (see the module's docstring).

    Args:
        tokenizer: An mlx-lm ``TokenizerWrapper`` (a ``StarCoderEngine``'s), a transformers tokenizer,
            or an engine.
        fim_rate: The share of examples with FIM, drawn per example.
        spm_rate: The share of FIM examples in SPM (the rest PSM).
        seed: The same seed, files and tokenizer give the same examples.
        context: The files the examples take repository context from (default: ``files``), so that
            training examples never hold a held-out file's text. A file is never its own context.
        repo_name: The name written after ``<repo_name>`` (default: the folder's name; "" for none).

    Raises:
        InvalidParameterError: A bad value, or a file that is not a text file of ``repo``.
        MissingFIMTokensError: The vocabulary lacks the repository or FIM tokens.
    """
    _check(files, fim_rate, spm_rate, max_tokens, seed)
    if repo_name is not None:
        check_text(repo_name, "repo_name")
    if isinstance(tokenizer, EngineLike):
        tokenizer = tokenizer.tokenizer
    codec = codec_for(tokenizer)
    root = Path(repo).expanduser().resolve()
    name = root.name if repo_name is None else repo_name
    layout = _layout(codec, fim_rate, name)
    pool = [_read(codec, root, rel) for rel in (files if context is None else context)]
    read = {file.path: file for file in pool}
    builder = _Builder(codec, layout, name, max_tokens, pool, seed)
    examples: list[tuple[array[int], int]] = []
    kinds: list[str] = []
    paths: list[str] = []
    for rel in files:
        target = read[rel] if rel in read else _read(codec, root, rel)
        for k, piece in enumerate(builder.pieces(target)):
            rng = random.Random(f"{seed}\0{rel}\0{k}")
            kind = ("spm" if rng.random() < spm_rate else "psm") if rng.random() < fim_rate else "plain"
            tokens, offset = builder.example(rel, piece, kind, rng)
            examples.append((array("i", tokens), offset))
            kinds.append(kind)
            paths.append(rel)
    return RepoDataset(examples, kinds, paths)


def _check(files: Sequence[str], fim_rate: float, spm_rate: float, max_tokens: int, seed: int) -> None:
    if isinstance(files, str) or not isinstance(files, Sequence) or not files:
        msg = "files must be a non-empty list of paths relative to the repository (FileSplit.train)."
        raise InvalidParameterError(msg)
    for what, rate in (("fim_rate", fim_rate), ("spm_rate", spm_rate)):
        if not is_real(rate) or not 0 <= rate <= 1:
            msg = f"{what} must be a share between 0 and 1 (e.g. 0.5), not {rate!r}."
            raise InvalidParameterError(msg)
    if not is_int(max_tokens) or max_tokens < MIN_TOKENS:
        msg = f"max_tokens must be an integer of at least {MIN_TOKENS} (e.g. 2048), not {max_tokens!r}."
        raise InvalidParameterError(msg)
    if not is_int(seed):
        msg = f"seed must be an integer, not {seed!r}."
        raise InvalidParameterError(msg)


def _layout(codec: Codec, fim_rate: float, name: str) -> str:
    """StarCoder2's repository layout, or StarCoder's (v1) where the vocabulary has only its tokens."""
    layout = "starcoder2" if codec.token_id("<file_sep>") is not None else "starcoder"
    needed = ["<file_sep>", "<repo_name>"] if layout == "starcoder2" else ["<filename>", "<reponame>"]
    needed = [*needed[: 1 + bool(name)], _END]
    needed += list(_FIM) if fim_rate > 0 else []
    missing = [token for token in needed if control_id(codec, token) is None]
    if missing:
        msg = (
            f"This tokenizer has no {', '.join(missing)} token(s), which StarCoder2's repository training "
            "layout needs: fine-tune a StarCoder2 (or StarCoder) checkpoint"
            + (", or set fim_rate=0." if set(missing) <= set(_FIM) else ".")
        )
        raise MissingFIMTokensError(msg)
    return layout


def _read(codec: Codec, root: Path, rel: str) -> _File:
    text = read_beneath(str(root), rel, MAX_FILE_BYTES) if isinstance(rel, str) else None
    if text is None:
        msg = (
            f"{rel!r} is not a text file of {str(root)!r} (or has changed since the split): give paths "
            "relative to the repository, as split_files lists them, and split again after edits."
        )
        raise InvalidParameterError(msg)
    return _File(rel, text, codec.encode_data(f"{rel}\n{text}"))


class _Builder:
    """Lays out the examples of one dataset: its layout, the context pool and the token budget."""

    def __init__(self, codec: Codec, layout: str, name: str, max_tokens: int, pool: list[_File], seed: int):
        self.codec, self.layout, self.name, self.max_tokens = codec, layout, name, max_tokens
        self.name_ids = codec.encode_data(name) if name else []
        self.pool = pool
        random.Random(f"{seed}\0context").shuffle(self.pool)  # the context order (a random start in it)
        self.min_cost = min((self._cost(f) for f in pool), default=0)
        self.end = self._id(_END)

    def _id(self, token: str) -> int:
        token_id = control_id(self.codec, token)
        assert token_id is not None  # checked by _layout
        return token_id

    def _cost(self, file: _File) -> int:
        """A context file's tokens with its frame."""
        return (
            len(file.ids)
            + file_frame(self.layout, ContextFile(file.path, ""), self.name or None, len(self.name_ids))[1]
        )

    def pieces(self, file: _File) -> list[str]:
        """The file's text whole, or cut at line ends into pieces that fit an example with their path."""
        limit = self.max_tokens - len(self.name_ids) - _RESERVED
        head = f"{file.path}\n"
        if len(self.codec.encode_data(head)) >= limit:
            msg = (
                f"max_tokens={self.max_tokens} leaves no room for the code of {file.path!r} after its path "
                "and the repository name: raise max_tokens."
            )
            raise InvalidParameterError(msg)
        if len(file.ids) <= limit:
            return [file.text]
        text, h = file.text, len(head)
        _, offsets = self.codec.encode(head + text)
        if offsets is None:  # a tokenizer without offsets: halve until each piece fits
            return self._halves(head, text, limit)
        starts = [start for start, _ in offsets]
        room = max(1, limit - len(self.codec.encode_data(head)) - 2)  # a cut may add a token at either end
        pieces: list[str] = []
        at = 0
        while at < len(text):  # as much as fits, cut after its last line end, checked by encoding
            stop = bisect.bisect_left(starts, h + at) + room  # the first token that does not fit
            end = len(text) if stop >= len(starts) else max(starts[stop] - h, at + 1)
            if end < len(text):
                end = text.rfind("\n", at, end) + 1 or end  # none: cut inside the line
            pieces += self._halves(head, text[at:end], limit)
            at = end
        return pieces

    def _halves(self, head: str, text: str, limit: int) -> list[str]:
        """``text`` whole if it fits with ``head`` in ``limit`` tokens, else halved at line ends until
        each piece does."""
        pieces, pending = [], [text]
        while pending:
            text = pending.pop()
            if len(text) <= 1 or len(self.codec.encode_data(head + text)) <= limit:
                pieces.append(text)
            else:
                cut = _cut(text)
                pending += [text[cut:], text[:cut]]
        return pieces

    def example(self, path: str, piece: str, kind: str, rng: random.Random) -> tuple[list[int], int]:
        """One example: repository context, then the piece plain, or FIM'd with its middle last."""
        start = rng.randrange(len(self.pool)) if self.pool else 0
        if kind == "plain":
            target = self.codec.encode_data(f"{path}\n{piece}")
            room = self.max_tokens - len(self._plain([], path, target))
            return self._plain(self._context(path, room, start), path, target), 0
        a, b = sorted(rng.randint(0, len(piece)) for _ in range(2))  # Bavarian et al.: two uniform cuts
        prefix, middle, suffix = piece[:a], piece[a:b], piece[b:]
        tail = [*self.codec.encode_data(middle), self.end]
        request = FIMRequest(
            prefix,
            suffix,
            repo_name=self.name or None,
            file_path=path,
            mode=kind,
            max_prompt_tokens=self.max_tokens - len(tail),
        )
        bare = build(self.codec, request)
        files = self._context(path, self.max_tokens - len(bare.token_ids) - len(tail), start)
        prompt = build(self.codec, _with_files(request, files)).token_ids
        return prompt + tail, len(prompt)

    def _context(self, path: str, room: int, start: int) -> list[_File]:
        """Whole files of the pool for ``room`` tokens, from ``start`` on in the pool's random order."""
        picked: list[_File] = []
        misses = 0
        n = len(self.pool)
        for i in range(n):
            if room < self.min_cost or misses >= _MISSES:
                break
            file = self.pool[(start + i) % n]
            cost = self._cost(file)
            if file.path == path or cost > room:
                misses += 1
                continue
            picked.append(file)
            room -= cost
            misses = 0
        return picked

    def _plain(self, files: list[_File], path: str, target: list[int]) -> list[int]:
        """A plain document: the context files, then the target's ``{path}\\n{code}`` ids, then the end."""
        tokens: list[int] = []
        if self.layout == "starcoder2":
            tokens += [self._id("<repo_name>"), *self.name_ids] if self.name else []
            for ids in [*(f.ids for f in files), target]:
                tokens += [self._id("<file_sep>"), *ids]
            return [*tokens, self.end]
        for ids in [*(f.ids for f in files), target]:  # StarCoder (v1): a document per file
            tokens += [self._id("<reponame>"), *self.name_ids] if self.name else []
            tokens += [self._id("<filename>"), *ids, self.end]
        return tokens


def _with_files(request: FIMRequest, files: list[_File]) -> FIMRequest:
    return replace(request, context_files=tuple(ContextFile(f.path, f.text) for f in files))


def _cut(text: str) -> int:
    """Where to halve ``text``: after the line end nearest its middle, or at the middle if none."""
    mid = len(text) // 2
    before, after = text.rfind("\n", 0, mid), text.find("\n", mid, len(text) - 1)
    ends = [i + 1 for i in (before, after) if i >= 0]
    return min(ends, key=lambda e: abs(e - mid)) if ends else mid
