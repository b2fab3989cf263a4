"""Cache folders private to their user (the prompt cache's, the converted GGUF files'): made 0700 and their
files 0600 whatever the umask, and used only while no other user can have written what is in them.

A kept cache decides what the model answers, and a prompt cache's token ids print the prompts' source. So a
folder that another user owns, or that its group or others can write, is not used at all; a file in it counts
only when it is a regular file of this user (or root) that group and others cannot write. Each check is
made on what was opened (the folder's descriptor, then the file's), and names are opened against the
checked folder's descriptor without following links: nothing swapped in after a check is trusted.
POSIX only, as MLX is (macOS, Linux).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# A link is refused (ELOOP) and a FIFO does not block the open (it is then refused as no regular file).
_NO_LINKS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class NotPrivateError(Exception):
    """A folder or file that someone other than this user (or root) could have written."""


def check_private(st: os.stat_result, what: str) -> None:
    """Raise NotPrivateError unless ``st`` (of ``what``) is owned by this user or root and neither
    its group nor others can write it."""
    if st.st_uid not in (os.geteuid(), 0):  # root can write anything anyway
        msg = f"{what} is owned by another user (uid {st.st_uid})"
        raise NotPrivateError(msg)
    loose = st.st_mode & 0o022
    if loose:
        who = {0o020: "its group", 0o002: "others"}.get(loose, "its group and others")
        msg = f"{what} can be written by {who} (mode {stat.S_IMODE(st.st_mode):o})"
        raise NotPrivateError(msg)


def make_private(path: Path) -> None:
    """Make ``path`` and the parents it lacks, each 0700 whatever the umask, and check each one
    made (or made meanwhile by someone else) before going beneath it. Raises OSError when one
    cannot be made, NotPrivateError when one is not private."""
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
            made = True
        except FileExistsError:  # made meanwhile by another thread or process: checked all the same
            made = False
        fd = os.open(folder, _DIRECTORY | os.O_NOFOLLOW)
        try:
            if made:
                os.fchmod(fd, 0o700)  # a umask such as 0o277 takes bits from mkdir's mode
            check_private(os.fstat(fd), f"The folder {folder}")
        finally:
            os.close(fd)


class Folder:
    """The cache folder at ``path``, opened and checked (NotPrivateError, which names it as
    ``what``, if it is not private): names in it are opened against this descriptor, never through
    the path again."""

    def __init__(self, path: Path, what: str = "The prompt-cache folder"):
        self.path = path
        self.fd = os.open(path, _DIRECTORY)
        try:
            check_private(os.fstat(self.fd), f"{what} {path}")
        except BaseException:
            os.close(self.fd)
            raise

    @classmethod
    def made(cls, path: Path, what: str = "The prompt-cache folder") -> Folder:
        """The folder at ``path``, made private first if it is missing (:func:`make_private`), and
        checked as found: one made by another user, or loosened since, is refused all the same."""
        make_private(path)
        return cls(path, what)

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def entries(self) -> list[os.DirEntry[str]]:
        with os.scandir(self.fd) as entries:
            return list(entries)

    def open(self, name: str) -> BinaryIO:
        """The file ``name``, for reading, if it is a regular file that only its owner (this user or
        root) can write; one of ours that group or others can read (an older version wrote 0644) is
        made 0600 first."""
        try:
            fd = os.open(name, os.O_RDONLY | _NO_LINKS, dir_fd=self.fd)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            msg = "it is a symbolic link"
            raise NotPrivateError(msg) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                msg = "it is not a regular file"
                raise NotPrivateError(msg)
            check_private(st, "it")
            if st.st_mode & 0o077 and st.st_uid == os.geteuid():
                os.fchmod(fd, 0o600)
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    @contextlib.contextmanager
    def replacing(self, name: str) -> Iterator[BinaryIO]:
        """A new file (0600) that replaces ``name`` atomically once written and flushed to disk, so a
        reader sees the whole file or none; removed if writing it fails."""
        temp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        f = os.fdopen(
            os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_LINKS, 0o600, dir_fd=self.fd), "wb"
        )
        try:
            with f:
                os.fchmod(f.fileno(), 0o600)  # whatever the umask took
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                self.remove(temp)
            raise

    def remove(self, name: str) -> None:
        os.unlink(name, dir_fd=self.fd)

    def stat(self, name: str) -> os.stat_result:
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The folder's lock file (``.lock``), held: one process at a time counts and evicts."""
        fd = os.open(".lock", os.O_RDWR | os.O_CREAT | _NO_LINKS, 0o600, dir_fd=self.fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
