"""What the commands write and how they fail: generated text to stdout, everything else to stderr."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import StarCoderError

PROG = "langchain-starcoder"


class CommandError(StarCoderError):
    """A command-line mistake found by the command itself (a missing marker, an existing folder...)."""


def _out(text: str) -> None:
    """Write generated text to stdout as it arrives."""
    sys.stdout.write(text)
    sys.stdout.flush()


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _stats(chunk: Any) -> str:
    """One line of prompt/generation speed from a final chunk (or a Completion). A prompt the prompt
    cache served in part says what was prefilled and how long it took: a rate of its few new tokens
    ("777 cached, 1.2 tokens/s") read as a slow prompt."""
    prompt, cached = chunk.prompt_tokens or 0, chunk.cached_tokens or 0
    prompt_s, gen_s = chunk.prompt_seconds, chunk.generation_seconds or 0.0
    prefilled = prompt - cached
    if not prompt_s:
        prompt_note = f", {cached} cached, speed unknown" if cached else ", speed unknown"
    elif cached:
        plural = "" if prefilled == 1 else "s"
        prompt_note = f", {cached} cached; prefill {prefilled} token{plural} in {prompt_s:.2f} s"
    else:
        prompt_note = f", {prefilled / prompt_s:.1f} tokens/s"
    gen_tps = (chunk.completion_tokens or 0) / gen_s if gen_s > 0 else 0.0
    drafts = chunk.draft_tokens or 0
    draft_note = f", {chunk.accepted_draft_tokens or 0} of {drafts} drafted tokens accepted" if drafts else ""
    return (
        f"[{chunk.finish_reason}] prompt: {prompt} tokens{prompt_note} | "
        f"generation: {chunk.completion_tokens} tokens, {gen_tps:.1f} tokens/s{draft_note}"
    )


@contextlib.contextmanager
def _notes() -> Iterator[None]:
    """Notices of the library (GGUF defaults, memory costs, skipped prompt-cache files, a big model on
    the CPU) as one ``note:`` line each on stderr."""
    from ..backends.prompt_cache import PromptCacheNotice
    from ..engine.building import SlowOnCPUNotice
    from ..gguf_format import GGUFNotice

    notices = (GGUFNotice, PromptCacheNotice, SlowOnCPUNotice)
    with warnings.catch_warnings(record=True) as caught:
        for notice in notices:
            warnings.simplefilter("always", notice)
        try:
            yield
        finally:
            for w in caught:
                if issubclass(w.category, notices):
                    _err(f"{PROG}: note: {w.message}")
                else:
                    warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _read_text(path: Path, what: str) -> str:
    """A UTF-8 text file, line endings kept as they are."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except UnicodeDecodeError as e:
        msg = f"The {what} {path} is not UTF-8 text ({e.reason} at byte {e.start})."
        raise CommandError(msg) from e
    except OSError as e:  # missing, a folder, not readable...
        msg = f"Cannot read the {what} {path}: {e.strerror or e}."
        raise CommandError(msg) from e


def _stream(engine: Any, chunks: Iterator[Any], echo: bool) -> str:
    """Consume ``chunks`` (closing the engine after), echoing the text to stdout as it arrives if asked;
    the speeds go to stderr. Returns the whole text."""
    pieces: list[str] = []
    last = None
    try:
        for chunk in chunks:
            if chunk.text:
                pieces.append(chunk.text)
                if echo:
                    _out(chunk.text)
            last = chunk
    finally:
        chunks.close()  # type: ignore[attr-defined]  # Ctrl-C: stop the generation, also mid-prefill
        engine.close()
    apart = ""
    if echo and pieces and not pieces[-1].endswith("\n"):
        if sys.stdout.isatty():
            _out("\n")  # keep the shell prompt and the speeds off the last line of code
        elif _stderr_shows_stdout():
            apart = "\n"  # on stderr: stdout stays exactly the generated text
    if last is not None:
        _err(apart + _stats(last))
    return "".join(pieces)


def _stderr_shows_stdout() -> bool:
    """Whether what reads stderr also shows stdout: one pipe or file for both (``2>&1``, an IDE's console,
    a CI log), or stdout piped on (``| tee``, ``| less``) to the terminal stderr writes to."""
    try:
        out, err = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):  # streams that are not files (captured, notebooks)
        return False
    return os.path.samestat(out, err) or (stat.S_ISFIFO(out.st_mode) and sys.stderr.isatty())


def _quiet_broken_pipe() -> None:
    """stdout's reader went away (``| head``): stop writing to it without a second error at exit."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
