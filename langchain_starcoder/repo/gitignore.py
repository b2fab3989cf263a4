"""The subset of git's ignore rules a repository scan needs: patterns, ``!`` negation, ``/`` anchors,
``dir/`` directory-only patterns, ``*``, ``?``, ``[...]`` and ``**``; one matcher per ignore file."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class _Rule:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


def _translate(pattern: str) -> str:
    """A gitignore glob as a regex over a ``/``-separated path relative to the ignore file's folder."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == n:
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                out.append(re.escape(c))
                i += 1
            else:
                body = pattern[i + 1 : end].replace("\\", "\\\\")
                out.append("[^" + body[1:] + "]" if body[:1] in "!^" and body else "[" + body + "]")
                i = end + 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


class IgnoreFile:
    """The rules of one ``.gitignore`` (or ``.git/info/exclude``), for paths below its folder."""

    def __init__(self, text: str) -> None:
        self.rules: list[_Rule] = []
        for raw in text.splitlines():
            line = raw.rstrip()
            if raw.endswith("\\ "):  # an escaped trailing space is kept
                line = raw[:-2] + " "
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            line = line[1:] if negate else line
            line = line[1:] if line.startswith("\\") and line[1:2] in "#!" else line
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            if not line:
                continue
            anchored = "/" in line  # a slash anywhere but the end anchors it to this folder
            body = _translate(line.lstrip("/"))
            regex = ("" if anchored else "(?:.*/)?") + body
            self.rules.append(_Rule(re.compile(regex + r"\Z", re.DOTALL), negate, dir_only))

    def match(self, relative: str, is_dir: bool) -> bool | None:
        """True if ignored, False if re-included by a ``!`` rule, None if no rule speaks of it."""
        result = None
        for rule in self.rules:
            if rule.dir_only and not is_dir:
                continue
            if rule.regex.match(relative):
                result = not rule.negate
        return result
