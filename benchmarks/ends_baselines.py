"""What others end a middle with, ported to return how many characters of a middle they keep.

- today's ends: this package before issue 31, the suffix-overlap trim (``langchain_starcoder.fim.overlap``);
  its stop tokens are FIM control tokens, which a middle of plain code never holds.
- Tabby's indentation scope: ``limitScopeByIndentation`` of tabby-agent (TabbyML/tabby at
  0cf44f7f9140bfec24fd7e7618e16c4179734966,
  ``clients/tabby-agent/src/postprocess/limitScopeByIndentation.ts``, with its default
  ``keepBlockScopeWhenCompletingLine: false``).
- Continue's bracket matching: ``BracketMatchingService.stopOnUnmatchedClosingBracket`` (continuedev/continue,
  ``core/autocomplete/filtering/BracketMatchingService.ts`` at 11fa0e26449c87ac2829b911e885961d49990701),
  with no completion before it (a fresh editor session), multiline for a hole on an empty line.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from langchain_starcoder.fim.overlap import trim_suffix_overlap

_LINES = re.compile(r".*(?:$|\r?\n)")
_BRACKETS = {"(": ")", "{": "}", "[": "]"}
_REVERSE = {v: k for k, v in _BRACKETS.items()}


def today(prefix: str, suffix: str, text: str, language: str) -> int:
    return len(trim_suffix_overlap(text, suffix))


def _split_lines(text: str) -> list[str]:
    """Tabby's ``splitLines``: lines with their line endings."""
    return [line for line in _LINES.findall(text) if line]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _blank(line: str) -> bool:
    return not line.strip()


def tabby(prefix: str, suffix: str, text: str, language: str) -> int:
    """tabby-agent's ``limitScopeByIndentation`` (mode "default": the measure's holes have nothing after
    the cursor on its line)."""
    lines, prefix_lines, suffix_lines = _split_lines(text), _split_lines(prefix), _split_lines(suffix)
    if not lines or not prefix_lines:
        return len(text)
    limit, allow_closing = _tabby_context(lines, prefix_lines, suffix_lines)
    index = 1
    while index < len(lines):
        line = lines[index]
        if not _blank(line) and _indent(line) < limit:
            if index < len(lines) - 1 and _indent(line) < _indent(lines[index + 1]):
                index += 1  # `} else {`: it opens a new block at once
                continue
            if allow_closing(line) and (language != "python" or not _blank(lines[index - 1])):
                index += 1
            break
        index += 1
    if index < len(lines):
        return len("".join(lines[:index]).rstrip())
    return len(text)


def _tabby_context(
    lines: list[str], prefix_lines: list[str], suffix_lines: list[str]
) -> tuple[int, Callable[[str], bool]]:
    """The indentation limit and whether a closing line may stay (tabby-agent's ``processContext``)."""
    current_prefix = prefix_lines[-1]
    prefix_blank = _blank(current_prefix)
    ref = len(prefix_lines) - 1
    while ref >= 0 and _blank(prefix_lines[ref]):
        ref -= 1
    if ref < 0:
        return 0, lambda line: False
    ref_prefix_indent = _indent(prefix_lines[ref])
    completion_blank = _blank(lines[0])
    ref_completion = 0
    while ref_completion < len(lines) and _blank(lines[ref_completion]):
        ref_completion += 1
    if ref_completion >= len(lines):
        return 0, lambda line: False
    if completion_blank:
        ref_completion_indent = _indent(lines[ref_completion])
    else:
        ref_completion_indent = _indent(current_prefix + lines[ref_completion])
    if not completion_blank and not prefix_blank:
        limit = ref_prefix_indent + 1
        allow = len(lines) > 1 and _indent(lines[1]) > ref_prefix_indent
    elif ref_completion_indent > ref_prefix_indent:
        limit, allow = ref_prefix_indent + 1, True
    else:
        limit, allow = ref_prefix_indent, True
    first = 1
    while first < len(suffix_lines) and _blank(suffix_lines[first]):
        first += 1
    if first >= len(suffix_lines):
        return limit, lambda line: allow
    suffix_line = suffix_lines[first]
    allow = allow and _indent(suffix_line) < limit

    def allow_closing(line: str) -> bool:
        duplicated = line.startswith(suffix_line) or suffix_line.startswith(line)
        return allow and not duplicated

    return limit, allow_closing


def continue_brackets(prefix: str, suffix: str, text: str, language: str) -> int:
    """Continue's ``stopOnUnmatchedClosingBracket`` over the whole text as one chunk."""
    current_line = prefix.split("\n")[-1] + suffix.split("\n")[0]
    multiline = not current_line.strip()
    stack: list[str] = []
    if not multiline:  # brackets opened on the cursor's line may be closed by the completion
        for char in current_line:
            if char in _BRACKETS:
                stack.append(char)
            elif char in _REVERSE and (not stack or _BRACKETS[stack.pop()] != char):
                break
    for char in suffix:
        if char == " ":
            continue
        if char not in _REVERSE:
            break
        stack.insert(0, _REVERSE[char])
    start = re.search(r"[^\s)}\]]", text)  # closing brackets before any other text are let through
    if start is None:
        return len(text)
    for i in range(start.start(), len(text)):
        char = text[i]
        if char in _REVERSE:
            if not stack or _BRACKETS[stack.pop()] != char:
                return i
        elif char in _BRACKETS:
            stack.append(char)
    return len(text)


BASELINES = {"today": today, "tabby": tabby, "continue": continue_brackets}
