"""The numbers a server sends, checked before they are used: a wrong one names itself."""

from __future__ import annotations

import math
from typing import Any

from .errors import ServerError


class Validator:
    """Checks one server's numbers; each error names the server, the field and what was expected."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def number(
        self, value: Any, what: str, high: float | None = None, *, low: float = 0, real: bool = False
    ) -> Any:
        """A number the server sent, checked: an integer (``real``: any number, with a ``high``),
        never a bool, from ``low`` to ``high``; anything else is a ServerError that names it."""
        kinds = (int, float) if real else (int,)
        top = math.inf if high is None else high
        if isinstance(value, kinds) and not isinstance(value, bool) and low <= value <= top:
            return value
        bounds = f"from {low} to {high}" if high is not None else f">= {low}"
        msg = (
            f"{self.base_url} sent an impossible {what}: {repr(value)[:100]} (expected "
            f"{'a number' if real else 'an integer'} {bounds}); is it the server and model connected to?"
        )
        raise ServerError(msg)

    def token_ids(self, ids: Any, vocab_size: int, event: dict[str, Any], needs: str) -> list[int]:
        """A chunk's token ids, each checked to be in the vocabulary."""
        if not isinstance(ids, list):
            msg = f"{self.base_url} did not stream token ids (none in {str(event)[:200]}); {needs}."
            raise ServerError(msg)
        top = vocab_size - 1
        return [self.number(token, "token id", top) for token in ids]
