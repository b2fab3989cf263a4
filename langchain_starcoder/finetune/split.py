"""Which files of a repository a fine-tune trains on and which it holds out, by whole file.

The code files are the ones a :class:`~langchain_starcoder.RepoIndex` would hold (its walk:
``.gitignore``, vendored and build folders, lock, generated, binary, non-UTF-8 and huge files left
out), less empty ones. Held out at random (``held_out``), or, with ``since=REV``, the files with code
added after a git revision.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidParameterError
from ..repo.files import FileTree, read_beneath
from ..types import is_int, is_real

# The walk's limits are RepoIndex's defaults: the files it would index are the files we train on.
MAX_FILE_BYTES = 1_000_000
MAX_FILES = 100_000
MAX_TOTAL_BYTES = 256_000_000


class TooLittleCodeError(InvalidParameterError):
    """A repository has too little code to hold any of it out (or to train on what is left)."""


@dataclass(frozen=True)
class FileSplit:
    """A repository's code files, split by file into those trained on and those held out."""

    root: str
    """The repository folder (resolved)."""
    train: tuple[str, ...]
    """The files trained on, relative to ``root`` (``/``-separated), sorted."""
    held_out: tuple[str, ...]
    """The files held out (never in a training document), sorted."""
    since: str | None = None
    """The git revision the split was made at (held out: files with code added after it), or None."""
    seed: int = 0
    """The seed of a random split."""


def code_files(repo: str | os.PathLike[str]) -> tuple[str, list[str]]:
    """The resolved folder and its code files (relative, sorted): what a repository index would hold,
    less files with nothing but whitespace."""
    root = Path(repo).expanduser()
    if not root.is_dir():
        msg = f"Fine-tuning needs a repository folder; {str(repo)!r} is not a folder."
        raise InvalidParameterError(msg)
    root = root.resolve()
    tree = FileTree(root, max_file_bytes=MAX_FILE_BYTES, max_files=MAX_FILES, max_total_bytes=MAX_TOTAL_BYTES)
    tree.scan()
    files = []
    for rel in sorted(tree.files):
        text = read_beneath(str(root), rel, MAX_FILE_BYTES)
        if text is not None and text.strip():
            files.append(rel)
    return str(root), files


def split_files(
    repo: str | os.PathLike[str], *, held_out: float = 0.1, since: str | None = None, seed: int = 0
) -> FileSplit:
    """Split the code files of ``repo`` into train and held-out files, by whole file.

    Without ``since``: a ``held_out`` fraction of the files (at least one, and at least one left to
    train on), picked by a hash of ``seed`` and each path, so a seed always gives the same split and
    adding a file moves no other file across.

    With ``since=REV`` (a commit, tag or branch): held out are the files with code added after REV,
    lines that ``git diff REV`` adds (uncommitted edits included) and untracked files; ``held_out`` is
    not used. A file only partly new is held out whole: training on its old part would put the text
    around the new code, the very context an evaluation of it gives, into training. A file whose
    only changes since REV are deletions or a rename holds no new code, and is trained on.

    Raises:
        TooLittleCodeError: Fewer than two code files, or (with ``since``) none or all of them new.
        InvalidParameterError: ``repo`` is no folder, ``held_out`` is not in (0, 1), or ``since`` is
            not a revision of a git repository that holds ``repo``.
    """
    if not is_real(held_out) or not 0 < held_out < 1:
        msg = f"held_out must be the share of files to hold out, in (0, 1) (e.g. 0.1), not {held_out!r}."
        raise InvalidParameterError(msg)
    if not is_int(seed):
        msg = f"seed must be an integer, not {seed!r}."
        raise InvalidParameterError(msg)
    root, files = code_files(repo)
    if len(files) < 2:
        msg = (
            f"{root!r} has {len(files)} code file(s) (after .gitignore and the binary, generated and size "
            "rules); fine-tuning holds out whole files to measure on, so it needs at least 2. Point it at "
            "a repository with more code."
        )
        raise TooLittleCodeError(msg)
    if since is not None:
        return _split_since(root, files, since, seed)
    order = sorted(files, key=lambda rel: hashlib.sha256(f"{seed}\0{rel}".encode()).digest())
    n = min(max(1, round(held_out * len(files))), len(files) - 1)
    held = set(order[:n])
    return FileSplit(root, tuple(f for f in files if f not in held), tuple(sorted(held)), None, seed)


def _split_since(root: str, files: list[str], since: str, seed: int) -> FileSplit:
    from ..evaluation._git import added_lines  # git's view of what is new (evaluation's since= too)

    added = added_lines(Path(root), since)
    # An untracked file's set of lines answers every ``in`` (it is new throughout) but is empty.
    held = {f for f in files if f in added and (added[f] or 0 in added[f])}
    if not held:
        msg = (
            f"No code file of {root!r} has code added after {since!r}, so nothing is held out. Give an "
            "earlier revision (git log --oneline), or leave out since= to hold out files at random."
        )
        raise TooLittleCodeError(msg)
    if len(held) == len(files):
        msg = (
            f"Every code file of {root!r} has code added after {since!r}, so nothing is left to train on. "
            "Give a later revision, or leave out since= to hold out files at random."
        )
        raise TooLittleCodeError(msg)
    train = tuple(f for f in files if f not in held)
    return FileSplit(root, train, tuple(sorted(held)), since, seed)
