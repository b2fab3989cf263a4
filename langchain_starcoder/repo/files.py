"""Which files of a folder a repository index holds, and noticing when they change.

A scan walks the folder once; :meth:`FileTree.refresh` then costs one ``stat`` per known file and folder:
a folder whose mtime moved is listed again (files added or deleted), a file whose mtime or size moved is
read again. Skipped: what ``.gitignore`` files (nested ones too) and ``.git/info/exclude`` ignore,
vendored and build folders, symlinked folders (no loops), lock files and generated code, files over
``max_file_bytes``, binary and non-UTF-8 files, anything that is not a regular file or cannot be read.
Files are read with :func:`read_beneath`, never by a path that links could lead out of the root.
"""

from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidParameterError
from .gitignore import IgnoreFile, read_ignore_file

#: Folders never indexed: version control, dependencies, caches and build output.
SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "node_modules",
        "bower_components",
        ".venv",
        "venv",
        "__pycache__",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".ipynb_checkpoints",
        "build",
        "dist",
        "site-packages",
        "vendor",
        "_vendor",
        "third_party",
        ".next",
        ".cache",
        "target",
        ".idea",
    }
)
#: File names and endings of lock files, generated code and binaries (checked before reading).
SKIPPED_NAMES = frozenset(
    {
        "package-lock.json",
        "yarn.lock",
        "pnpm-lock.yaml",
        "poetry.lock",
        "Cargo.lock",
        "uv.lock",
        "Pipfile.lock",
        "composer.lock",
        "Gemfile.lock",
        "go.sum",
        "npm-shrinkwrap.json",
    }
)
SKIPPED_ENDINGS = (
    "_pb2.py",
    "_pb2_grpc.py",
    "_pb2.pyi",
    ".pb.go",
    ".min.js",
    ".min.css",
    ".map",
    ".lock",
    ".pyc",
    ".so",
    ".dll",
    ".dylib",
    ".o",
    ".a",
    ".class",
    ".jar",
    ".whl",
    ".zip",
    ".gz",
    ".tgz",
    ".bz2",
    ".xz",
    ".7z",
    ".png",
    ".jpg",
    ".jpeg",
    ".gif",
    ".bmp",
    ".ico",
    ".webp",
    ".pdf",
    ".mp3",
    ".mp4",
    ".wav",
    ".ttf",
    ".woff",
    ".woff2",
    ".eot",
    ".bin",
    ".safetensors",
    ".gguf",
    ".npy",
    ".npz",
    ".pkl",
    ".db",
    ".sqlite",
    ".parquet",
    ".onnx",
    ".pt",
    ".pth",
    ".exe",
    ".svg",
    ".ipynb",
)
#: A line this long means minified or generated text, not code written by hand.
MAX_LINE_CHARS = 2000
#: Symbolic links followed from one name before giving up (the kernel's own limit is 40).
MAX_LINK_HOPS = 40
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW  # a FIFO swapped in cannot block


@dataclass
class _Dir:
    mtime_ns: int
    ignores: tuple[tuple[str, IgnoreFile], ...]
    """The ignore files that apply here, root first: (the folder they sit in, their rules)."""
    files: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class FileVersion:
    mtime_ns: int
    size: int


def read_text(path: Path, max_bytes: int) -> str | None:
    """The file's text, or None if it is not a regular UTF-8 text file of at most ``max_bytes``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO swapped in after the stat cannot block
    except OSError:
        return None
    return _text(fd, max_bytes)


def read_beneath(root: str, rel: str, max_bytes: int) -> str | None:
    """The text of ``rel`` (``/``-separated) below the folder ``root``, as :func:`read_text` reads a file,
    or None if it is not a file beneath ``root`` (see :func:`open_beneath`)."""
    fd = open_beneath(root, rel)
    return None if fd is None else _text(fd, max_bytes)


def open_beneath(root: str, rel: str) -> int | None:
    """A read-only descriptor of the file ``rel`` below ``root``, opened one name at a time from the root
    without following links: a symlinked folder on the way is refused, and a symlinked file is followed
    only to a target beneath ``root``. None otherwise. So what a scan saw as a file of the repository
    cannot read outside it later, whatever was swapped in since (POSIX: ``dir_fd`` and ``O_NOFOLLOW``)."""
    for _ in range(MAX_LINK_HOPS):
        *folders, name = rel.split("/")
        try:
            at = os.open(root, _FOLDER_FLAGS)
        except OSError:
            return None
        try:
            for folder in folders:
                inner = os.open(folder, _FOLDER_FLAGS, dir_fd=at)
                os.close(at)
                at = inner
            try:
                return os.open(name, _FILE_FLAGS, dir_fd=at)
            except OSError:
                target = os.readlink(name, dir_fd=at)  # not a link either: unreadable, None below
        except OSError:
            return None
        finally:
            os.close(at)
        found = _link_target(root, rel, target)
        if found is None:
            return None
        rel = found
    return None


def _link_target(root: str, rel: str, target: str) -> str | None:
    """The path below ``root`` that a link at ``rel`` names, or None if it leaves ``root``. The link's
    ``..`` is taken by name: no folder on the way may be a link, so the name is where it leads."""
    if target.startswith("/"):
        if not target.startswith(root.rstrip("/") + "/"):
            return None
        target = target[len(root.rstrip("/")) + 1 :]
    else:
        target = posixpath.join(posixpath.dirname(rel), target)
    target = posixpath.normpath(target)
    if target in (".", "..") or target.startswith(("../", "/")):
        return None
    return target


def _text(fd: int, max_bytes: int) -> str | None:
    """What :func:`read_text` says of an open file (the descriptor is closed)."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > max_bytes or b"\0" in data[:8192]:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(len(line) > MAX_LINE_CHARS for line in text.split("\n")):  # lines as the parser counts them
        return None
    return text


def _skipped_name(name: str) -> bool:
    return name in SKIPPED_NAMES or name.endswith(SKIPPED_ENDINGS)


class FileTree:
    """The files of ``root`` worth indexing, with their versions; :meth:`refresh` reports changes."""

    def __init__(self, root: Path, *, max_file_bytes: int, max_files: int, max_total_bytes: int) -> None:
        self.root = root
        self._root = str(root)
        self.max_file_bytes = max_file_bytes
        self.max_files = max_files
        self.max_total_bytes = max_total_bytes
        self._bytes = 0
        """The size of the files held (a file that would pass ``max_total_bytes`` is left out)."""
        self.files: dict[str, FileVersion] = {}
        self._dirs: dict[str, _Dir] = {}
        self._exclude = self._exclude_file()

    def scan(self) -> None:
        """Walk the whole folder."""
        self.files.clear()
        self._dirs.clear()
        self._bytes = 0
        self._walk("", self._exclude)

    def refresh(self) -> bool:
        """Stat what is known, list again the folders that changed; whether any file changed."""
        moved = False
        for rel, version in list(self.files.items()):
            now = self._version(rel)
            if now is None or now.size > self.max_file_bytes:
                self._bytes -= self.files.pop(rel).size
                self._dirs.get(_parent(rel), _Dir(0, ())).files.discard(rel)
                moved = True
            elif now != version:
                self._bytes += now.size - version.size
                self.files[rel] = now
                moved = True
                if Path(rel).name == ".gitignore":  # its folder is walked again with the new rules
                    self._dirs.get(_parent(rel), _Dir(0, ())).mtime_ns = -1
        for rel in list(self._dirs):
            state = self._dirs.get(rel)
            if state is None:
                continue  # dropped with a parent in this loop
            try:
                mtime = os.lstat(self._abs(rel)).st_mtime_ns  # a folder swapped for a link has moved
            except OSError:
                mtime = None
            if mtime == state.mtime_ns:
                continue
            # Walk this folder again: what is new is added, what is gone dropped (subfolders included).
            inherited = state.ignores[: self._inherited(rel, state)]
            self._drop_dir(rel)
            if mtime is not None:
                self._walk(rel, inherited)
            parent = self._dirs.get(_parent(rel)) if rel else None
            if parent is not None and rel not in self._dirs:
                parent.dirs.discard(rel)
            moved = True
        return moved

    # --- walking ---------------------------------------------------------------------------------

    def _walk(self, top: str, inherited: tuple[tuple[str, IgnoreFile], ...]) -> None:
        """List ``top`` and the folders below it, depth first, each folder's files before its subfolders'
        (the order in which the caps fill), with a stack of its own: any depth fits."""
        pending = [(top, inherited)]
        while pending:
            rel, inherited = pending.pop()
            state = self._list(rel, inherited)
            if state is not None:
                pending.extend((child, state.ignores) for child in sorted(state.dirs, reverse=True))

    def _list(self, rel: str, inherited: tuple[tuple[str, IgnoreFile], ...]) -> _Dir | None:
        """Hold the files of one folder; its state (its subfolders in ``dirs``), None if it is no folder."""
        path = self._abs(rel)
        try:
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode):
                return None  # a folder swapped for a link (or a file) since it was listed
            mtime = info.st_mtime_ns
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError:
            return None
        ignores = inherited
        own = (  # read as git reads it; one it cannot read ignores everything here (fail closed)
            read_ignore_file(os.path.join(path, ".gitignore"), f"{rel}/.gitignore" if rel else ".gitignore")
            if any(e.name == ".gitignore" for e in entries)
            else None
        )
        if own is not None:
            ignores = (*inherited, (rel, own))
        state = _Dir(mtime, ignores)
        self._dirs[rel] = state
        for entry in entries:
            child = f"{rel}/{entry.name}" if rel else entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                if entry.is_symlink():
                    if os.path.isdir(entry.path):
                        continue  # a symlinked folder may loop or leave the repository
                    if not _inside(self.root, entry.path):
                        continue
            except OSError:
                continue
            if _ignored(ignores, child, is_dir):
                continue
            if is_dir:
                if entry.name not in SKIPPED_DIRS:
                    state.dirs.add(child)
                continue
            if _skipped_name(entry.name) or len(self.files) >= self.max_files:
                continue
            version = self._version(child)
            if version is None or version.size > self.max_file_bytes:
                continue
            if self._bytes + version.size > self.max_total_bytes:
                continue
            self._bytes += version.size
            self.files[child] = version
            state.files.add(child)
        return state

    def _drop_dir(self, rel: str) -> None:
        """Forget a folder and everything below it."""
        pending = [rel]
        while pending:
            state = self._dirs.pop(pending.pop(), None)
            if state is not None:
                for rel_file in state.files:
                    version = self.files.pop(rel_file, None)
                    self._bytes -= version.size if version is not None else 0
                pending.extend(state.dirs)

    def _inherited(self, rel: str, state: _Dir) -> int:
        """How many of a folder's ignore files it inherited (its own .gitignore is read again)."""
        return len(state.ignores) - (1 if state.ignores and state.ignores[-1][0] == rel else 0)

    def _version(self, rel: str) -> FileVersion | None:
        try:
            info = os.stat(self._abs(rel))
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode):
            return None
        return FileVersion(info.st_mtime_ns, info.st_size)

    def _abs(self, rel: str) -> str:
        return os.path.join(self._root, rel) if rel else self._root

    def _exclude_file(self) -> tuple[tuple[str, IgnoreFile], ...]:
        path = os.path.join(self._root, ".git", "info", "exclude")
        exclude = read_ignore_file(path, ".git/info/exclude", follow_symlinks=True)
        return (("", exclude),) if exclude is not None else ()


def _parent(rel: str) -> str:
    return rel.rpartition("/")[0]


def _inside(root: Path, path: str) -> bool:
    try:
        return Path(os.path.realpath(path)).is_relative_to(root)
    except OSError:
        return False


def _ignored(ignores: tuple[tuple[str, IgnoreFile], ...], rel: str, is_dir: bool) -> bool:
    result = False
    for base, rules in ignores:  # deeper ignore files override shallower ones
        relative = rel[len(base) + 1 :] if base else rel
        verdict = rules.match(relative, is_dir)
        if verdict is not None:
            result = verdict
    return result


def relative_path(root: Path, file_path: str | os.PathLike[str]) -> str:
    """``file_path`` relative to the resolved folder ``root``, ``/``-separated ("" for none): an
    absolute path must lie inside the root, and a relative one may not climb out of it."""
    path = Path(file_path)
    if path.is_absolute():
        try:
            path = path.resolve().relative_to(root)
        except ValueError:
            msg = (
                f"file_path {str(file_path)!r} is outside the repository {str(root)!r}: give the file's "
                "path relative to the repository root, or an absolute path inside it."
            )
            raise InvalidParameterError(msg) from None
    rel = posixpath.normpath(path.as_posix())
    if rel == ".." or rel.startswith("../"):
        msg = (
            f"file_path {str(file_path)!r} climbs out of the repository {str(root)!r}: give the file's "
            "path relative to the repository root (e.g. 'pkg/module.py')."
        )
        raise InvalidParameterError(msg)
    return "" if rel == "." else rel
