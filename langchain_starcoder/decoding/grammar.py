"""A constraint's verdict on the decoded text: a :class:`~.filter.Filter`. The backend masks each
step with the compiled grammar (the job's ``grammar``); this checks the whole text once at the end,
whichever backend wrote it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..backends.grammar import Grammar


class GrammarCheck:
    """Lets all text through; at the end, "stop" only for a full match of ``grammar``, else "length"
    (the text is an incomplete prefix), see :attr:`~langchain_starcoder.types.Completion.constrained`."""

    __slots__ = ("_grammar", "_pieces")
    ended: str | None = None  # never ends the text: the backend's masks say where it may end

    def __init__(self, grammar: Grammar):
        self._grammar = grammar
        self._pieces: list[str] = []  # the text shown, joined once at the end

    def feed(self, text: str) -> str:
        self._pieces.append(text)
        return text

    def finish(self, *, cut: bool) -> str:
        return ""

    def settle(self, reason: str, last: dict[str, Any]) -> str:
        last["constrained"] = True
        return "stop" if self._grammar.accepts("".join(self._pieces)) else "length"
