"""The lines of a repository's files added since a git revision (code newer than a checkpoint's data)."""

from __future__ import annotations

import codecs
import re
import subprocess
from pathlib import Path

from ..errors import InvalidParameterError

_HUNK = re.compile(rb"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")
#: Seconds a git command may take (a diff of a big repository included).
GIT_TIMEOUT = 300


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(
            ["git", "-C", str(root), "-c", "core.quotepath=off", *args],
            capture_output=True,
            timeout=GIT_TIMEOUT,
            check=False,
        )
    except FileNotFoundError as exc:
        msg = "since= needs git, and no git command was found on PATH."
        raise InvalidParameterError(msg) from exc


def added_lines(root: Path, since: str) -> dict[str, set[int]]:
    """Per file (relative to ``root``, ``/``-separated), the 0-based lines that the working tree has and
    revision ``since`` had not: lines ``git diff since`` adds, and every line of untracked files that
    are not ignored. Raises InvalidParameterError for a folder outside git or an unknown revision."""
    if not isinstance(since, str) or not since.strip():
        msg = f"since must be a git revision (a commit, tag or branch), not {since!r}."
        raise InvalidParameterError(msg)
    inside = _git(root, "rev-parse", "--is-inside-work-tree")
    if inside.returncode != 0 or inside.stdout.strip() != b"true":
        msg = f"since={since!r} needs a git work tree; {str(root)!r} is not in one."
        raise InvalidParameterError(msg)
    found = _git(root, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{since}^{{commit}}")
    if found.returncode != 0:
        msg = (
            f"since={since!r} is not a revision of the git repository at {str(root)!r} "
            "(give a commit, tag or branch it has: git log --oneline)."
        )
        raise InvalidParameterError(msg)
    commit = found.stdout.decode().strip()
    diff = _git(
        root,
        *("diff", "--no-color", "--no-ext-diff", "--no-textconv", "-U0", "--relative"),
        *("--src-prefix=a/", "--dst-prefix=b/", commit, "--"),
    )
    if diff.returncode != 0:
        msg = f"git diff {commit} failed in {str(root)!r}: {diff.stderr.decode(errors='replace').strip()}"
        raise InvalidParameterError(msg)
    added = _parse_diff(diff.stdout)
    others = _git(root, "ls-files", "--others", "--exclude-standard", "-z")
    for path in others.stdout.split(b"\0") if others.returncode == 0 else ():
        if path:
            added[path.decode("utf-8", "replace")] = _ALL
    return added


class _AllLines(set[int]):
    """Every line (an untracked file's)."""

    def __contains__(self, row: object) -> bool:
        return True


_ALL = _AllLines()


def _parse_diff(out: bytes) -> dict[str, set[int]]:
    added: dict[str, set[int]] = {}
    rows: set[int] | None = None
    for line in out.split(b"\n"):
        if line.startswith(b"+++ "):
            name = line[4:]
            rows = None if name == b"/dev/null" else added.setdefault(_path(name), set())
        elif line.startswith(b"@@") and rows is not None:
            hunk = _HUNK.match(line)
            if hunk:
                first, count = int(hunk[1]), int(hunk[2] or 1)
                rows.update(range(first - 1, first - 1 + count))
    return added


def _path(name: bytes) -> str:
    """The path of a ``+++ b/path`` line (quoted, C-style, when it has odd characters)."""
    name = name.rstrip(b"\t")
    if name.startswith(b'"') and name.endswith(b'"'):
        name = codecs.escape_decode(name[1:-1])[0]  # type: ignore[attr-defined]
    return name.removeprefix(b"b/").decode("utf-8", "replace")
