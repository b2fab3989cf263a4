"""Writing folders and files so that nothing is ever half-written or destroyed: a staging folder that becomes
the destination only when complete (and whose leftovers from a killed run the next run removes), checks that
refuse a destination whose writing could destroy anything, and files filled in place with a backup."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

from ..errors import StarCoderError

#: Written into every folder this package creates (quantize, build-test-model). ``force`` replaces only
#: folders that hold it, so a mistyped destination (a project, a home folder) is never deleted.
MARKER = "langchain-starcoder.json"
_WRITTEN_BY = "langchain-starcoder"


class DestinationError(StarCoderError):
    """A write was refused before anything changed: it could destroy something, or could not finish."""


def to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def written_by_us(folder: Path) -> bool:
    """Whether ``folder`` holds the marker this package writes into the folders it creates."""
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("written_by") == _WRITTEN_BY


def _protected_paths(src: Path) -> list[Path]:
    """``src`` and, through symlinks, the files it is made of (a hub snapshot links into blobs/)."""
    paths = [src.resolve()]
    with contextlib.suppress(OSError):
        paths += [f.resolve() for f in src.iterdir()]
    return paths


def check_destination(dst: Path, force: bool, source: Path | None = None) -> None:
    """Refuse a destination whose writing could destroy anything: a file or link, the ``source``
    checkpoint, a folder that contains it or lies inside it, or (even with ``force``) any non-empty
    folder that is not a checkpoint this package wrote."""
    if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
        msg = f"{dst} exists and is not a folder; choose another destination."
        raise DestinationError(msg)
    real = dst.resolve()
    if source is not None:
        src = source.resolve()
        for path in _protected_paths(source):
            if real == path or real in path.parents:
                msg = f"{dst} is or contains the source checkpoint {src}; choose a folder outside it."
                raise DestinationError(msg)
        if src in real.parents:
            msg = f"{dst} is inside the source checkpoint {src}; choose a folder outside it."
            raise DestinationError(msg)
    if dst.is_dir() and any(dst.iterdir()):
        if not force:
            msg = f"{dst} already exists; pass --force to replace it (if it is a checkpoint written here)."
            raise DestinationError(msg)
        if not written_by_us(dst):
            msg = (
                f"{dst} is not a checkpoint written by langchain-starcoder (it has no {MARKER}), so "
                "--force will not replace it; remove it yourself or choose another destination."
            )
            raise DestinationError(msg)


#: Inside a staging folder while its writer lives, locked by it: a folder whose lock nobody holds is the
#: leftover of a run that was killed (out of memory, SIGKILL), and the next run removes it.
_STAGING_LOCK = "langchain-starcoder.partial"


def _claim(tmp: Path) -> int:
    """Lock ``tmp`` as this process's staging folder; the lock lives as long as the returned descriptor
    (or the process: the kernel drops it even on SIGKILL). The file appears under its name already locked,
    so another run never sees it unlocked."""
    pending = tmp / f"{_STAGING_LOCK}.new"
    fd = os.open(pending, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"written_by": _WRITTEN_BY, "pid": os.getpid()}).encode())
    os.rename(pending, tmp / _STAGING_LOCK)
    return fd


def _abandoned(folder: Path) -> bool:
    """Whether ``folder`` is a staging folder of this package whose writer is gone. Folders without the
    lock file (another program's, or an older version's) are never taken for one."""
    try:
        fd = os.open(folder / _STAGING_LOCK, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False  # its writer is still at work
    try:
        return json.loads(os.read(fd, 4096) or b"{}").get("written_by") == _WRITTEN_BY
    except (ValueError, AttributeError):
        return False
    finally:
        os.close(fd)


def _remove_abandoned(dst: Path) -> None:
    """Delete what killed runs writing ``dst`` left beside it; name, but keep, lookalikes that are not
    provably abandoned builds of ours."""
    pattern = re.compile(rf"\.{re.escape(dst.name)}\.[0-9a-f]{{8}}\.partial")
    for folder in sorted(dst.parent.iterdir()):
        if not (pattern.fullmatch(folder.name) and folder.is_dir() and not folder.is_symlink()):
            continue
        if _abandoned(folder):
            shutil.rmtree(folder, ignore_errors=True)
            to_stderr(f"Removed {folder}, left by an earlier run that did not finish.")
        elif not (folder / _STAGING_LOCK).exists():
            to_stderr(
                f"Left {folder} alone (no lock file: not a run of this version); delete it if it is stale."
            )


@contextlib.contextmanager
def staged_folder(dst: Path, force: bool, *, source: Path | None = None, command: str) -> Iterator[Path]:
    """Yield a temporary folder beside ``dst``; on success it gets the marker and becomes ``dst``, on
    any failure (Ctrl-C included) it is deleted, so a half-written ``dst`` never exists. Staging folders
    of earlier runs for ``dst`` that were killed before they could clean up are removed first."""
    check_destination(dst, force, source)
    given, dst = dst, dst.resolve()  # "." or "a/.." have no usable name or parent; links were checked
    dst.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkdtemp: its folders are private (0700), and this one becomes dst.
    tmp = dst.parent / f".{dst.name}.{uuid.uuid4().hex[:8]}.partial"
    tmp.mkdir()
    lock = _claim(tmp)
    try:
        _remove_abandoned(dst)
        yield tmp
        (tmp / _STAGING_LOCK).unlink()  # still held through ``lock`` until the end
        marker = {"written_by": _WRITTEN_BY, "command": command}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        check_destination(given, force, source)  # someone may have written dst meanwhile
        old = None
        if dst.exists():
            old = dst.parent / f".{dst.name}.{uuid.uuid4().hex[:8]}.old"
            os.rename(dst, old)
        try:
            os.rename(tmp, dst)
        except BaseException:
            if old is not None:
                os.rename(old, dst)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        os.close(lock)


# --- filling a file in place -----------------------------------------------------------------------


def _writable(path: Path) -> bool:
    """We may write ``path`` and it is not marked read-only. root passes every access check, but a file
    or folder without any write permission bit was made read-only on purpose, so it is refused for all."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return bool(mode & 0o222) and os.access(path, os.W_OK)


def check_in_place(path: Path) -> tuple[Path, Path]:
    """(the file to write, its backup) for :func:`write_in_place`, checked before any work is done: a
    symlink is written through to its target, which must be writable, and so must its folder (the new
    text is written beside it, then renamed) and an existing ``.bak``."""
    target = path.resolve()
    backup = target.with_name(target.name + ".bak")
    what = f"{path} (a link to {target})" if path.is_symlink() else str(path)
    if not _writable(target):
        msg = f"{what} is read-only; make it writable (chmod u+w) or leave out --write to print the middle."
        raise DestinationError(msg)
    folder = target.parent
    if not (_writable(folder) and os.access(folder, os.X_OK)):
        msg = f"Cannot write in the folder {folder} (read-only); make it writable or leave out --write."
        raise DestinationError(msg)
    if backup.is_symlink() or (backup.exists() and not (backup.is_file() and _writable(backup))):
        msg = f"The backup {backup} exists and cannot be replaced; move it away or leave out --write."
        raise DestinationError(msg)
    return target, backup


def write_in_place(target: Path, backup: Path, text: str) -> None:
    """Copy ``target`` to ``backup``, then replace its contents with ``text`` atomically (written
    beside it and renamed, so it is never half-written), keeping its mode and owner."""
    shutil.copy2(target, backup)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8", newline="") as f:
            f.write(text)
        shutil.copymode(target, tmp)
        st = target.stat()
        with contextlib.suppress(OSError):  # root keeps the owner; others may not change it
            os.chown(tmp, st.st_uid, st.st_gid)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
