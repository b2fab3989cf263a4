"""Editing sessions from a repository's git history, and the editor that types them (the typing benchmark).

A session is one commit's block of added lines typed into the file at its place: the file as the commit
left it, less that block, is what the editor opens; the block is typed back. Keystrokes come every 60 ms
(indentation comes with the newline, as editors indent), with a 400 ms pause after each line and, with
probability 0.3 (a seeded generator), after a word. 250 ms into a pause the editor asks for a completion
with llama.vim's fields (``autoload/llama.vim``, ``llama#fim``): the lines before the cursor's line as
``input_prefix``, the cursor's line up to the cursor as ``prompt``, the rest of that line and the lines
after it as ``input_suffix``, and its ring buffer of chunks from other files as ``input_extra``.
"""

from __future__ import annotations

import random
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Seconds between keystrokes, a pause after a line or a word, and the request into a pause.
KEYSTROKE = 0.060
PAUSE = 0.400
REQUEST_AFTER = 0.250
#: The chance of a pause after a word.
WORD_PAUSE = 0.3

_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_WORD_END = re.compile(r"\w")


@dataclass(frozen=True)
class EditorSettings:
    """What the editor sends: llama.vim's fields, its context sizes in lines (llama.vim's defaults are
    256 lines before the cursor, 64 after, 16 ring chunks of 32 lines; a replay on a CPU scales them)."""

    n_prefix: int = 256
    n_suffix: int = 64
    ring_chunks: int = 16
    chunk_lines: int = 32
    n_predict: int = 128


@dataclass(frozen=True)
class Session:
    """A file opened with the cursor at ``len(before)``: ``typed`` is typed there, before ``after``."""

    name: str
    path: str
    before: str
    typed: str
    after: str
    ring: tuple[tuple[str, str], ...]
    """The editor's ring buffer: (file name, chunk text) from other files of the repository."""


@dataclass(frozen=True)
class Pause:
    """A request's moment: ``at`` seconds after the session opened, with ``typed`` characters typed."""

    at: float
    typed: int


def _git(git_dir: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], capture_output=True, check=True, timeout=120
    ).stdout
    return out.decode("utf-8", errors="replace")


def git_dir_of(path: Path) -> Path:
    """The git directory of a checkout (``path/.git``) or of a bare repository or mirror (``path``)."""
    return path / ".git" if (path / ".git").exists() else path


def sessions_from_git(
    repo: Path,
    count: int,
    seed: int,
    *,
    max_lines: int = 6,
    min_chars: int = 0,
    min_lines: int = 40,
    ring: int = 2,
    chunk_lines: int = 16,
    commits: int = 400,
) -> list[Session]:
    """``count`` sessions from ``repo``'s last ``commits`` commits that change Python files: in each, a
    block of 1 to ``max_lines`` added lines (not blank, not only comments) of a file of at least
    ``min_lines`` lines, typed in at least ``min_chars`` characters; ``ring`` chunks of ``chunk_lines``
    lines from other Python files of that commit."""
    git_dir = git_dir_of(repo)
    rng = random.Random(seed)
    hashes = _git(git_dir, "log", "--no-merges", "--format=%H", f"-n{commits}", "--", "*.py").split()
    rng.shuffle(hashes)
    sessions: list[Session] = []
    for commit in hashes:
        if len(sessions) >= count:
            break
        session = _session_of(git_dir, commit, rng, max_lines, min_lines, ring, chunk_lines)
        if session is not None and len(session.typed.strip()) >= min_chars:
            sessions.append(session)
    if not sessions:
        msg = f"No commit of {repo} adds a block of at most {max_lines} lines to a Python file to replay."
        raise ValueError(msg)
    return sessions


def _session_of(
    git_dir: Path,
    commit: str,
    rng: random.Random,
    max_lines: int,
    min_lines: int,
    ring: int,
    chunk_lines: int,
) -> Session | None:
    diff = _git(
        git_dir, "show", "--format=", "--unified=0", "--no-color", "--diff-filter=M", commit, "--", "*.py"
    )
    blocks = list(_added_blocks(diff, max_lines))
    rng.shuffle(blocks)
    for path, start, length in blocks:
        lines = _git(git_dir, "show", f"{commit}:{path}").splitlines(keepends=True)
        block = lines[start - 1 : start - 1 + length]
        code = [line for line in block if line.strip() and not line.lstrip().startswith("#")]
        if len(lines) < min_lines or not code or not block[-1].endswith("\n"):
            continue
        others = [
            p for p in _git(git_dir, "ls-tree", "-r", "--name-only", commit).split() if p.endswith(".py")
        ]
        chunks = []
        for other in rng.sample([p for p in others if p != path], min(ring, len(others) - 1)):
            text = _git(git_dir, "show", f"{commit}:{other}").splitlines(keepends=True)
            first = rng.randrange(max(1, len(text) - chunk_lines))
            chunks.append((other, "".join(text[first : first + chunk_lines])))
        return Session(
            name=f"{commit[:10]}:{path}:{start}",
            path=path,
            before="".join(lines[: start - 1]),
            typed="".join(block),
            after="".join(lines[start - 1 + length :]),
            ring=tuple(chunks),
        )
    return None


def _added_blocks(diff: str, max_lines: int) -> Iterator[tuple[str, int, int]]:
    """(path, first line in the new file, lines) of each hunk that only adds 1 to ``max_lines`` lines."""
    path = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else None
            continue
        hunk = _HUNK.match(line)
        if hunk is None or path is None:
            continue
        removed = int(hunk.group(1) or "1")
        start, added = int(hunk.group(2)), int(hunk.group(3) or "1")
        if removed == 0 and 1 <= added <= max_lines:
            yield path, start, added


# --- the editor ------------------------------------------------------------------------------------------


def keystrokes(typed: str, seed: int, *, start: float = 1.0) -> tuple[list[Pause], list[Pause]]:
    """The moments the editor asks for a completion while ``typed`` is typed from ``start`` seconds on,
    and every keystroke (its time, the characters typed after it). Indentation after a newline comes
    with it (no keystrokes)."""
    rng = random.Random(seed)
    t, requests, keys = start, [], []
    i = 0
    while i < len(typed):
        char = typed[i]
        t += KEYSTROKE
        i += 1
        if char == "\n":
            while i < len(typed) and typed[i] in " \t":  # auto-indent
                i += 1
        keys.append(Pause(t, i))
        if char == "\n" or (_word_ends(typed, i) and rng.random() < WORD_PAUSE):
            requests.append(Pause(t + REQUEST_AFTER, i))
            t += PAUSE
    return requests, keys


def _word_ends(typed: str, i: int) -> bool:
    """Whether the ``i``-th character typed ends a word (a word character not followed by one)."""
    return bool(_WORD_END.match(typed[i - 1])) and (i == len(typed) or not _WORD_END.match(typed[i]))


def llama_vim_body(session: Session, typed: int, settings: EditorSettings, *, warm_up: bool = False) -> dict:
    """llama.vim's /infill request with ``typed`` characters of the session typed (``llama#fim``), or its
    warm-up (``n_predict`` 0: what llama.vscode sends to prepare the next position). ``stream`` is on, so
    that the benchmark sees the first token of the middle (llama.vim reads the answer whole)."""
    lines_before = (session.before + session.typed[:typed]).split("\n")
    cursor_line_start = lines_before[-1]
    lines_after = ("\n" + session.after).split("\n")  # the user typed into a line of its own
    prefix_lines = lines_before[:-1][-settings.n_prefix :]
    body: dict[str, Any] = {
        "id_slot": 0,
        "input_prefix": "\n".join(prefix_lines) + "\n" if prefix_lines else "",
        "input_suffix": lines_after[0] + "\n" + "\n".join(lines_after[1 : 1 + settings.n_suffix]) + "\n",
        "input_extra": ring_extra(session, settings),
        "prompt": cursor_line_start,
        "n_predict": 0 if warm_up else settings.n_predict,
        "n_indent": len(cursor_line_start) - len(cursor_line_start.lstrip()),
        "top_k": 40,
        "top_p": 0.90,
        # Greedy on our server. llama-server samples with llama.vim's samplers (no temperature step) at any
        # temperature: its answers differ, the work per token is the same.
        "temperature": 0.0,
        "samplers": [] if warm_up else ["top_k", "top_p", "infill"],
        "stream": True,
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        # llama.vim's 250 ms cut (after a newline) is left out: n_predict bounds every answer, and an
        # answer cut by time reports no cache counts on our server.
        "t_max_predict_ms": 1 if warm_up else 0,
    }
    return body


def ring_warm_up(session: Session, settings: EditorSettings) -> dict:
    """llama.vim's ring-buffer update (``s:ring_update``): its chunks alone, nothing to generate."""
    return {
        "id_slot": 0,
        "input_prefix": "",
        "input_suffix": "",
        "input_extra": ring_extra(session, settings),
        "prompt": "",
        "n_predict": 0,
        "temperature": 0.0,
        "samplers": [],
        "stream": True,
        "cache_prompt": True,
        "t_max_prompt_ms": 1,
        "t_max_predict_ms": 1,
    }


def ring_extra(session: Session, settings: EditorSettings) -> list[dict[str, Any]]:
    return [{"text": text, "time": [0, i], "filename": name} for i, (name, text) in enumerate(session.ring)][
        -settings.ring_chunks :
    ]


def toy_repository(folder: Path) -> Path:
    """A small git repository of two commits (the second adds lines to a Python file): sessions for a
    replay in seconds, and for the tests. Made once: a folder that has it already is used as it is."""
    if (folder / ".git").is_dir():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    base = "".join(
        f"def helper_{i}(items, limit={i}):\n    return [x for x in items if x < limit]\n\n"
        for i in range(24)
    )
    other = "".join(f"VALUE_{i} = {i} * 2\n" for i in range(40))
    env = ["-c", "user.name=bench", "-c", "user.email=bench@example.com", "-c", "commit.gpgsign=false"]

    def git(*args: str) -> None:
        subprocess.run(["git", *env, *args], cwd=folder, check=True, capture_output=True, timeout=60)

    git("init", "-q")
    (folder / "app.py").write_text(base)
    (folder / "values.py").write_text(other)
    git("add", ".")
    git("commit", "-q", "-m", "first")
    lines = base.splitlines(keepends=True)
    added = ["def total(items):\n", "    return sum(items)\n"]
    (folder / "app.py").write_text("".join(lines[:30] + added + lines[30:]))
    git("commit", "-q", "-am", "second")
    return folder
