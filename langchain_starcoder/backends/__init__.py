"""Backends: what turns prompt token ids into generated token ids.

The front (:class:`~langchain_starcoder.engine.StarCoderEngine`) owns everything that is about text:
the tokenizer, prompt building (raw, FIM, chat), budgets, stop strings, streaming detokenization and
counting. A backend owns only execution, and sees token ids and :class:`GenerationParams` alone. So
a second model family, another weight format, or a remote server given token ids slots in here
without a change to the front or to any wrapper.

The contract, in prose:

- The front hands a backend one or more :class:`Generation`\\ s through :meth:`Backend.submit`: the
  prompt's ids, the settings (``params.stop_token_ids`` already holds every id that ends the
  generation, end-of-text included), a :class:`TokenSink` and a cancel flag. Several generations in
  one call run as a batch; each still ends on its own.
- For each generation the backend calls, on a thread of its own choosing, ``sink.start(cached)``
  once the prompt is accepted (``cached``: the leading prompt tokens it did not have to prefill;
  the sink times the prefill from there to the first token). A backend that learns of the prompt
  only with its first token (a remote stream) passes ``prompt_seconds``: the server's own figure,
  or None where it is unknown. Then ``sink.token(id)`` for every generated id, including the stop
  id that ends it. When ``token`` returns True the front has seen enough (a stop string, a stop
  id): the backend stops that generation at once. It stops by itself at ``params.max_tokens``.
  A backend that decodes speculatively passes its draft counts to ``sink.speculated`` before
  ``finish``; the ids it sends are those it would send without speculation.
  Then ``sink.finish()`` (a backend that learns the prompt-cache hit only at the end, as vLLM
  reports it, passes it there).
- A constraint (``params.json_schema``, ``regex`` or ``grammar``) comes compiled for the front's
  tokenizer as ``Generation.grammar``: an in-process backend masks each step with a copy of its
  matcher (:mod:`.masking`); a remote backend passes the setting on to its server. Either way the
  front checks the finished text against it, so an output the grammar does not accept in full is
  never reported with finish_reason "stop" (it gets "length").
- ``Generation.cancelled`` is set when the caller leaves (a closed stream, a cancelled task). The
  backend checks it before a queued generation starts, between prefill chunks and between tokens,
  and then stops without calling ``finish``; it never blocks the next request for long.
- :meth:`Backend.submit` returns a future that completes when every generation of the call has
  ended. An error sets the future's exception; the front passes it on to its caller. The backend
  stays usable for the next call.
- Sinks do their work (detokenizing, matching stop strings) on the backend's thread, so a token
  costs no thread hop until there is text to show.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..types import GenerationParams

if TYPE_CHECKING:
    from .grammar import Grammar


class TokenSink(Protocol):
    """Where a backend sends one generation's progress (see the module docs)."""

    def start(self, cached_tokens: int, prompt_seconds: float | None = ...) -> None:
        """The prompt is accepted; without ``prompt_seconds`` the sink times it to the first token."""
        ...

    def token(self, token_id: int) -> bool:
        """Take one generated id; True ends the generation."""
        ...

    def speculated(self, accepted: int, drafted: int) -> None:
        """Speculative decoding's counts, before ``finish``: of ``drafted`` tokens, ``accepted``
        were kept (a backend that does not speculate never calls it)."""
        ...

    def finish(self, cached_tokens: int | None = None) -> None:
        """The generation ended; ``cached_tokens``, when given, replaces what ``start`` said."""
        ...


@dataclass(eq=False)  # compared and hashed by identity: a backend keeps sets of them
class Generation:
    """One generation as a backend sees it."""

    prompt: list[int]
    params: GenerationParams
    sink: TokenSink
    cancelled: threading.Event = field(default_factory=threading.Event)
    grammar: Grammar | None = None
    """``params``' constraint compiled for the front's tokenizer (None without one)."""


class Backend(Protocol):
    """Executes generations in token ids (see the module docs for the contract)."""

    name: str
    """The checkpoint or served model, for messages."""
    context_window: int
    """The most tokens a prompt plus its generation may have."""
    vocab_size: int
    """The model's vocabulary size: token ids run from 0 to ``vocab_size - 1``."""

    def submit(self, generations: Sequence[Generation]) -> Future[None]:
        """Run ``generations`` (together, if several); the future ends when all of them have."""
        ...

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """float32 logits ``[len(token_ids), vocab]`` of one full forward pass, no cache."""
        ...

    def clear_cache(self) -> None:
        """Forget every reused prompt cache and free what it held."""
        ...

    @property
    def prompt_cache_bytes(self) -> int: ...

    def close(self) -> None:
        """Free everything; the backend cannot be used after."""
        ...
